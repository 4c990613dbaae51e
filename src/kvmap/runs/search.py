"""Load levels found, not guessed: ``arrival: auto`` and the SLA capacity by bisection.
The rules only (pure: records in, the next probe out): the bench runs the probes
(``bench.search_backend``), the report reads the capacity back (``report.capacity``).

A workload with ``arrival: auto`` runs, per configuration, a sequence of probe cells, each
decided from the records of the ones before (``next_probe``), so a resumed run takes the
same path:

    1. serial     closed:1, a few requests: a request's own time W1 and rate X1
    2. saturated  closed:C, C = min(num_requests, max_num_seqs): the peak rate Xmax
    3. levels     open loop (Poisson) at ``levels`` rates, geometric from min(X1, Xmax/2)
                  to Xmax -- by Little's law the concurrency lambda x W1 then runs from
                  about one request to the knee -- in increasing order, up to the first
                  that misses the SLA
    4. bisection  at the geometric mean of the highest passing and lowest missing rate,
                  until they are within ``tolerance`` (relative) or ``max_probes`` ran;
                  a lowest level that misses halves the rate instead (the search goes on
                  below it)

A level *passes* when its SLA attainment -- per SLA key the share of its values within the
limit (TTFT: one a request; TBT: every gap, with the requests as the sample size), the
smallest over the keys -- is at least ``attainment`` (default 0.99, so "P99 within the
SLA"). Each probe carries the Wilson interval of that share: ``pass`` when the interval
is above the target, ``fail`` below, ``indeterminate`` when it straddles it (a 99% target
needs about 380 requests a level before an all-pass level is a ``pass``). The bisection
moves on the point estimate; the capacity -- the highest passing rate, bracketed by the
lowest missing one -- is ``indeterminate`` when either bracket's verdict is. A failed
cell is a missing level (stored failed; the search continues below it); a level stopped
early as over-saturated (``saturation``) misses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmap.metrics import split_slo_key

ROLES = ("serial", "saturated", "level", "bisect")
SERIAL_REQUESTS = 4
Z95 = 1.959964


@dataclass(frozen=True)
class SearchSettings:
    """``search:`` of a workload (validated: ValueError naming the bad value)."""

    attainment: float = 0.99
    tolerance: float = 0.25           # relative gap of the final bracket
    levels: int = 3
    max_probes: int = 6               # levels and bisections, besides serial and saturated

    def __post_init__(self) -> None:
        a = self.attainment
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
            raise ValueError(f"search.attainment={a!r} must be in (0, 1]")
        t = self.tolerance
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ValueError(f"search.tolerance={t!r} must be a positive fraction")
        for key in ("levels", "max_probes"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"search.{key}={v!r} must be an integer >= 1")
        if self.levels > self.max_probes:
            raise ValueError(f"search.levels={self.levels} is more than "
                             f"search.max_probes={self.max_probes}")

    @classmethod
    def parse(cls, raw) -> SearchSettings:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError(f"search: {raw!r} must be a mapping of attainment, tolerance, "
                             "levels, max_probes")
        unknown = sorted(set(raw) - {"attainment", "tolerance", "levels", "max_probes"})
        if unknown:
            raise ValueError(f"search: unknown key {unknown[0]!r}; valid keys: attainment, "
                             "levels, max_probes, tolerance")
        return cls(**raw)

    def to_dict(self) -> dict:
        return {"attainment": self.attainment, "tolerance": self.tolerance,
                "levels": self.levels, "max_probes": self.max_probes}


def search_settings(item: dict, options: dict) -> dict | None:
    """A scenario workload's search settings (``SearchSettings.to_dict``), or None for a
    workload with its own levels; ValueError naming the bad value."""
    if options.get("arrival") != "auto":
        if "search" in item:
            raise ValueError("search settings need arrival: auto")
        return None
    if isinstance(options.get("num_requests"), list):
        raise ValueError(f"num_requests: {options['num_requests']!r}: arrival: auto takes "
                         "one num_requests (the requests of each probe)")
    return SearchSettings.parse(item.get("search")).to_dict()


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (``(0, 1)`` for no trials)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def requests_to_resolve(target: float, z: float = Z95) -> int:
    """Requests a level needs before an all-pass level's interval clears ``target``."""
    return 1 if target >= 1 else math.ceil(z * z * target / (1 - target))


def slo_attainment(rows: list[dict], slo: dict | None) -> dict | None:
    """Per SLA key ``{"attained", "n", "share"}`` of a workload cell's rows (module
    docstring), with ``"min"``: the smallest share and its key. None without an SLA."""
    from kvmap.metrics import request_stats
    if not slo:
        return None
    stats = [request_stats(r) for r in rows]
    out = {}
    for key, limit in slo.items():
        metric, _ = split_slo_key(key)
        metric = metric.removesuffix("_s")
        if metric == "ttft":
            values = [[s.ttft_s if not s.failed and s.ttft_s is not None else math.inf]
                      for s in stats]
        elif metric in ("tbt", "itl"):
            values = [list(s.itl_s) if not s.failed else [math.inf] for s in stats]
        elif metric in ("tpot", "e2e", "queue"):
            v = [getattr(s, f"{metric}_s") for s in stats]
            values = [[x if x is not None and not s.failed else math.inf]
                      for x, s in zip(v, stats)]
        else:
            continue
        flat = [x for group in values for x in group]
        if not flat:
            continue
        share = sum(x <= limit for x in flat) / len(flat)
        out[key] = {"share": share, "attained": share * len(stats), "n": len(stats)}
    if not out:
        return None
    worst = min(out, key=lambda k: out[k]["share"])
    return {"keys": out, "min": {"key": worst, **out[worst]}}


def verdict(attained: dict | None, target: float) -> tuple[str, tuple[float, float] | None]:
    """``("pass" | "fail" | "indeterminate", interval)`` of a level's attainment."""
    if not attained:
        return "indeterminate", None
    worst = attained["min"]
    low, high = wilson(worst["attained"], worst["n"])
    if low >= target:
        return "pass", (low, high)
    if high < target:
        return "fail", (low, high)
    return "indeterminate", (low, high)


@dataclass(frozen=True)
class Probe:
    """One probe as the search reads its record."""

    role: str
    rate: float | None                # req/s of an open-loop level (None: a closed run)
    ok: bool                          # the cell ran (an over-saturated stop is ok)
    requests_per_s: float | None = None
    e2e_mean_s: float | None = None
    share: float | None = None        # attainment point estimate
    verdict: str | None = None
    interval: tuple[float, float] | None = None
    over_saturated: bool = False
    concurrency: float | None = None
    throughput_tok_s: float | None = None
    label: str = ""

    def passes(self, target: float) -> bool:
        """On the point estimate (the bisection's direction)."""
        return self.ok and not self.over_saturated and self.share is not None \
            and self.share >= target

    @classmethod
    def of(cls, record, target: float) -> Probe:
        """From a ``CellRecord`` or its stored dict."""
        if not isinstance(record, dict):
            record = record.to_dict()
        load = record.get("load") or {}
        search = load.get("search") or {}
        m = record.get("metrics") or {}
        ok = record.get("status") == "ok"
        att = m.get("slo_attainment")
        v, interval = verdict(att, target) if ok else (None, None)
        over = bool((m.get("stopped_early") or {}).get("reason") == "over-saturated")
        return cls(role=search.get("role", "level"),
                   rate=load.get("value") if load.get("kind") == "poisson" else None,
                   ok=ok, requests_per_s=m.get("requests_per_s"),
                   e2e_mean_s=(m.get("e2e_s") or {}).get("mean"),
                   share=att["min"]["share"] if att else None,
                   verdict="fail" if over else v, interval=interval, over_saturated=over,
                   concurrency=m.get("concurrency_mean"),
                   throughput_tok_s=m.get("output_tokens_per_s"),
                   label=str(load.get("label") or ""))


def _rate_label(rate: float) -> str:
    """A stable label: 3 significant digits (the cell id hashes it)."""
    return f"poisson:{float(f'{rate:.3g}'):g}"


@dataclass(frozen=True)
class NextProbe:
    role: str
    arrival: str                      # "closed:N" | "poisson:R"
    num_requests: int


def grid(serial_rate: float, peak_rate: float, levels: int) -> list[float]:
    """``levels`` rates, geometric from min(X1, Xmax / 2) to Xmax (module docstring)."""
    lo = min(serial_rate, peak_rate / 2)
    hi = max(peak_rate, lo)
    if levels == 1:
        return [float(f"{hi:.3g}")]
    return [float(f"{lo * (hi / lo) ** (i / (levels - 1)):.3g}") for i in range(levels)]


def next_probe(probes: list[Probe], settings: SearchSettings, num_requests: int,
               max_num_seqs: int) -> NextProbe | None:
    """The next probe to run, or None when the search is done (module docstring)."""
    serial = next((p for p in probes if p.role == "serial"), None)
    if serial is None:
        return NextProbe("serial", "closed:1", min(num_requests, SERIAL_REQUESTS))
    saturated = next((p for p in probes if p.role == "saturated"), None)
    if saturated is None:
        c = max(1, min(num_requests, max_num_seqs))
        return NextProbe("saturated", f"closed:{c}", num_requests)
    levels = [p for p in probes if p.role in ("level", "bisect")]
    if len(levels) >= settings.max_probes or not (serial.ok and saturated.ok):
        return None                     # done, or the range runs failed: nothing to place
    x1 = serial.requests_per_s or (1 / serial.e2e_mean_s if serial.e2e_mean_s else None)
    xmax = saturated.requests_per_s or x1
    if not x1 or not xmax:
        return None
    target = settings.attainment
    tried = {round(p.rate, 6) for p in levels if p.rate is not None}
    for rate in grid(x1, xmax, settings.levels):
        if round(rate, 6) in tried:
            p = next(q for q in levels if q.rate is not None and round(q.rate, 6) == round(rate, 6))
            if not p.passes(target):
                break                   # the first miss ends the grid
            continue
        return NextProbe("level", _rate_label(rate), num_requests)
    passing = [p.rate for p in levels if p.rate is not None and p.passes(target)]
    missing = [p.rate for p in levels if p.rate is not None and not p.passes(target)]
    if not missing:
        return None                     # every level up to the peak passes: "top"
    hi = min(missing)
    below = [r for r in passing if r < hi]
    if not below:                       # even the lowest misses: go on below it
        rate = hi / 2
        if rate < x1 / 8:
            return None
        return NextProbe("bisect", _rate_label(rate), num_requests)
    lo = max(below)
    if hi / lo - 1 <= settings.tolerance:
        return None
    rate = float(f"{math.sqrt(lo * hi):.3g}")
    if rate in (lo, hi):
        return None
    return NextProbe("bisect", _rate_label(rate), num_requests)


@dataclass(frozen=True)
class SearchResult:
    """The SLA capacity of one configuration (requests/s) and how sure it is."""

    status: str                       # bracketed | indeterminate | top | below | unmeasured
    capacity: float | None            # the highest passing rate
    bracket: tuple[float, float] | None   # (highest passing, lowest missing)
    tolerance: float
    attainment: float
    probes: tuple[Probe, ...] = field(default=())
    knee: dict | None = None
    sure: bool = True                 # the brackets' intervals clear the target

    def describe(self) -> str:
        if self.status == "unmeasured":
            return "not measured"
        if self.status == "below":
            low = min((p.rate for p in self.probes if p.rate), default=None)
            return f"below {low:g} req/s" if low else "below the lowest level"
        if self.status == "top":
            flag = "" if self.sure else ", indeterminate at this power"
            return f">= {self.capacity:g} req/s (every level up to the peak passes{flag})"
        lo, hi = self.bracket
        flag = ", indeterminate at this power" if self.status == "indeterminate" else ""
        return f"{lo:g} req/s [{lo:g}, {hi:g}){flag}"


def result(probes: list[Probe], settings: SearchSettings) -> SearchResult:
    """The search's answer from its probes (module docstring)."""
    target = settings.attainment
    levels = [p for p in probes if p.role in ("level", "bisect") and p.rate is not None]
    knee = knee_of(probes)
    common = dict(tolerance=settings.tolerance, attainment=target, probes=tuple(probes),
                  knee=knee)
    if not any(p.ok for p in levels):
        return SearchResult("unmeasured", None, None, **common)
    passing = [p for p in levels if p.passes(target)]
    missing = [p for p in levels if not p.passes(target)]
    if not passing:
        return SearchResult("below", None, None, **common)
    if not missing:
        top = max(passing, key=lambda p: p.rate)
        return SearchResult("top", top.rate, None, **common, sure=top.verdict == "pass")
    hi = min(missing, key=lambda p: p.rate)
    below = [p for p in passing if p.rate < hi.rate]
    if not below:
        return SearchResult("below", None, None, **common)
    lo = max(below, key=lambda p: p.rate)
    sure = all(p.verdict in ("pass", "fail") for p in (lo, hi) if p.ok)
    return SearchResult("bracketed" if sure else "indeterminate", lo.rate,
                        (lo.rate, hi.rate), **common, sure=sure)


def knee_of(probes: list[Probe], share: float = 0.9) -> dict | None:
    """The knee of throughput against concurrency: the lowest measured concurrency whose
    throughput reaches ``share`` of the highest (``{"concurrency", "throughput_tok_s",
    "peak_tok_s"}``), or None without two measured points."""
    points = sorted((p.concurrency, p.throughput_tok_s) for p in probes
                    if p.ok and p.concurrency and p.throughput_tok_s)
    if len(points) < 2:
        return None
    peak = max(t for _, t in points)
    c, t = next((c, t) for c, t in points if t >= share * peak)
    return {"concurrency": c, "throughput_tok_s": t, "peak_tok_s": peak, "share": share}
