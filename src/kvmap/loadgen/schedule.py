"""When each request is sent: load levels, and the plan of one run.

A load run is one of

- an **open loop** at a mean rate: gaps Gamma(shape=B, scale=1/(R*B)) as
  ``vllm bench serve --request-rate R --burstiness B`` draws them (B=1: Poisson), from
  ``kvmap.workloads.arrivals``; or the workload's own times (a trace, a preset's
  arrival process) when no rate is given;
- a **closed loop** keeping N requests in flight;
- a **step load**: open-loop phases back to back, e.g. ``1@20s,6@20s,1@20s`` -- 20 s
  at 1 request/s, 20 s at 6/s, 20 s at 1/s -- sent as one continuous run, so the
  backlog of a high phase spills into the next one as it would in production.

``--rate 1,2,4`` (or ``--concurrency 1,4,16``) gives several levels; each is its own run,
one after the other, and its own cell in the run store. A step load is one run whose
phases become cells.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from kvmap.workloads.arrivals import Gamma, OpenLoop, Poisson
from kvmap.workloads.spec import WorkloadRequest

_STEP = re.compile(r"([0-9]*\.?[0-9]+)@([0-9]*\.?[0-9]+)(ms|s|m)?")


@dataclass(frozen=True)
class Phase:
    """``duration_s`` seconds of open-loop arrivals at ``rate_per_s``."""

    rate_per_s: float
    duration_s: float

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0 or math.isinf(self.rate_per_s):
            raise ValueError(f"step rate {self.rate_per_s!r} must be a finite number > 0")
        if not self.duration_s > 0 or math.isinf(self.duration_s):
            raise ValueError(f"step duration {self.duration_s!r} s must be finite and > 0")

    @property
    def num_requests(self) -> int:
        return max(1, round(self.rate_per_s * self.duration_s))


@dataclass(frozen=True)
class Level:
    """One load level: exactly one of ``rate_per_s``, ``concurrency``, ``phases``, or none
    of them (the workload's own arrival times)."""

    rate_per_s: float | None = None
    concurrency: int | None = None
    burstiness: float = 1.0
    phases: tuple[Phase, ...] = ()

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.rate_per_s, self.concurrency)) \
            + bool(self.phases)
        if given > 1:
            raise ValueError("give only one of a rate, a concurrency or steps")
        if self.rate_per_s is not None and not self.rate_per_s > 0:
            raise ValueError(f"rate {self.rate_per_s!r} must be > 0 requests/s (inf allowed)")
        if self.concurrency is not None and (not isinstance(self.concurrency, int)
                                             or self.concurrency < 1):
            raise ValueError(f"concurrency {self.concurrency!r} must be an integer >= 1")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness {self.burstiness!r} must be > 0")

    @property
    def name(self) -> str:
        if self.rate_per_s is not None:
            tail = f",burstiness={self.burstiness:g}" if self.burstiness != 1 else ""
            return f"rate={self.rate_per_s:g}{tail}"
        if self.concurrency is not None:
            return f"concurrency={self.concurrency}"
        if self.phases:
            return "steps=" + ",".join(f"{p.rate_per_s:g}@{p.duration_s:g}s"
                                       for p in self.phases)
        return "workload-arrivals"

    def arrival(self) -> OpenLoop | None:
        if self.rate_per_s is None:
            return None
        if self.burstiness == 1:
            return Poisson(self.rate_per_s)
        return Gamma(self.rate_per_s, burstiness=self.burstiness)

    def num_requests_for(self, duration_s: float | None) -> int | None:
        """Requests an open loop needs to fill ``duration_s`` (None: not determined)."""
        if self.phases:
            return sum(p.num_requests for p in self.phases)
        if duration_s is not None and self.rate_per_s is not None \
                and not math.isinf(self.rate_per_s):
            return max(1, math.ceil(self.rate_per_s * duration_s))
        return None


@dataclass(frozen=True)
class Plan:
    """One run: requests in send order with their offsets (``None``: closed loop, send
    when a slot frees) and the phase each belongs to."""

    requests: tuple[WorkloadRequest, ...]
    offsets_s: tuple[float, ...] | None
    concurrency: int | None
    phases: tuple[int, ...]

    def __post_init__(self) -> None:
        if (self.offsets_s is None) == (self.concurrency is None):
            raise ValueError("a plan has offsets (open loop) or a concurrency (closed loop)")
        if self.offsets_s is not None and len(self.offsets_s) != len(self.requests):
            raise ValueError(f"{len(self.offsets_s)} offsets for {len(self.requests)} requests")
        if len(self.phases) != len(self.requests):
            raise ValueError(f"{len(self.phases)} phase labels for {len(self.requests)} requests")


def parse_levels(text: str, kind: str) -> list[float] | list[int]:
    """``"1,2,4"`` -> rates (``kind="rate"``, ``inf`` allowed) or concurrencies."""
    items = [t for t in re.split(r"[,\s]+", str(text).strip()) if t]
    if not items:
        raise ValueError(f"--{kind} {text!r} is empty")
    values: list = []
    for item in items:
        try:
            values.append(float(item) if kind == "rate" else int(item))
        except ValueError:
            raise ValueError(f"--{kind} item {item!r} is not a "
                             f"{'number' if kind == 'rate' else 'whole number'}") from None
    return values


def parse_steps(text: str) -> tuple[Phase, ...]:
    """``"1@20s,6@20s,1@20s"`` (rate@duration; s, ms or m; bare numbers are seconds)."""
    phases = []
    for item in (t for t in re.split(r"[,\s]+", str(text).strip()) if t):
        m = _STEP.fullmatch(item.lower())
        if not m:
            raise ValueError(f"--steps item {item!r} is not RATE@DURATION (e.g. 6@20s)")
        scale = {"ms": 1e-3, "m": 60.0}.get(m.group(3), 1.0)
        phases.append(Phase(float(m.group(1)), float(m.group(2)) * scale))
    if len(phases) < 1:
        raise ValueError(f"--steps {text!r} has no steps")
    return tuple(phases)


def make_plan(requests: list[WorkloadRequest], level: Level, seed: int = 0) -> Plan:
    """The plan of ``requests`` under ``level`` (see the module docstring)."""
    requests = tuple(requests)
    if not requests:
        raise ValueError("a load run needs at least one request")
    zeros = (0,) * len(requests)
    if level.concurrency is not None:
        return Plan(requests, None, level.concurrency, zeros)
    rng = np.random.default_rng(seed)
    if level.phases:
        offsets, phases, start_s, i = [], [], 0.0, 0
        for index, phase in enumerate(level.phases):
            n = min(phase.num_requests, len(requests) - i)
            if n <= 0:
                break
            times = Poisson(phase.rate_per_s).arrival_times_s(rng, n)
            times = times * (phase.duration_s / times[-1]) if n and times[-1] > 0 else times
            offsets += [start_s + float(t) for t in times]
            phases += [index] * n
            start_s += phase.duration_s
            i += n
        return Plan(requests[:i], tuple(offsets), None, tuple(phases))
    arrival = level.arrival()
    if arrival is not None:
        return Plan(requests, tuple(float(t) for t in arrival.arrival_times_s(rng, len(requests))),
                    None, zeros)
    if all(r.arrival_s is None for r in requests):
        raise ValueError("the workload is a closed loop; give --concurrency N or --rate R")
    return Plan(requests, tuple(float(r.arrival_s or 0.0) for r in requests), None, zeros)
