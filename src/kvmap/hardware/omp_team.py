"""One OpenMP team per process: where a process runs its engine in a thread of its own.

torch's CPU build parallelises an operator with GNU OpenMP (libgomp). libgomp keeps a
pool of worker threads for *each* thread that ever ran a parallel region with more than
one thread, and counts the workers of every pool together. Once that count exceeds the
CPUs, every team stops spinning at its barriers (libgomp's "throttled" spin count) and
sleeps instead -- ``OMP_WAIT_POLICY=PASSIVE`` for the whole process, whatever the
policy says -- and a decode step, hundreds of small operators, pays a futex wake-up for
each of them.

``kvmap serve`` runs its engine in the ``kvmap-engine`` thread. It used to load the model
in the main thread first (a team of N there, kept for the process's life), so the engine
thread's team made the count 2N-1 on N CPUs. Measured on the x86-amx class, bf16, batch-1
decode of SmolLM2 (``benchmarks/engine_thread_ab.py``, record
``engine_thread_ab-20261205-091706.json``): 37.5 ms a token in the main thread, 60.3 ms in
a second thread after the main thread had loaded the model, 37.3 ms when the model was
loaded in a thread that then exited -- a pool dies with its thread.

So the server builds its engines in a thread that exits (``in_own_thread``), and the
engine thread is the only one whose operators fan out. A helper thread that lives beside
the engine (the tiers' readers and loaders) runs its operators on itself alone
(``serial_executor``): its copies of a long context's pages would otherwise make it a
pool of its own for the engine's life.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def in_own_thread(fn: Callable[..., T], *args, name: str = "kvmap-build", **kwargs) -> T:
    """``fn(*args, **kwargs)`` in a fresh thread that exits when it returns; its result,
    or the exception it raised (re-raised here). Any OpenMP pool the call made goes with
    the thread, so the caller's thread never owns one."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:          # noqa: BLE001 -- handed to the caller
            box["error"] = e

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def os_thread_count() -> int:
    """The threads this process has now, OpenMP's workers included (Linux's
    ``/proc/self/task``; ``threading`` sees none of OpenMP's)."""
    return len(os.listdir("/proc/self/task"))


def serial_executor(name: str) -> ThreadPoolExecutor:
    """One helper thread, named ``name`` and started on first use, whose operators run on
    itself alone: before it takes work its own OpenMP and MKL thread counts are set to 1
    (``torch.set_num_threads(1)`` there), and torch's default for threads made later --
    which that call also sets -- is put back from a thread that exits at once, so no
    running thread but the helper changes. A thread that starts its first operator in
    that instant would get 1."""
    return ThreadPoolExecutor(1, thread_name_prefix=name, initializer=_serial,
                              initargs=(torch.get_num_threads(),))


def _serial(default: int) -> None:
    torch.get_num_threads()     # torch's lazy per-thread setup first: run later, it would
    torch.set_num_threads(1)    # set the count back to the default
    in_own_thread(torch.set_num_threads, default)
