"""What a load level's requests say about an SLA: exact percentile tests, pooled across
levels by monotonicity, and the boundary fitted over all of them. Pure functions.

An SLA key bounds a percentile: ``ttft_p90_s <= 10`` holds when the 0.90-quantile of the
TTFT distribution is within 10 s, i.e. when the share of TTFTs within 10 s is at least
0.90. A key without a percentile (``ttft_s``, a per-request threshold) is tested at the
search's ``attainment``. Each key has its own sample: TTFT, E2E and TPOT one value a
request, TBT one value a token gap (thousands a level).

The test is the order-statistic one (exact, distribution-free): with ``n`` values sorted,
the ``q``-quantile lies at or below the ``u``-th smallest with confidence ``1 - alpha/2``
where ``u`` is the smallest index with ``P(Binomial(n, q) <= u - 1) >= 1 - alpha/2``;
at or above the ``l``-th with ``l`` the largest with ``P(Binomial(n, q) <= l - 1) <=
alpha/2``. So with ``k`` values within the limit::

    pass   k >= u   (the interval of the percentile lies within the limit)
    fail   k <  l   (it lies beyond)
    undecided otherwise -- more values would decide

A pass needs at least ``ln(alpha/2) / ln(q)`` values even when every one is within the
limit: 368 for a P99 (``needed_for_pass``), 72 for a P95, 36 for a P90, at 95%.

Pooling. Attainment falls as the offered rate rises (a queue only grows with the rate),
so the successes of levels *above* a rate are stochastically fewer than they would be at
it: pooling a level with higher levels is a conservative test of its pass; pooling it with
lower ones a conservative test of its fail (``pooled``). The boundary is fitted over all
levels at once by an isotonic (pool-adjacent-violators) fit of attainment against rate
(``fit_boundary``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05


def _cdf_before(n: int, q: float) -> list[float]:
    """``[P(Binomial(n, q) <= k - 1) for k in 0..n+1]`` (log-space terms: n up to ~1e5)."""
    out, total = [0.0], 0.0
    if q <= 0 or q >= 1:
        for k in range(n + 1):
            total = 1.0 if (q <= 0 or k == n) else 0.0
            out.append(total)
        return out
    lq, lr, lgn = math.log(q), math.log1p(-q), math.lgamma(n + 1)
    for i in range(n + 1):
        total += math.exp(lgn - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lq
                          + (n - i) * lr)
        out.append(min(1.0, total))
    return out


def order_indices(n: int, q: float, alpha: float = ALPHA) -> tuple[int | None, int | None]:
    """``(l, u)``, 1-based ranks of the order statistics bounding the ``q``-quantile of
    ``n`` values at confidence ``1 - alpha`` (None: no such rank within ``1..n``)."""
    if n <= 0:
        return None, None
    before = _cdf_before(n, q)               # before[k] = P(B <= k - 1)
    lo = max((k for k in range(1, n + 1) if before[k] <= alpha / 2), default=None)
    hi = next((k for k in range(1, n + 1) if before[k] >= 1 - alpha / 2), None)
    return lo, hi


def quantile_interval(values: list[float], q: float, alpha: float = ALPHA
                      ) -> tuple[float | None, float | None, float | None]:
    """``(estimate, low, high)`` of the ``q``-quantile of ``values`` (order statistics;
    None where the sample is too small to bound that side)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return None, None, None
    est = xs[min(n - 1, max(0, math.ceil(q * n) - 1))]
    lo, hi = order_indices(n, q, alpha)
    return est, (xs[lo - 1] if lo else None), (xs[hi - 1] if hi else None)


def needed_for_pass(q: float, alpha: float = ALPHA) -> int:
    """Values a pass needs at the least, every one within the limit."""
    if q >= 1:
        return 1
    return math.ceil(math.log(alpha / 2) / math.log(q))


def decide(within: int, n: int, q: float, alpha: float = ALPHA) -> str:
    """``pass`` | ``fail`` | ``undecided`` for ``within`` of ``n`` values within the limit,
    the limit bounding the ``q``-quantile (module docstring)."""
    if n <= 0:
        return "undecided"
    lo, hi = order_indices(n, q, alpha)
    if hi is not None and within >= hi:
        return "pass"
    if lo is not None and within < lo:
        return "fail"
    return "undecided"


@dataclass(frozen=True)
class KeyEvidence:
    """One SLA key's sample at one level."""

    key: str
    quantile: float              # the share of values the limit must hold
    within: int
    n: int
    unit: str                    # "requests" | "token gaps"

    @property
    def share(self) -> float | None:
        return self.within / self.n if self.n else None

    def to_dict(self) -> dict:
        return {"quantile": self.quantile, "within": self.within, "n": self.n,
                "unit": self.unit, "share": self.share,
                # the names the report and older readers use
                "attained": self.within, "verdict": decide(self.within, self.n,
                                                           self.quantile)}

    @classmethod
    def of(cls, key: str, d: dict, default_q: float) -> KeyEvidence:
        n = int(d.get("n") or 0)
        within = d.get("within")
        if within is None:           # a version-1 record: share x requests
            within = round((d.get("share") or 0.0) * n)
        return cls(key, float(d.get("quantile") or default_q), int(within), n,
                   str(d.get("unit") or "requests"))


def level_verdict(evidence: list[KeyEvidence], alpha: float = ALPHA) -> str:
    """A level's verdict over its keys: ``fail`` if any key fails, ``pass`` if all pass."""
    if not evidence:
        return "undecided"
    verdicts = [decide(e.within, e.n, e.quantile, alpha) for e in evidence]
    if "fail" in verdicts:
        return "fail"
    return "pass" if all(v == "pass" for v in verdicts) else "undecided"


def pooled(levels: list[tuple[float, list[KeyEvidence]]], rate: float,
           alpha: float = ALPHA) -> str:
    """The verdict at ``rate`` from every level's evidence, by monotonicity (module
    docstring): its pass tested on the levels at ``rate`` pooled with the higher ones whose
    own share meets the quantile; its fail on the levels at ``rate`` with the lower ones
    whose own share misses it."""
    keys = sorted({e.key for _, ev in levels for e in ev})
    verdicts = []
    for key in keys:
        mine = [(r, e) for r, ev in levels for e in ev if e.key == key]
        if not mine:
            continue
        q = mine[0][1].quantile
        at = [e for r, e in mine if math.isclose(r, rate, rel_tol=1e-6)]
        up = at + [e for r, e in mine if r > rate * (1 + 1e-6)
                   and e.share is not None and e.share >= q]
        down = at + [e for r, e in mine if r < rate * (1 - 1e-6)
                     and e.share is not None and e.share < q]
        if decide(sum(e.within for e in up), sum(e.n for e in up), q, alpha) == "pass":
            verdicts.append("pass")
        elif decide(sum(e.within for e in down), sum(e.n for e in down), q,
                    alpha) == "fail":
            verdicts.append("fail")
        else:
            verdicts.append("undecided")
    if not verdicts:
        return "undecided"
    if "fail" in verdicts:
        return "fail"
    return "pass" if all(v == "pass" for v in verdicts) else "undecided"


def isotonic_decreasing(points: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """Pool-adjacent-violators: ``[(x, y, weight)]`` sorted by x -> ``[(x, fitted y)]``
    with the fit non-increasing in x (weighted least squares)."""
    blocks: list[list[float]] = []            # [sum w*y, sum w, count]
    for _, y, w in points:
        blocks.append([w * y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            b = blocks.pop()
            blocks[-1] = [blocks[-1][0] + b[0], blocks[-1][1] + b[1], blocks[-1][2] + b[2]]
    out, i = [], 0
    for s, w, count in blocks:
        for _ in range(int(count)):
            out.append((points[i][0], s / w))
            i += 1
    return out


def fit_boundary(levels: list[tuple[float, list[KeyEvidence]]]) -> float | None:
    """The rate where the fitted attainment of the binding key crosses its quantile:
    per key an isotonic fit of its share against rate (weighted by its sample), the
    crossing interpolated in log rate; the lowest crossing over the keys. None when no
    key's fit crosses within the measured rates."""
    keys = sorted({e.key for _, ev in levels for e in ev})
    crossings = []
    for key in keys:
        pts: dict[float, list[int]] = {}
        q = None
        for rate, ev in levels:
            for e in ev:
                if e.key == key and e.n:
                    pts.setdefault(rate, [0, 0])
                    pts[rate][0] += e.within
                    pts[rate][1] += e.n
                    q = e.quantile
        if q is None or len(pts) < 2:
            continue
        rates = sorted(pts)
        fit = isotonic_decreasing([(r, pts[r][0] / pts[r][1], pts[r][1]) for r in rates])
        for (r0, y0), (r1, y1) in zip(fit, fit[1:]):
            if y0 >= q > y1:
                t = (y0 - q) / (y0 - y1)
                crossings.append(math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0))))
                break
    return min(crossings) if crossings else None


def key_quantile(key: str, default_q: float) -> float:
    """The share an SLA key's limit must hold: ``ttft_p90_s`` -> 0.90; a key without a
    percentile (a per-request threshold, a mean, a max) -> ``default_q``."""
    from kvmap.metrics import split_slo_key
    _, stat = split_slo_key(key)
    if stat and stat.startswith("p"):
        return float(stat[1:]) / 100
    return default_q


def slo_attainment(rows: list[dict], slo: dict | None, default_q: float = 0.99
                   ) -> dict | None:
    """Per SLA key the evidence of a workload cell's rows (``KeyEvidence.to_dict``): TTFT,
    TPOT, E2E and queue one value a request, TBT every token gap (a failed request: one
    value beyond any limit); ``"min"``: the key with the smallest share. None without an
    SLA or without any value."""
    from kvmap.metrics import request_stats, split_slo_key
    if not slo:
        return None
    stats = [request_stats(r) for r in rows]
    out = {}
    for key, limit in slo.items():
        metric, _ = split_slo_key(key)
        metric = metric.removesuffix("_s")
        if metric in ("tbt", "itl"):
            values = [x for s in stats for x in (s.itl_s if not s.failed else (math.inf,))]
            unit = "token gaps"
        elif metric in ("ttft", "tpot", "e2e", "queue"):
            values = [getattr(s, f"{metric}_s") for s in stats]
            values = [x if x is not None and not s.failed else math.inf
                      for x, s in zip(values, stats)]
            unit = "requests"
        else:
            continue
        if not values:
            continue
        ev = KeyEvidence(key, key_quantile(key, default_q), sum(x <= limit for x in values),
                         len(values), unit)
        est, lo, hi = quantile_interval(values, ev.quantile)
        out[key] = {**ev.to_dict(), "num_requests": len(stats),
                    "percentile_s": _finite(est), "percentile_interval_s": [_finite(lo),
                                                                             _finite(hi)]}
    if not out:
        return None
    worst = min(out, key=lambda k: out[k]["share"])
    return {"keys": out, "min": {"key": worst, **out[worst]}}


def _finite(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) else x


def evidence_of(attained: dict | None, default_q: float) -> tuple[KeyEvidence, ...]:
    """The keys of a stored ``slo_attainment`` (version 1 records: share x requests)."""
    if not attained:
        return ()
    return tuple(KeyEvidence.of(k, d, default_q) for k, d in (attained.get("keys") or {}).items())
