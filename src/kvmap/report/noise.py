"""Speed with its noise: the interval of a cell's output throughput, and the parts of a
configuration that never acted in a cell (so the configuration equals its base there).

Throughput interval: the cell's output rate measured over ~10 equal time windows
(``output_throughput_windows_tok_s``, or recomputed from the request rows' token times
over [first arrival, last finish]); the interval is a Student-t interval of the window
mean, centred on the record's own rate:

    windows r_1 .. r_k      half = t(0.975, k-1) * sd(r) / sqrt(k)
    interval = rate -+ half

Windows within one cell are not independent draws (a batch spans several), so read the
interval as the cell's own fluctuation, not as run-to-run noise.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvmap.kv.codecs import CODECS
from kvmap.kv.grammar import Part, parse
from kvmap.kv.policies import POLICIES
from kvmap.kv.tiers import TIER_PARTS
from kvmap.kv.window_layout import WINDOW_LAYOUTS, WindowLayout
from kvmap.runs.workload_metrics import WorkloadMetrics

NUM_WINDOWS = 10
MIN_WINDOWS = 3
Z95 = 1.959963984540054


def t975(df: int) -> float:
    """Student-t 97.5% quantile (Cornish-Fisher expansion, within 0.5% from df = 3)."""
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df)


def windows_from_rows(rows: list[dict[str, Any]], num_windows: int = NUM_WINDOWS
                      ) -> list[float]:
    """Output tokens per second in ``num_windows`` equal windows of the rows' span."""
    done = [r for r in rows if not r.get("failed")]
    times = [t for r in done for t in (r.get("token_times_s") or [])]
    if not times:
        return []
    start = min([r["arrival_s"] for r in done if r.get("arrival_s") is not None] + times)
    end = max(times)
    if not end > start:
        return []
    counts, _ = np.histogram(times, bins=num_windows, range=(start, end))
    return list(counts / ((end - start) / num_windows))


def throughput_ci(metrics: WorkloadMetrics, rows: list[dict[str, Any]]
                  ) -> tuple[float, float] | None:
    """95% interval of the cell's output tokens/s, or None with fewer than 3 windows."""
    rate = metrics.output_tokens_per_s
    windows = metrics.output_throughput_windows_tok_s or windows_from_rows(rows)
    windows = [float(w) for w in windows if w is not None]
    if rate is None or len(windows) < MIN_WINDOWS:
        return None
    half = t975(len(windows) - 1) * float(np.std(windows, ddof=1)) / math.sqrt(len(windows))
    return max(0.0, rate - half), rate + half


# ---- which parts of a configuration acted ----------------------------------------------

def parts(kv: str) -> dict[str, Part]:
    """``"snapkv(budget=0.25)+int8"`` -> ``{"policy": Part, "codec": Part}`` (unknown
    names are left out: the report reads old runs whose families may be gone)."""
    try:
        found = parse(kv)
    except ValueError:
        return {}
    out = {}
    for part in found:
        for kind, registry in (("codec", CODECS), ("policy", POLICIES), ("tiers", TIER_PARTS),
                               ("window", WINDOW_LAYOUTS)):
            if part.name in registry:
                out[kind] = part
    return out


def reference_part(kv: str) -> str | None:
    """The name of a part of ``kv`` that makes it a reference measured beside the
    deployable configurations (``all_global``: a hybrid model's sliding layers kept
    whole), or None."""
    layout = parts(kv).get("window")
    if layout is None:
        return None
    layout_type: type[WindowLayout] = WINDOW_LAYOUTS.get(layout.name)
    return layout.name if layout_type.reference_only else None


def complexity(kv: str, dtype: str | None) -> int:
    """How many parts the configuration adds to the plain cache: a codec other than the
    model's dtype, a policy (other than ``full``), a tier layout. bf16 is 0."""
    p = parts(kv)
    n = int("codec" in p and p["codec"].name != dtype)
    n += int("policy" in p and p["policy"].name != "full")
    return n + int("tiers" in p)


def idle_parts(kv: str, metrics: WorkloadMetrics) -> list[str]:
    """The parts of ``kv`` that never acted in the cell of ``metrics``: a tier layout no
    tier of which was read (``bytes_read`` 0 and no hits), a policy that evicted nothing
    (``num_evicted_tokens`` 0; without it, ``num_compressions`` 0). A figure the record
    lacks counts as acted (not known)."""
    p, idle = parts(kv), []
    tiers = metrics.tiers
    if "tiers" in p and tiers and all(not s.bytes_read and not s.num_hits
                                      for s in tiers.values()):
        idle.append("tiers")
    evicted = metrics.num_evicted_tokens
    if "policy" in p and p["policy"].name != "full" and (
            evicted == 0 or (evicted is None and metrics.num_compressions == 0)):
        idle.append("policy")
    return idle


def without(kv: str, kinds: list[str], dtype: str | None) -> str:
    """The spec with the ``kinds`` parts removed (the model's dtype when none is left)."""
    drop = {str(q) for k, q in parts(kv).items() if k in kinds}
    kept = [str(part) for part in parse(kv) if str(part) not in drop]
    return "+".join(kept) if kept else (dtype or "bf16")


def same_spec(a: str, b: str, dtype: str | None) -> bool:
    """Whether two specs name the same configuration (part order aside; a missing codec
    is the model's dtype)."""
    def key(kv: str) -> tuple[str, ...]:
        try:
            found = {str(part) for part in parse(kv)}
        except ValueError:
            return (kv,)
        if "codec" not in parts(kv):
            found.add(dtype or "bf16")
        return tuple(sorted(found))
    return key(a) == key(b)
