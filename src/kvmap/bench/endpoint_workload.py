"""A workload cell over HTTP: the same requests as an in-process cell, sent by loadgen's
client, measured with vLLM's definitions, written with the in-process cell's keys.

The workload's prompts are built with the endpoint's ``tokenizer`` (its own, for exact
prompt lengths), sent as completions at temperature 0 with ``ignore_eos`` (exact output
lengths where the server honours it), streamed: TTFT, ITL/TBT, TPOT, E2E and goodput
come from the client's clock (``kvmap.loadgen.results``). The load is the workload's: a
closed loop of its concurrency (``arrival: [closed:4, ...]`` sweeps it, one cell per
level) or its open-loop arrival times. ``/metrics`` is scraped before, every
``SCRAPE_INTERVAL_S`` during and after the cell by loadgen's ``measure_level`` (the
pages read during the cell are parsed after it, off the loop that stamps the tokens),
for the server's own view and the KV memory (``endpoint_memory``). A cell in which no request completed fails, naming the
endpoint and the first errors.
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from kvmap.bench.cellspec import CellSpec
from kvmap.bench.endpoint_http import (check_served, endpoint_info, http_endpoint,
                                       load_tokenizer)

SCRAPE_INTERVAL_S = 0.25
_NUMBER = re.compile(r"\d+")


async def _drive(cell: CellSpec, plan, level, progress: Callable[[float], None]):
    """Run ``plan`` at ``level`` on the endpoint: ``(run, before, after, scrapes)``, the
    pages read by loadgen's ``measure_level`` (fetched during the level, parsed after it:
    parsing on the loop would delay the token stamps), or no pages without a path."""
    from kvmap.loadgen.runner import open_session, run_plan
    from kvmap.loadgen.level import measure_level
    entry = cell.endpoint
    endpoint = http_endpoint(entry, request_timeout_s=min(cell.timeout_s or 300.0, 600.0))
    total, done = len(plan.requests), [0]

    def on_done(_sent) -> None:
        done[0] += 1
        progress(done[0] / total)

    async with open_session(endpoint) as session:
        await check_served(session, entry)
        if entry.metrics_path is None:
            run = await run_plan(endpoint, plan, on_done=on_done, session=session)
            return run, None, None, []
        m = await measure_level(session, endpoint, plan, level, interval_s=SCRAPE_INTERVAL_S,
                                path=entry.metrics_path, headers=entry.headers(),
                                on_done=on_done)
    return m.run, m.before, m.after, [m.before, *m.timeline_scrapes, m.after]


def _judge(rows: list[dict]) -> None:
    """Needle questions: correct when the first number of the answer is the expected."""
    for row in rows:
        if row.get("expected") is not None and not row["failed"]:
            number = _NUMBER.search(row.get("output_text") or "")
            row["correct"] = number is not None and number.group() == row["expected"]


def _failure(entry, metrics: dict) -> str:
    kinds = metrics.get("failures_by_kind") or {}
    hint = (" (does it stream? a streamed completion must answer with Server-Sent "
            "Events)" if "bad_stream" in kinds or "no_output" in kinds else "")
    return (f"endpoint {entry.name!r}: no request completed{hint}: "
            + "; ".join((metrics.get("first_errors") or ["?"])[:2]))


def run_endpoint_workload(cell: CellSpec, progress: Callable[[float], None]
                          ) -> tuple[dict, list[dict]]:
    """``(metrics, rows)`` of a workload cell on ``cell.endpoint`` (module docstring)."""
    from kvmap.bench.endpoint_memory import peak_memory
    from kvmap.bench.workload_metrics import throughput_windows
    from kvmap.loadgen.results import load_metrics, request_row
    from kvmap.loadgen.schedule import Level, make_plan
    from kvmap.loadgen.server_metrics import server_view
    from kvmap.workloads import build_requests
    entry = cell.endpoint
    spec = cell.workload.spec(cell.seed)
    requests = build_requests(spec, load_tokenizer(entry))
    level = Level(concurrency=spec.concurrency) if spec.concurrency else Level()
    plan = make_plan(requests, level, seed=cell.seed)
    run, before, after, scrapes = asyncio.run(_drive(cell, plan, level, progress))
    metrics = load_metrics(run.sent, run.t0_s, run.duration_s, cell.slo)
    if not metrics.get("num_completed"):
        raise RuntimeError(_failure(entry, metrics))
    rows = [request_row(s, run.t0_s, cell_id=cell.cell_id, model=cell.model.name,
                        kv=cell.kv, workload=cell.workload.name) for s in run.sent]
    _judge(rows)
    judged = [r["correct"] for r in rows if r.get("correct") is not None]
    metrics.update(
        endpoint=endpoint_info(entry), kv_capacity_bytes=entry.kv_memory_bytes,
        **peak_memory(scrapes, entry.kv_memory_bytes),
        output_throughput_windows_tok_s=throughput_windows(rows, run.duration_s),
        needle_accuracy=sum(judged) / len(judged) if judged else None,
        server=server_view(before, after), client_cpu_s=run.client_cpu_s,
        client_cpu_share=run.client_cpu_share)
    return metrics, rows
