"""Load levels found, not guessed: ``arrival: auto``, the SLA capacity by predict-then-
verify. The rules only (pure: records in, the next probe out): the bench runs the probes
(``bench.search_backend``), the report reads the capacity back (``report.capacity``).

A workload with ``arrival: auto`` runs, per configuration, a sequence of probe cells, each
decided from the records of the ones before (``next_probe``), so a resumed run takes the
same path:

    1. serial     closed:1, a few requests: a request's own time W1 and rate X1
    2. saturated  closed:C, C = min(num_requests, max_num_seqs): the peak rate Xmax
    3. predicted  the simulator of this machine, given the saturated run's requests,
                  predicts the highest Poisson rate that meets the SLA (the backend asks
                  it; without a prediction the first level is the geometric middle of
                  [min(X1, Xmax / 2), Xmax])
    4. verify     open-loop (Poisson) levels placed around the boundary: the first at the
                  prediction; then, from the decided verdicts so far, up by
                  ``STEP`` until a level fails, down until one passes, then bisection
                  (geometric mean) until the decided pass and the decided fail are within
                  ``tolerance`` (relative) or ``max_probes`` ran
    5. extend     sequential sampling: a level whose verdict is undecided draws more
                  requests (a probe at the same rate with fresh requests: another seed)
                  until it is decided or holds ``max_level_requests``

Verdicts are the exact percentile tests of :mod:`kvmap.metrics.evidence`, per SLA key at
its own percentile (``ttft_p90_s``: 0.90; a key without one at ``attainment``), pooled
across levels by monotonicity; a level stopped early as over-saturated fails. The
capacity is *decided* when a decided pass and a decided fail bracket it; the point
estimate is the isotonic fit of attainment against rate over every level
(``fit_boundary``), clipped into the bracket.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvmap.metrics.evidence import (KeyEvidence, decide, evidence_of, fit_boundary,
                                 level_verdict, pooled, slo_attainment)
from kvmap.runs.cell_payloads import LoadLevel
from kvmap.runs.record import CellRecord, JSONObject
from kvmap.runs.search_settings import SearchSettings

ROLES = ("serial", "saturated", "level", "bisect", "extend")
SERIAL_REQUESTS = 4
STEP = 1.6                  # a level up or down before the bracket closes
# No level above the saturated run's rate: faster arrivals queue without bound, and a short
# probe there passes only because it ends before its queue shows.

__all__ = ["slo_attainment"]        # re-exported: the bench cell computes it from here


@dataclass(frozen=True)
class Probe:
    """One probe as the search reads its record."""

    role: str
    rate: float | None                # req/s of an open-loop level (None: a closed run)
    ok: bool                          # the cell ran (an over-saturated stop is ok)
    requests_per_s: float | None = None
    e2e_mean_s: float | None = None
    share: float | None = None        # the worst key's share within its limit
    verdict: str | None = None        # this probe alone: pass | fail | undecided
    evidence: tuple[KeyEvidence, ...] = ()
    over_saturated: bool = False
    concurrency: float | None = None
    throughput_tok_s: float | None = None
    label: str = ""
    num_requests: int = 0

    @classmethod
    def of(cls, record: Any, target: float) -> Probe:
        """From a ``CellRecord`` or its stored dict; ``target``: the quantile of SLA keys
        without a percentile."""
        if isinstance(record, dict):
            record = CellRecord.from_dict(record)
        load = record.load_level or LoadLevel()
        m = record.workload_metrics
        ok = record.ok
        att = m.slo_attainment
        evidence = evidence_of(att, target) if ok else ()
        over = bool((m.stopped_early or {}).get("reason") == "over-saturated")
        v = "fail" if over else (level_verdict(list(evidence)) if ok else None)
        return cls(role=load.search_role or "level",
                   rate=load.value if load.kind == "poisson" else None,
                   ok=ok, requests_per_s=m.requests_per_s,
                   e2e_mean_s=m.summary("e2e_s").mean,
                   share=att["min"]["share"] if att else None, verdict=v,
                   evidence=evidence, over_saturated=over,
                   concurrency=m.concurrency_mean,
                   throughput_tok_s=m.output_tokens_per_s,
                   label=str(load.label or ""),
                   num_requests=int(m.num_requests or 0))


def _rate_label(rate: float) -> str:
    """A stable label: 3 significant digits (the cell id hashes it)."""
    return f"poisson:{float(f'{rate:.3g}'):g}"


def _round(rate: float) -> float:
    return float(f"{rate:.3g}")


@dataclass(frozen=True)
class NextProbe:
    role: str
    arrival: str                      # "closed:N" | "poisson:R"
    num_requests: int
    seed_offset: int = 0              # an extension's fresh requests


def grid(serial_rate: float, peak_rate: float, levels: int) -> list[float]:
    """``levels`` rates, geometric from min(X1, Xmax / 2) to Xmax: the ladder a search
    without a prediction would climb (the requests it saves are counted against it)."""
    lo = min(serial_rate, peak_rate / 2)
    hi = max(peak_rate, lo)
    if levels == 1:
        return [_round(hi)]
    return [_round(lo * (hi / lo) ** (i / (levels - 1))) for i in range(levels)]


def level_probes(probes: list[Probe]) -> list[Probe]:
    """The open-loop levels that ran (serial and saturated runs are not levels)."""
    return [p for p in probes if p.role in ("level", "bisect", "extend")
            and p.rate is not None]


def rate_of(level: Probe) -> float:
    """A level probe's rate (``level_probes`` keeps only probes that have one)."""
    if level.rate is None:
        raise ValueError(f"probe {level.label!r} ({level.role}) is not an open-loop level")
    return level.rate


def _at(probes: list[Probe], rate: float) -> list[Probe]:
    """The level probes run at ``rate`` (a level and its extensions)."""
    return [p for p in level_probes(probes)
            if math.isclose(rate_of(p), rate, rel_tol=1e-6)]


def own_rate(serial: Probe) -> float | None:
    """X1: a request's own rate, from the serial run (its throughput, else 1 / E2E)."""
    return serial.requests_per_s or (1 / serial.e2e_mean_s if serial.e2e_mean_s else None)


def rate_verdicts(probes: list[Probe]) -> dict[float, str]:
    """Each measured rate's verdict, pooled over every level (``evidence.pooled``); a
    rate with an over-saturated probe fails, one whose cells all failed is left out."""
    levels = [p for p in level_probes(probes) if p.ok]
    data = [(rate_of(p), list(p.evidence)) for p in levels]
    out = {}
    for rate in sorted({rate_of(p) for p in levels}):
        here = [p for p in _at(probes, rate) if p.ok]
        out[rate] = "fail" if any(p.over_saturated for p in here) else pooled(data, rate)
    return out


def _bracket(verdicts: dict[float, str]) -> tuple[float | None, float | None]:
    """(highest decided pass, lowest decided fail above it)."""
    lo = max((r for r, v in verdicts.items() if v == "pass"), default=None)
    hi = min((r for r, v in verdicts.items() if v == "fail" and (lo is None or r > lo)),
             default=None)
    return lo, hi


def _requests_at(probes: list[Probe], rate: float) -> tuple[int, int]:
    """(requests measured at ``rate``, probes run there)."""
    here = _at(probes, rate)
    return sum(p.num_requests for p in here), len(here)


def _counts_at(probes: list[Probe], rate: float) -> dict[str, tuple[int, int, float]]:
    """Per SLA key ``(within, n, quantile)`` of the probes at ``rate``, pooled."""
    out: dict[str, tuple[int, int, float]] = {}
    for e in (e for p in _at(probes, rate) for e in p.evidence):
        within, n, _ = out.get(e.key, (0, 0, e.quantile))
        out[e.key] = (within + e.within, n + e.n, e.quantile)
    return out


def _worth_extending(probes: list[Probe], rate: float, cap: int) -> bool:
    """Whether drawing up to ``cap`` requests at ``rate`` could decide it: at the shares
    seen so far, every key's test decides with the values that many requests would give
    (a share that sits on its quantile never decides: move on instead)."""
    measured, _ = _requests_at(probes, rate)
    if measured >= cap or measured == 0:
        return False
    scale = cap / measured
    return all(decide(round(within * scale), round(n * scale), q) != "undecided"
               for within, n, q in _counts_at(probes, rate).values())


def _point_passes(probes: list[Probe], rate: float) -> bool:
    """Whether every key's share at ``rate`` (its probes pooled) meets its quantile."""
    counts = _counts_at(probes, rate)
    return bool(counts) and all(n and within / n >= q for within, n, q in counts.values())


def next_probe(probes: list[Probe], settings: SearchSettings, num_requests: int,
               max_num_seqs: int, predicted: float | None = None) -> NextProbe | None:
    """The next probe to run, or None when the search is done (module docstring)."""
    serial = next((p for p in probes if p.role == "serial"), None)
    if serial is None:
        return NextProbe("serial", "closed:1", min(num_requests, SERIAL_REQUESTS))
    saturated = next((p for p in probes if p.role == "saturated"), None)
    if saturated is None:
        c = max(1, min(num_requests, max_num_seqs))
        return NextProbe("saturated", f"closed:{c}", num_requests)
    levels = level_probes(probes)
    if len(levels) >= settings.max_probes or not (serial.ok and saturated.ok):
        return None                     # done, or the range runs failed: nothing to place
    x1 = own_rate(serial)
    xmax = saturated.requests_per_s or x1
    if not x1 or not xmax:
        return None
    if not levels:
        ladder = grid(x1, xmax, 3)
        # verify a prediction where it is cheap to decide: half the tolerance below it
        # (a pass expected), then half above (a fail expected)
        first = predicted / math.sqrt(1 + settings.tolerance) if predicted and predicted > 0 \
            else math.sqrt(ladder[0] * ladder[-1])
        first = min(max(first, x1 / 8), xmax)
        return NextProbe("level", _rate_label(first), num_requests)
    verdicts = rate_verdicts(probes)
    last = rate_of(levels[-1])
    cap = settings.max_level_requests or 4 * num_requests
    if verdicts.get(last) == "undecided" and _worth_extending(probes, last, cap):
        _, runs = _requests_at(probes, last)
        return NextProbe("extend", _rate_label(last), num_requests, seed_offset=runs)
    lo, hi = _bracket(verdicts)

    def tried(rate: float) -> bool:                 # within a few percent of a level run
        return any(abs(rate / r - 1) < settings.tolerance / 8 for r in verdicts)
    if lo is not None and hi is not None:
        if hi / lo - 1 <= settings.tolerance:
            return None
        rate = _round(math.sqrt(lo * hi))
        if tried(rate):               # the middle ran and is undecided past its cap:
            #                             halve the side the boundary looks to be on
            mid = min(verdicts, key=lambda r: abs(r / rate - 1))
            rate = _round(math.sqrt(mid * hi) if _point_passes(probes, mid)
                          else math.sqrt(lo * mid))
        return None if tried(rate) else \
            NextProbe("bisect", _rate_label(rate), num_requests)
    step = 1 + settings.tolerance if predicted else STEP
    if hi is None:                      # nothing fails yet: up from the highest tried
        rate = _round(max(verdicts) * step)
        rate = min(rate, _round(xmax))
        if tried(rate):
            return None                 # the SLA holds up to the peak rate: "top"
        return NextProbe("level", _rate_label(rate), num_requests)
    rate = _round(min(verdicts) / step)     # nothing passes yet: down from the lowest
    if rate < x1 / 8 or tried(rate):
        return None
    return NextProbe("level", _rate_label(rate), num_requests)


@dataclass(frozen=True)
class SearchResult:
    """The SLA capacity of one configuration (requests/s) and how sure it is."""

    status: str              # decided | top (throughput-bound) | below | undecided | unmeasured
    capacity: float | None            # the estimate: the fitted boundary in the bracket
    bracket: tuple[float, float] | None   # (highest decided pass, lowest decided fail)
    tolerance: float
    attainment: float
    probes: tuple[Probe, ...] = field(default=())
    knee: JSONObject | None = None
    predicted: float | None = None    # the simulator's capacity, before any level ran
    num_requests: int = 0             # every probe's requests, serial and saturated too
    needed: int | None = None         # requests a level needs to decide a pass

    @property
    def sure(self) -> bool:
        return self.status in ("decided", "top", "below")

    def describe(self) -> str:
        n = f"{self.num_requests} requests"
        pred = f"; predicted {self.predicted:.3g}" if self.predicted else ""
        if self.status == "unmeasured":
            return "not measured"
        if self.status == "below":
            assert self.bracket is not None         # result() gives "below" its bracket
            return f"below {self.bracket[1]:.3g} req/s (decided fail there; {n}{pred})"
        if self.status == "top":
            peak = f" and at most the saturated rate {self.bracket[1]:.3g}" \
                if self.bracket else ""
            return (f">= {self.capacity:.3g} req/s{peak} (throughput-bound: the SLA holds, "
                    f"decided, at every rate tried up to the machine's peak; {n}{pred})")
        if self.status == "undecided":
            need = f"; a pass needs >= {self.needed} requests a level" if self.needed else ""
            return f"undecided at this power ({n}{need}{pred})"
        assert self.bracket is not None             # result() gives "decided" its bracket
        lo, hi = self.bracket
        return f"{self.capacity:.3g} req/s [{lo:.3g}, {hi:.3g}) ({n}{pred})"


def result(probes: list[Probe], settings: SearchSettings, predicted: float | None = None,
           needed: int | None = None) -> SearchResult:
    """The search's answer from its probes (module docstring)."""
    target = settings.attainment
    levels = [p for p in level_probes(probes) if p.ok]
    def answer(status: str, capacity: float | None,
               bracket: tuple[float, float] | None) -> SearchResult:
        return SearchResult(status, capacity, bracket, tolerance=settings.tolerance,
                            attainment=target, probes=tuple(probes), knee=knee_of(probes),
                            predicted=predicted,
                            num_requests=sum(p.num_requests for p in probes), needed=needed)
    if not levels:
        return answer("unmeasured", None, None)
    verdicts = rate_verdicts(probes)
    lo, hi = _bracket(verdicts)
    if lo is not None and hi is not None:
        fit = fit_boundary([(rate_of(p), list(p.evidence)) for p in levels])
        estimate = min(max(fit, lo), hi) if fit else math.sqrt(lo * hi)
        return answer("decided", _round(estimate), (lo, hi))
    if lo is not None:                  # throughput-bound: between the highest decided
        #                                 pass and the saturated run's peak rate
        peak = next((p.requests_per_s for p in probes if p.role == "saturated" and p.ok
                     and p.requests_per_s), None)
        return answer("top", lo, (lo, max(lo, peak)) if peak else None)
    if hi is not None and all(v != "pass" for v in verdicts.values()) \
            and hi <= min(verdicts):
        return answer("below", None, (0.0, hi))
    return answer("undecided", None, None)


def knee_of(probes: list[Probe], share: float = 0.9) -> JSONObject | None:
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
