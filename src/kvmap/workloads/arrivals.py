"""Request arrival processes.

``arrival_times_s(rng, n)`` returns ``n`` non-decreasing arrival offsets in seconds from the
start of the run (``np.ndarray`` of float64), or ``None`` for a closed loop, where the
bench keeps ``concurrency`` requests in flight and sends the next one when one finishes.

Open-loop processes follow ``vllm bench serve --request-rate R --burstiness B``: gaps
between requests are Gamma(shape=B, scale=1/(R*B)) -- mean 1/R, coefficient of variation
1/sqrt(B); B=1 is a Poisson process, B<1 burstier, B>1 more regular. Like vLLM, the
cumulative times are then rescaled so the last request arrives at exactly ``n / R``,
which removes the 1-2 % run-to-run spread of the achieved rate (``rescale=False`` keeps
the raw draws). Also like vLLM, the first request arrives after one gap, not at 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ArrivalProcess:
    """Base class: when each of ``n`` requests arrives."""

    @property
    def closed_loop(self) -> bool:
        return False

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray | None:
        raise NotImplementedError


@dataclass(frozen=True)
class ClosedLoop(ArrivalProcess):
    """Keep ``concurrency`` requests in flight; no arrival times (marker process)."""

    concurrency: int

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or isinstance(self.concurrency, bool) \
                or self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency!r} must be an integer >= 1")

    @property
    def closed_loop(self) -> bool:
        return True

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> None:
        return None


@dataclass(frozen=True)
class OpenLoop(ArrivalProcess):
    """Base for processes at a mean ``rate_per_s``; subclasses override ``_gaps_s``.

    ``rate_per_s = inf`` sends everything at t=0 (vLLM's default ``--request-rate inf``).
    """

    rate_per_s: float
    rescale: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.rate_per_s, (int, float)) or not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s={self.rate_per_s!r} must be > 0 (inf allowed)")

    def arrival_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n={n!r} must be an integer >= 0")
        if n == 0 or math.isinf(self.rate_per_s):
            return np.zeros(int(n))
        times_s = np.cumsum(self._gaps_s(rng, int(n)))
        if self.rescale and times_s[-1] > 0:
            times_s *= (n / self.rate_per_s) / times_s[-1]
        return times_s

    def _gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class Poisson(OpenLoop):
    """Exponential gaps with mean ``1 / rate_per_s``."""

    def _gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate_per_s, size=n)


@dataclass(frozen=True)
class Gamma(OpenLoop):
    """Gamma gaps, ``shape = burstiness``, ``scale = 1 / (rate_per_s * burstiness)``."""

    burstiness: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.burstiness, (int, float)) or not self.burstiness > 0:
            raise ValueError(f"burstiness={self.burstiness!r} must be > 0")

    def _gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if math.isinf(self.burstiness):        # the limit: perfectly regular gaps
            return np.full(n, 1.0 / self.rate_per_s)
        scale_s = 1.0 / (self.rate_per_s * self.burstiness)
        return rng.gamma(shape=self.burstiness, scale=scale_s, size=n)


def parse_arrival(text: str) -> ArrivalProcess:
    """``"closed:8"``, ``"poisson:2.5"`` or ``"gamma:2.5:0.5"`` (rate/s, burstiness)."""
    kind, *args = str(text).strip().lower().split(":")
    try:
        if kind == "closed" and len(args) == 1:
            return ClosedLoop(int(args[0]))
        if kind == "poisson" and len(args) == 1:
            return Poisson(float(args[0]))
        if kind == "gamma" and len(args) == 2:
            return Gamma(float(args[0]), burstiness=float(args[1]))
    except ValueError as e:
        raise ValueError(f"arrival process {text!r}: {e}") from None
    raise ValueError(f"arrival process {text!r} is not one of: closed:N, poisson:RATE, "
                     "gamma:RATE:BURSTINESS")
