"""Inter-token latencies of the last ``window_s`` seconds, for the adaptive controller's
P99 TBT signal, at a cost that does not grow with the token rate.

Latencies are counted in fixed log-spaced buckets (each ``BUCKET_RATIO`` wider than the
one below, from ``MIN_LATENCY_S``), one sparse histogram per time slice of
``window_s / NUM_SLICES``::

    slice  t0            t0+1          ...           t0+NUM_SLICES-1
           {bucket: n}   {bucket: n}   ...           {bucket: n}

``add`` is O(1); ``p99_ms`` merges the live slices' non-empty buckets -- at most
``NUM_SLICES x`` the buckets in use, whatever the number of samples -- and never sorts
the samples. The answer is the P99 to within one bucket (``BUCKET_RATIO``: 5%), over a
window whose start moves a slice at a time.
"""
from __future__ import annotations

import math
from collections import Counter, deque

NUM_SLICES = 10
BUCKET_RATIO = 1.05
MIN_LATENCY_S = 1e-6
_LOG_RATIO = math.log(BUCKET_RATIO)


def bucket_of(latency_s: float) -> int:
    return max(0, int(math.log(max(latency_s, MIN_LATENCY_S) / MIN_LATENCY_S) / _LOG_RATIO))


def bucket_value_s(bucket: int) -> float:
    """A bucket's representative latency: its geometric middle."""
    return MIN_LATENCY_S * BUCKET_RATIO ** (bucket + 0.5)


class LatencyWindow:
    """See the module docstring. ``num_samples``: latencies in the live slices."""

    def __init__(self, window_s: float, num_slices: int = NUM_SLICES):
        if not window_s > 0:
            raise ValueError(f"window_s={window_s!r} must be > 0")
        self.window_s = window_s
        self.slice_s = window_s / num_slices
        self.slices: deque[tuple[int, Counter]] = deque()   # (slice index, counts)

    def add(self, now_s: float, latency_s: float) -> None:
        index = int(now_s // self.slice_s)
        if not self.slices or self.slices[-1][0] < index:
            self.slices.append((index, Counter()))
        self.slices[-1][1][bucket_of(latency_s)] += 1

    @property
    def num_samples(self) -> int:
        return sum(sum(counts.values()) for _, counts in self.slices)

    def p99_ms(self, now_s: float) -> float:
        oldest = int((now_s - self.window_s) // self.slice_s) + 1
        while self.slices and self.slices[0][0] < oldest:
            self.slices.popleft()
        merged: Counter = Counter()
        for _, counts in self.slices:
            merged.update(counts)
        total = sum(merged.values())
        if not total:
            return 0.0
        rank = math.ceil(0.99 * total)          # the nearest-rank P99
        seen = 0
        for bucket in sorted(merged):
            seen += merged[bucket]
            if seen >= rank:
                return bucket_value_s(bucket) * 1000.0
        return 0.0
