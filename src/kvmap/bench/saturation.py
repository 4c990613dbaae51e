"""Over-saturation: an open-loop level the engine cannot keep up with, stopped early.

Past its capacity an open loop gets worse without end: requests arrive faster than they
finish, so the requests in the system and their time to first token both grow for as
long as the level runs, and the rest of its schedule would only measure the queue (as
guidellm stops such a level). ``SaturationWatch`` is fed every finished request -- the
time, the requests then in the system, its TTFT -- and says ``stop`` once, over the
finished requests so far (at least ``min_finished``, and a quarter of the level), both
series rise significantly: a least-squares slope against time whose t statistic is above
``t_min``, and a last TTFT at least ``growth`` times the first quarter's median.

The cell then stops sending, aborts what is in flight, and stores itself as ``ok`` with
``metrics.stopped_early = {"reason": "over-saturated", ...}``: a measured level that
misses, not a failure.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


def rising(ts: list[float], ys: list[float], t_min: float) -> bool:
    """Whether ``ys`` rises with ``ts``: least-squares slope > 0 with t statistic >
    ``t_min`` (a series with no spread is rising only if it strictly grew)."""
    n = len(ts)
    if n < 3:
        return False
    mt, my = sum(ts) / n, sum(ys) / n
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx == 0:
        return False
    slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / sxx
    residual = sum((y - my - slope * (t - mt)) ** 2 for t, y in zip(ts, ys))
    if residual == 0:
        return slope > 0
    se = math.sqrt(residual / (n - 2) / sxx)
    return slope > 0 and slope / se > t_min


@dataclass
class SaturationWatch:
    num_requests: int
    min_finished: int = 8
    t_min: float = 3.0
    growth: float = 2.0
    times: list = field(default_factory=list)
    in_system: list = field(default_factory=list)
    ttfts: list = field(default_factory=list)
    stop: bool = False

    def finished(self, now_s: float, num_in_system: int, ttft_s: float | None) -> bool:
        """Record one finished request; True when the level should stop (once)."""
        if self.stop or ttft_s is None:
            return False
        self.times.append(now_s)
        self.in_system.append(float(num_in_system))
        self.ttfts.append(ttft_s)
        n = len(self.times)
        if n < max(self.min_finished, self.num_requests // 4):
            return False
        first = statistics.median(self.ttfts[:max(1, n // 4)])
        self.stop = (rising(self.times, self.in_system, self.t_min)
                     and rising(self.times, self.ttfts, self.t_min)
                     and self.ttfts[-1] >= self.growth * first)
        return self.stop

    def summary(self) -> dict:
        return {"reason": "over-saturated", "num_finished": len(self.times),
                "num_requests": self.num_requests,
                "in_system_first_last": [self.in_system[0], self.in_system[-1]],
                "ttft_first_last_s": [self.ttfts[0], self.ttfts[-1]]}
