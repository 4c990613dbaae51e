"""Run every level of a ``LoadgenScenario`` into a run directory.

For each level, in order: scrape the server's ``/metrics``, build and send the level's
requests (``runner.run_plan``), scrape again, and store one cell -- ``kind: "loadgen"``,
``kv`` = the server's active KV configuration (``/metrics``, ``/v1/models``) or
``"remote"`` -- with its per-request rows. A step load is one continuous run whose phases
become cells; ``/metrics`` is scraped at every phase boundary, and once a second into
``details.server_timeline`` (running/waiting requests, KV usage, active KV config), which
is where an adaptive server's switches show. Levels already stored (a rerun into the
same ``--out``) are skipped.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from kvmap.hardware.process import load_avg
from kvmap.loadgen import prompts
from kvmap.loadgen.client import Endpoint
from kvmap.loadgen.level import measure_level
from kvmap.loadgen.results import load_metrics, request_row
from kvmap.loadgen.runner import LoadRun, Sent, open_session
from kvmap.loadgen.scenario import LoadgenScenario
from kvmap.loadgen.schedule import Level, make_plan
from kvmap.loadgen.server_metrics import Scrape, agreement, server_view
from kvmap.runs.record import CellRecord
from kvmap.runs.store import RunStore


@dataclass
class SweepResult:
    run_dir: Path
    cells: list[CellRecord]      # every stored record, in order
    num_ran: int
    num_skipped: int


def default_run_dir(root: str | Path = "runs") -> Path:
    return Path(root) / f"loadgen-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def cell_id(scenario: LoadgenScenario, level_index: int, phase: int | None) -> str:
    level = scenario.levels[level_index]
    tag = level.name if phase is None else f"{level.name}_phase{phase}"
    digest = hashlib.sha1(f"{scenario.fingerprint()}|{level_index}|{phase}".encode()
                          ).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9.=_-]+", "-", f"{scenario.model}_{scenario.workload_name}_"
                  f"{tag}").strip("-")
    return f"{slug[:90]}_{digest}"


def _requests_for(scenario: LoadgenScenario, level: Level) -> tuple[int | None, bool]:
    """``(number of requests to build, cycle?)`` for ``level`` (see runner.run_plan)."""
    n = level.num_requests_for(scenario.duration_s)
    if scenario.num_requests is not None:
        n = scenario.num_requests if n is None else min(n, scenario.num_requests)
    cycle = (level.concurrency is not None and scenario.duration_s is not None
             and scenario.num_requests is None)
    return n, cycle


def cell_workload(scenario: LoadgenScenario, level: Level, phase: int | None) -> str:
    """The cell's workload name: the workload and its load, ``throughput@rate=2`` or
    ``throughput@phase1:6/s``, so a report draws each level as its own workload."""
    if phase is None:
        return f"{scenario.workload_name}@{level.name}"
    return f"{scenario.workload_name}@phase{phase}:{level.phases[phase].rate_per_s:g}/s"


def _record(scenario: LoadgenScenario, cid: str, level: Level, kv: str, phase: int | None,
            metrics: dict, details: dict, started_at: str, duration_s: float,
            load_start: float | None) -> CellRecord:
    failed = metrics["num_completed"] == 0
    params = {"level": level.name, "rate_per_s": level.rate_per_s,
              "concurrency": level.concurrency, "burstiness": level.burstiness,
              "url": scenario.url, "api": scenario.api, "stream": scenario.stream}
    if phase is not None:
        p = level.phases[phase]
        params.update(phase=phase, rate_per_s=p.rate_per_s, phase_duration_s=p.duration_s)
    return CellRecord(
        cell_id=cid, kind="loadgen", model=scenario.model, dtype=None, kv=kv,
        workload=cell_workload(scenario, level, phase), task=None,
        params={**params, "workload": scenario.workload_name}, started_at=started_at,
        status="failed" if failed else "ok",
        error=("no request completed: " + "; ".join(metrics["first_errors"][:2]))
        if failed else None,
        metrics=metrics, details=details, duration_s=duration_s,
        env={"load_avg_1m_start": load_start, "load_avg_1m_end": load_avg(),
             "num_cpus": os.cpu_count()})


async def warm_up(session, endpoint: Endpoint, request, num: int) -> None:
    """``num`` requests one after the other, not recorded (as ``vllm bench serve``'s
    initial test prompt): first-call costs (allocation, caches) stay out of level 1."""
    from kvmap.loadgen.client import RawResult, send_request
    for k in range(num):
        await send_request(session, endpoint,
                           replace(request, request_id=f"warmup-{k}"), RawResult("warmup"))


def _kv_label(scenario: LoadgenScenario, after: Scrape | None, models: list[dict] | None
              ) -> str:
    if scenario.label:
        return scenario.label
    if after is not None and after.kv_config():
        return after.kv_config()
    for m in models or []:
        if m.get("id") == scenario.model and isinstance(m.get("kv"), str):
            return m["kv"]
    return "remote"


def chunks_per_s(run: LoadRun, start_s: float, end_s: float) -> float | None:
    """Content chunks (tokens, on kvmap's and vLLM's servers) that arrived between
    ``start_s`` and ``end_s`` (seconds into the run), from every request, per second:
    what the server delivered during a step phase, whichever phase sent the request."""
    if not end_s > start_s:
        return None
    lo, hi = run.t0_s + start_s, run.t0_s + end_s
    count = sum(lo <= t < hi for s in run.sent for t in s.result.chunk_times_s)
    return count / (end_s - start_s)


def _cell_metrics(sent: list[Sent], run: LoadRun, duration_s: float, scenario, before,
                  after) -> dict:
    metrics = load_metrics(sent, run.t0_s, duration_s, scenario.slo)
    view = server_view(before, after)
    metrics["server"] = view
    metrics["ttft_vs_server"] = agreement(
        (metrics["ttft_s"] or {}).get("mean"), view and view.get("ttft_mean_s"))
    metrics.update(num_not_sent=run.num_not_sent, stopped_by=run.stopped_by,
                   client_cpu_s=run.client_cpu_s, client_cpu_share=run.client_cpu_share)
    return metrics


async def run_sweep(scenario: LoadgenScenario, endpoint: Endpoint, tokenizer,
                    run_dir: str | Path, *, models: list[dict] | None = None,
                    on_cell: Callable[[dict], None] | None = None,
                    command: list[str] | None = None) -> SweepResult:
    """Run (or resume) ``scenario`` into ``run_dir``; see the module docstring."""
    store, _ = RunStore.open_for(run_dir, scenario, scenario.text(), command)
    done_ids = store.completed_ids()
    spec = prompts.workload_spec(scenario.workload, scenario.trace, seed=scenario.seed,
                                 prompt_tokens=scenario.prompt_tokens,
                                 output_tokens=scenario.output_tokens)
    num_ran = num_skipped = ordinal = 0
    warmed_up = scenario.num_warmup == 0
    async with open_session(endpoint) as session:
        for index, level in enumerate(scenario.levels):
            phases = range(len(level.phases)) if level.phases else [None]
            ids = [cell_id(scenario, index, p) for p in phases]
            if all(i in done_ids for i in ids):
                num_skipped += len(ids)
                ordinal += len(ids)
                continue
            n, cycle = _requests_for(scenario, level)
            requests = prompts.build(spec, tokenizer, n)
            plan = make_plan(requests, level, seed=scenario.seed + index)
            if not warmed_up:
                await warm_up(session, endpoint, requests[0], scenario.num_warmup)
                warmed_up = True
            started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            load_start = load_avg()
            measured = await measure_level(session, endpoint, plan, level,
                                           duration_s=scenario.duration_s,
                                           drain_timeout_s=scenario.drain_timeout_s,
                                           cycle=cycle)
            run, before, after = measured.run, measured.before, measured.after
            scrapes, timeline, boundaries = (measured.scrapes, measured.timeline,
                                             measured.boundaries_s)
            kv = _kv_label(scenario, after, models)
            if level.phases:
                edges = [before] + [scrapes.get(k) for k in range(len(boundaries))] + [after]
                groups = [[s for s in run.sent if s.phase == k] for k in phases]
                windows = [(edges[k], edges[k + 1]) for k in phases]
                durations = [p.duration_s for p in level.phases]
                durations[-1] = max(durations[-1], run.duration_s - sum(durations[:-1]))
            else:
                groups, windows, durations = [run.sent], [(before, after)], [run.duration_s]
            for k, phase in enumerate(phases):
                cid = ids[k]
                metrics = _cell_metrics(groups[k], run, durations[k], scenario, *windows[k])
                start_s = sum(durations[:k])
                metrics["output_chunks_per_s_in_window"] = chunks_per_s(
                    run, start_s, start_s + durations[k])
                phase_kv = (scenario.label or (windows[k][1].kv_config() if windows[k][1]
                                               else None) or kv)
                details = {"server_timeline": timeline} if k == 0 else {}
                record = _record(scenario, cid, level, phase_kv, phase, metrics, details,
                                 started_at, run.duration_s, load_start)
                rows = [request_row(s, run.t0_s, cell_id=cid, model=scenario.model,
                                    kv=phase_kv,
                                    workload=cell_workload(scenario, level, phase))
                        for s in groups[k]]
                store.write_cell(record, rows, ordinal)
                ordinal += 1
                num_ran += 1
                if on_cell is not None:
                    on_cell(record)
    store.finalize()
    return SweepResult(Path(run_dir), store.cells(), num_ran, num_skipped)
