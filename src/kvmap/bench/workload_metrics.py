"""What a workload cell measured, from its rows and the engine's ``EngineStats``: the
per-request rows, tier IO, how many sequences ran and waited (the contract's
concurrency keys), the pool's capacity in tokens and output rates per time window.
"""
from __future__ import annotations

import re

from kvmap.engine.stats import EngineStats

NUM_THROUGHPUT_WINDOWS = 10
_NUMBER = re.compile(r"\d+")


def request_rows(cell, requests: list, outputs: dict, errors: dict,
                 t0: float) -> list[dict]:
    """One row per request, times in seconds from the workload's start (``t0``)."""
    from kvmap.metrics import request_stats

    def rel(t):
        return None if t is None else t - t0

    rows = []
    for r in requests:
        row = {"cell_id": cell.cell_id, "model": cell.model.name, "kv": cell.kv,
               "workload": cell.workload.name, "request_id": r.request_id,
               "conversation_id": r.conversation_id, "turn": r.turn,
               "scheduled_arrival_s": r.arrival_s, "expected": r.expected,
               "needle_depth": r.needle_depth, "max_tokens": r.max_tokens}
        out = outputs.get(r.request_id)
        if out is None:
            # a request never run still counts (failed) from its scheduled arrival
            rows.append({**row, "failed": True, "error": errors.get(r.request_id, "not run"),
                         "finish_reason": None, "token_times_s": [],
                         "arrival_s": r.arrival_s or 0.0})
            continue
        m, s = out.metrics, request_stats(out)
        correct = None
        if r.expected is not None:
            number = _NUMBER.search(out.text)
            correct = number is not None and number.group() == r.expected
        rows.append({**row, "failed": s.failed, "error": None,
                     "finish_reason": out.finish_reason, "arrival_s": rel(m.arrival_s),
                     "first_scheduled_s": rel(m.first_scheduled_s),
                     "finished_s": rel(m.finished_s),
                     "token_times_s": [t - t0 for t in m.token_times_s],
                     "num_prompt_tokens": m.num_prompt_tokens,
                     "num_cached_prompt_tokens": m.num_cached_prompt_tokens,
                     "num_output_tokens": m.num_output_tokens,
                     "num_preemptions": m.num_preemptions,
                     "ttft_s": s.ttft_s, "tpot_s": s.tpot_s, "e2e_s": s.e2e_s,
                     "queue_s": s.queue_s, "tbt_max_s": max(s.itl_s, default=None),
                     "output_text": out.text, "correct": correct})
    return rows


def tier_metrics(stats: EngineStats) -> dict:
    """Hit rate and IO of the lower tiers (None without tiers), their errors, and each
    tier's own counters."""
    tiers = stats.tiers.values()
    hits, misses = sum(t.num_hits for t in tiers), sum(t.num_misses for t in tiers)
    lookups = hits + misses
    has_io = bool(stats.tiers)
    return {"tier_hit_rate": hits / lookups if lookups else None,
            "io_bytes": sum(t.bytes_read + t.bytes_written for t in tiers) if has_io
            else None,
            "io_latency_s": sum(t.io_s for t in tiers) if has_io else None,
            "tier_errors": stats.num_tier_errors,
            "tiers": {name: t.to_dict() for name, t in stats.tiers.items()}}


def load_metrics(stats: EngineStats, duration_s: float) -> dict:
    """Running and waiting sequences (max, and the mean over the cell's wall time, idle
    gaps counting as none), steps with a full pool, preemptions, pool capacity."""
    return {"concurrency_max": stats.max_num_running,
            "concurrency_mean": stats.running_seq_s / duration_s if duration_s else None,
            "waiting_max": stats.max_num_waiting,
            "waiting_mean": stats.waiting_seq_s / duration_s if duration_s else None,
            "num_pool_full_steps": stats.num_pool_full_steps,
            "num_preemptions_engine": stats.num_preemptions,
            "max_num_running_seqs": stats.max_num_running,
            "num_engine_steps": stats.num_steps}


def throughput_windows(rows: list[dict], duration_s: float,
                       num_windows: int = NUM_THROUGHPUT_WINDOWS) -> list[float]:
    """Output tokens per second in ``num_windows`` equal windows of ``[0, duration_s]``
    (token times relative to the workload's start): the spread gives an interval."""
    if duration_s <= 0:
        return []
    counts = [0] * num_windows
    width_s = duration_s / num_windows
    for row in rows:
        for t in row.get("token_times_s") or ():
            counts[min(num_windows - 1, max(0, int(t / width_s)))] += 1
    return [c / width_s for c in counts]


def prefix_metrics(stats: EngineStats) -> dict:
    queries = stats.prefix_cache_queries
    return {"prefix_cache_queries": queries, "prefix_cache_hits": stats.prefix_cache_hits,
            "prefix_cache_hit_rate": stats.prefix_cache_hits / queries if queries else None,
            "num_compressions": stats.num_compressions,
            "num_evicted_tokens": stats.num_evicted_tokens,
            # soft eviction (a policy's evict_to): prompt blocks kept in a tier
            "num_soft_evicted_blocks": (stats.tier_store or {}).get("num_soft_evicted_blocks")}
