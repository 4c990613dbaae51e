"""The thread settings bench cells run with, chosen by measurement on this machine.

OpenMP's wait policy decides what a torch thread does at the end of a parallel region:
spin (the default, ``ACTIVE``-like) or sleep (``PASSIVE``). On a quiet machine spinning
wins -- a decode step is hundreds of small operators, and waking a sleeping thread costs
more than the operator (PASSIVE cost the engine 1.66-1.80x on a quiet Zen 4,
docs/results.md) -- while on a machine where another job holds a core, spinning threads
steal it and PASSIVE ran a long-context cell 5-10x faster. Which holds depends on the
machine and on its load *now*, so a bench run measures it at its start: a decode-shaped
proxy (per layer: a few small matrix products and a dozen elementwise operators, at
SmolLM2-135M's widths) in a fresh process per policy, the policies alternating, and the
faster median wins. The choice is the same for every cell of the run and recorded with
it; an ``OMP_WAIT_POLICY`` the user set is kept and not measured.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass

POLICIES = ("default", "PASSIVE")

_PROXY = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
ws = [torch.randn(1536, 576) for _ in range(4)] + [torch.randn(576, 1536)]
x = torch.randn(int(sys.argv[2]), 576)
def step():
    h = x
    for _ in range(30):
        a = torch.nn.functional.rms_norm(h, (576,))
        u = torch.nn.functional.linear(a, ws[0]) * torch.sigmoid(torch.nn.functional.linear(a, ws[1]))
        h = h + torch.nn.functional.linear(u, ws[4])
        for _ in range(6):
            a = a * 1.0001 + 0.5
step()
best = []
for _ in range(3):
    t0 = time.perf_counter()
    for _ in range(2):
        step()
    best.append((time.perf_counter() - t0) / 2)
print(min(best))
"""


@dataclass(frozen=True)
class ThreadSettings:
    """What cells run with: ``num_threads`` torch threads and OpenMP's ``wait_policy``
    (``default`` leaves ``OMP_WAIT_POLICY`` unset). ``step_s``: the proxy's seconds per
    step under each policy (empty when the user's setting was kept); ``source``:
    ``measured`` or ``user``."""

    num_threads: int
    wait_policy: str
    step_s: dict
    source: str
    load_avg_1m: float | None = None

    def env(self) -> dict[str, str]:
        """The environment variables a cell process gets (none for ``default``)."""
        return {} if self.wait_policy == "default" else {"OMP_WAIT_POLICY": self.wait_policy}

    def to_dict(self) -> dict:
        return asdict(self)


def policy_env(policy: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (else this process's environment) for a child that runs under ``policy``:
    ``OMP_WAIT_POLICY`` set to it, or removed for ``default``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    return env


def _proxy_s(policy: str, num_threads: int, rows: int) -> float:
    env = policy_env(policy)
    out = subprocess.run([sys.executable, "-c", _PROXY, str(num_threads), str(rows)],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip().splitlines()[-1])


_RECENT: dict[int, tuple[float, ThreadSettings]] = {}
REUSE_S = 600.0        # a process that runs many scenarios (kvmap tune) measures once


def choose(num_threads: int | None = None, rounds: int = 1, rows: int = 4,
           given: str | None = None) -> ThreadSettings:
    """Measure both wait policies (``rounds`` processes each, alternating) and return the
    faster. Not measured: an ``OMP_WAIT_POLICY`` the user set (``source="user"``), a
    policy ``given`` by the caller (``default`` or ``PASSIVE``; ``source="given"``), or a
    measurement of this process under ``REUSE_S`` seconds old."""
    import time

    import torch
    num_threads = num_threads or torch.get_num_threads()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    user = os.environ.get("OMP_WAIT_POLICY")
    if user:
        return ThreadSettings(num_threads, user, {}, "user", load)
    if given is not None:
        if given not in POLICIES:
            raise ValueError(f"wait policy {given!r} is not one of {', '.join(POLICIES)}")
        return ThreadSettings(num_threads, given, {}, "given", load)
    recent = _RECENT.get(num_threads)
    if recent is not None and time.monotonic() - recent[0] < REUSE_S:
        return recent[1]
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    for _ in range(rounds):
        for policy in POLICIES:
            times[policy].append(_proxy_s(policy, num_threads, rows))
    step_s = {p: statistics.median(ts) for p, ts in times.items()}
    settings = ThreadSettings(num_threads, min(step_s, key=step_s.get), step_s, "measured",
                              load)
    _RECENT[num_threads] = (time.monotonic(), settings)
    return settings


def step_time_s(policy: str, num_threads: int | None = None, rounds: int = 3,
                rows: int = 4) -> float:
    """The decode-step proxy's seconds under ``policy`` now (the median of ``rounds``
    fresh processes): how fast this machine runs a cell's step at this moment, load
    included (the bench estimate scales by it)."""
    import torch
    if policy not in POLICIES and policy.upper() not in ("ACTIVE", "PASSIVE"):
        raise ValueError(f"wait policy {policy!r} is not one of {', '.join(POLICIES)}")
    num_threads = num_threads or torch.get_num_threads()
    return statistics.median(_proxy_s(policy, num_threads, rows) for _ in range(rounds))
