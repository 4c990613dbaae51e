"""An endpoint's KV memory, from what its ``/metrics`` says during a cell.

The peak over the cell's scrapes of the first gauge the server exports, in this order:

- a usage fraction (``USAGE_GAUGES``: vLLM's ``vllm:kv_cache_usage_perc`` -- which
  ``kvmap serve`` exports too -- and its older ``vllm:gpu_cache_usage_perc``, llama.cpp's
  ``llamacpp:kv_cache_usage_ratio``, ``openvino:kv_cache_usage_ratio`` of
  ``scripts/openvino_server.py``) times the endpoint's ``kv_memory``;
- else ``kvmap:kv_resident_bytes{tier="pool"}`` (``kvmap serve``'s own bytes).

A gauge is sampled (``SCRAPE_INTERVAL_S`` of ``endpoint_workload``), so the peak is the
highest reading, not the server's own peak. Otherwise there is no memory coordinate, and
``kv_memory_note`` says why (no scrape, no such gauge, a gauge that read 0 at every
scrape, or a fraction without ``kv_memory`` to multiply it by).
"""
from __future__ import annotations

from collections.abc import Iterable

USAGE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                "llamacpp:kv_cache_usage_ratio", "openvino:kv_cache_usage_ratio")
RESIDENT_GAUGE = "kvmap:kv_resident_bytes"


def pool_resident_bytes(scrape) -> float | None:
    values = [v for labels, v in scrape.labelled(RESIDENT_GAUGE).items()
              if dict(labels).get("tier") in ("pool", "device")]
    return sum(values) if values else None


def peak_memory(scrapes: Iterable, kv_memory_bytes: int | None) -> dict:
    """``peak_kv_resident_bytes`` (None when not known), ``kv_usage_peak_frac``,
    ``kv_memory_source`` (the gauge used) and ``kv_memory_note`` (why none)."""
    scrapes = [s for s in scrapes if s is not None]
    out = {"peak_kv_resident_bytes": None, "kv_usage_peak_frac": None,
           "kv_memory_source": None, "kv_memory_note": None}
    if not scrapes:
        out["kv_memory_note"] = "no /metrics scrape succeeded (not exported or not scraped)"
        return out
    for name in USAGE_GAUGES:
        values = [s.total(name) for s in scrapes if s.total(name) is not None]
        if values:
            out["kv_usage_peak_frac"] = peak = max(values)
            if peak <= 0:
                out["kv_memory_note"] = (f"{name} read 0 at every scrape (the cell was "
                                         "shorter than the scrape interval)")
                return out
            if kv_memory_bytes is None:
                out["kv_memory_note"] = (f"{name} is exported, but the endpoint has no "
                                         "kv_memory to turn the fraction into bytes")
                return out
            out["peak_kv_resident_bytes"] = peak * kv_memory_bytes
            out["kv_memory_source"] = f"{name} x kv_memory"
            return out
    values = [b for b in map(pool_resident_bytes, scrapes) if b]
    if values:
        out["peak_kv_resident_bytes"] = max(values)
        out["kv_memory_source"] = RESIDENT_GAUGE
        return out
    out["kv_memory_note"] = ("/metrics exports none of " + ", ".join(USAGE_GAUGES)
                             + f", {RESIDENT_GAUGE}")
    return out
