"""Raw load-run results -> per-request metrics, run-store rows and a cell's metrics.

Definitions are ``vllm bench serve``'s (``docs/metrics.md``), from the client's clock:

    sent_s       chunk_times_s[0]   [1]   ...   [k-1]        end_s
      |<-- ttft_s ---->|<-itl_0->|  ...  |              |
      |<----------------- e2e_s ------------------>|    (the last content chunk)
      tpot_s = (e2e_s - ttft_s) / (n - 1)    n = usage.completion_tokens, else k

- TTFT counts from the moment the request was sent (not its scheduled time; the lag
  between the two is kept apart, ``send_lag_s``), so it includes the HTTP round trip.
- ITL/TBT are the gaps between successive content chunks. One chunk is one token on
  kvmap's and vLLM's servers; on a server that packs several tokens in a chunk the gaps
  are per chunk, as in vLLM's benchmark, while TPOT stays per token (it uses ``n``).
- E2E ends at the last content chunk (vLLM's ``latency``); the usage chunk and
  ``[DONE]`` after it are not counted.
- ``n`` comes from the server's usage chunk; a server that sends none falls back to the
  number of content chunks (``num_output_tokens_from_chunks`` counts those requests).
- A non-streaming request has E2E and usage, no TTFT, TBT or TPOT.

Rows follow ``kvmap.runs.store.REQUEST_SCHEMA`` with times relative to the run's start,
``token_times_s`` = the content-chunk times, and ``error`` = ``"<kind>: <message>"``.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from kvmap.metrics import RequestStats, aggregate, summarize
from kvmap.loadgen.runner import Sent


def request_stats(sent: Sent, t0_s: float) -> RequestStats:
    """One request's metrics (see the module docstring); times relative to ``t0_s``."""
    r = sent.result
    if r.sent_s is not None:
        arrival_s = r.sent_s - t0_s
    else:
        arrival_s = sent.scheduled_s or 0.0
    chunks = [t - t0_s for t in r.chunk_times_s]
    num_output = r.num_output_tokens if r.num_output_tokens is not None else len(chunks)
    ttft_s = chunks[0] - arrival_s if chunks else None
    if chunks:
        finished_s = chunks[-1]
    else:
        finished_s = None if r.end_s is None else r.end_s - t0_s
    failed = r.error_kind is not None
    e2e_s = None if finished_s is None else finished_s - arrival_s
    tpot_s = ((e2e_s - ttft_s) / (num_output - 1)
              if ttft_s is not None and e2e_s is not None and num_output > 1 else None)
    return RequestStats(
        failed=failed, arrival_s=arrival_s, finished_s=None if failed else finished_s,
        num_prompt_tokens=r.num_prompt_tokens or 0, num_cached_prompt_tokens=0,
        num_output_tokens=num_output, num_preemptions=0,
        ttft_s=ttft_s, tpot_s=tpot_s, e2e_s=e2e_s,
        itl_s=tuple(b - a for a, b in zip(chunks, chunks[1:])), queue_s=None)


def request_row(sent: Sent, t0_s: float, *, cell_id: str, model: str, kv: str,
                workload: str) -> dict:
    """One ``REQUEST_SCHEMA`` row of ``sent``."""
    r, s, w = sent.result, request_stats(sent, t0_s), sent.request
    return {"cell_id": cell_id, "model": model, "kv": kv, "workload": workload,
            "request_id": w.request_id, "conversation_id": w.conversation_id,
            "turn": w.turn, "scheduled_arrival_s": sent.scheduled_s,
            "arrival_s": s.arrival_s, "first_scheduled_s": None,
            "finished_s": None if r.end_s is None else
            (r.chunk_times_s[-1] if r.chunk_times_s else r.end_s) - t0_s,
            "token_times_s": [t - t0_s for t in r.chunk_times_s],
            "num_prompt_tokens": r.num_prompt_tokens, "num_cached_prompt_tokens": None,
            "num_output_tokens": s.num_output_tokens, "num_preemptions": None,
            "max_tokens": w.max_tokens, "ttft_s": s.ttft_s, "tpot_s": s.tpot_s,
            "e2e_s": s.e2e_s, "queue_s": None, "tbt_max_s": max(s.itl_s, default=None),
            "finish_reason": r.finish_reason, "failed": s.failed,
            "error": None if r.error_kind is None else f"{r.error_kind}: {r.error}",
            "expected": w.expected, "correct": None, "needle_depth": w.needle_depth,
            "output_text": r.output_text}


def load_metrics(sent: Iterable[Sent], t0_s: float, duration_s: float | None,
                 slo: Mapping[str, float] | None = None) -> dict:
    """A cell's metrics: ``kvmap.metrics.aggregate`` of the requests' stats, plus
    failures by kind, HTTP statuses, how many requests had no usage, and send lag."""
    sent = list(sent)
    stats = [request_stats(s, t0_s) for s in sent]
    metrics = aggregate(stats, duration_s if duration_s and duration_s > 0 else None, slo)
    results = [s.result for s in sent]
    lags = [s.result.sent_s - t0_s - s.scheduled_s for s in sent
            if s.scheduled_s is not None and s.result.sent_s is not None]
    chunks = sum(len(r.chunk_times_s) for r in results if r.error_kind is None)
    metrics.update(
        failures_by_kind=dict(Counter(r.error_kind for r in results if r.error_kind)),
        http_status_counts={str(k): v for k, v in
                            sorted(Counter(r.http_status for r in results
                                           if r.http_status is not None).items())},
        first_errors=list(dict.fromkeys(f"{r.error_kind}: {r.error}" for r in results
                                        if r.error_kind))[:5],
        num_output_tokens_from_chunks=sum(r.num_output_tokens is None for r in results
                                          if r.error_kind is None),
        num_content_chunks=chunks,
        send_lag_s=summarize(lags))
    return metrics

