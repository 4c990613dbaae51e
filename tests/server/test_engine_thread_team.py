"""The server's main thread keeps no OpenMP pool (``kvmap.hardware.omp_team``): a pool
there makes libgomp throttle the engine thread's spinning workers into sleeping ones, and
a served decode step ran 1.6x slower for it on the x86-amx class.

Each check runs in a fresh interpreter: the test process's own main thread has long
since run parallel operators. OpenMP's workers are OS threads that ``threading`` does
not see, hence ``/proc/self/task``; a pool's workers exit a moment after its thread, so
the count is polled."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc"),
    pytest.mark.skipif((os.cpu_count() or 1) < 2,
                       reason="one CPU: OpenMP makes no pool, there is nothing to keep"),
]

PRELUDE = r"""
import time, torch
torch.set_num_threads(2)
from kvmap.hardware.omp_team import in_own_thread, os_thread_count

def fan_out():                       # big enough for torch to run a parallel region
    return float(torch.randn(1 << 21).exp().sum())

def settled(limit):
    end = time.time() + 5.0
    while os_thread_count() > limit and time.time() < end:
        time.sleep(0.05)
    return os_thread_count()

base = os_thread_count()
"""


def _run(body: str) -> list[int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", PRELUDE + body], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(x) for x in out.stdout.split()]


def test_a_call_in_its_own_thread_leaves_no_pool_and_a_call_in_place_does():
    base, after_own, after_main = _run(
        "in_own_thread(fan_out)\n"
        "own = settled(base)\n"
        "fan_out()\n"
        "print(base, own, os_thread_count())\n")
    assert after_own == base
    assert after_main > base, "the control: a parallel region in the main thread keeps " \
                              "a pool (else this check could not fail)"


def test_an_error_in_its_own_thread_reaches_the_caller():
    (ok,) = _run(
        "def boom():\n"
        "    raise ValueError('bad value 7')\n"
        "try:\n"
        "    in_own_thread(boom)\n"
        "except ValueError as e:\n"
        "    print(int(str(e) == 'bad value 7'))\n")
    assert ok == 1


def test_build_server_loads_the_engines_outside_the_main_thread():
    """Whatever the load does in OpenMP (here one big operator beside the tiny model's
    load), the main thread is left without a pool."""
    base, after = _run(
        "import kvmap.server.engines as engines\n"
        "real = engines.make_engine_factory\n"
        "def loading(config):\n"
        "    fan_out()\n"
        "    return real(config)\n"
        "engines.make_engine_factory = loading\n"
        "from server.conftest import build_tiny\n"
        "app, loop = build_tiny()\n"
        "print(base, settled(base))\n")
    assert after == base


def test_a_serial_executor_makes_no_pool_and_leaves_torchs_count():
    """A tier's helper thread copies a long context's pages beside the engine: made by
    ``serial_executor`` its parallel operators stay on it, a plain executor's same work
    leaves a second pool (the control); later threads still get the whole team."""
    base, serial, plain, later = _run(
        "from kvmap.hardware.omp_team import serial_executor\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "fan_out()\n"                                   # the engine's own pool
        "base = os_thread_count()\n"
        "ex = serial_executor('t-serial'); ex.submit(fan_out).result()\n"
        "serial = os_thread_count() - 1\n"              # less the helper thread itself
        "plain_ex = ThreadPoolExecutor(1); plain_ex.submit(fan_out).result()\n"
        "plain = os_thread_count() - 2\n"
        "later = in_own_thread(torch.get_num_threads)\n"
        "print(base, serial, plain, later)\n")
    assert serial == base
    assert plain > base, "the control: a plain helper thread's parallel region keeps a pool"
    assert later == 2
