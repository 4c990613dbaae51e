"""One load level measured as ``kvmap loadgen`` measures it (``measure_level``): scrape
the server's ``/metrics``, run the level while a watcher fetches pages (parsed after the
level, off the loop that stamps the tokens), scrape again. Imports nothing of the bench,
which runs its endpoint cells through it.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvmap.loadgen.client import Endpoint
from kvmap.loadgen.runner import LoadRun, run_plan
from kvmap.loadgen.schedule import Level
from kvmap.loadgen.server_metrics import Scrape, fetch_metrics, parse_metrics, scrape

TIMELINE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc")


def _timeline_point(t_s: float, s: Scrape) -> dict:
    point = {"t_s": round(t_s, 3), "kv": s.kv_config()}
    for name in TIMELINE_GAUGES:
        point[name.split(":", 1)[1]] = s.total(name)
    point.update({name: s.total(name) for name in sorted(s.names())
                  if name.startswith("kvmap:") and name.endswith("switches_total")})
    return point


async def _watch(session, root: str, t0_s: float, boundaries_s: list[float],
                 pages: dict[int, str | None], timeline: list[tuple[float, str]],
                 interval_s: float = 1.0, path: str = "/metrics",
                 headers: dict | None = None) -> None:
    """Fetch ``/metrics`` at each phase boundary (``pages[k]``: the end of phase k, the
    start of phase k+1) and every ``interval_s`` into ``timeline`` as ``(t_s, text)``,
    until cancelled. Only the text is kept: parsing a page (hundreds of samples on
    ``kvmap serve``) costs the client milliseconds of CPU, which on the loop that stamps
    the level's chunks delayed those stamps and the closed loop's next sends, so
    ``measure_level`` parses after the level. The first tick is ``interval_s`` in: the
    scrape just before the level is the timeline's first point, and a second one would
    land on the level's first wave of sends."""
    i, next_tick_s = 0, t0_s + interval_s
    while True:
        now = time.perf_counter()
        due = [b for b in boundaries_s[i:] if t0_s + b <= now]
        text = await fetch_metrics(session, root, path=path, headers=headers) \
            if due or now >= next_tick_s else None
        for _ in due:
            pages[i] = text
            i += 1
        if now >= next_tick_s:
            if text is not None:
                timeline.append((now - t0_s, text))
            next_tick_s = now + interval_s              # a failed scrape waits its turn too
        wake = [t0_s + b for b in boundaries_s[i:i + 1]] + [next_tick_s]
        await asyncio.sleep(max(0.0, min(wake) - time.perf_counter()) + 0.001)


@dataclass
class MeasuredLevel:
    """One level as ``kvmap loadgen`` measures it: the load run and the server's
    ``/metrics`` around it (``scrapes[k]``: the end of step phase k; ``timeline``: once a
    second during the run; ``boundaries_s``: the phase boundaries, seconds into it)."""

    run: LoadRun
    before: Scrape | None
    after: Scrape | None
    scrapes: dict[int, Scrape | None]
    timeline: list[dict]
    boundaries_s: list[float]
    timeline_scrapes: list[Scrape] = field(default_factory=list)   # the timeline's pages


async def measure_level(session, endpoint: Endpoint, plan, level: Level, *,
                        duration_s: float | None = None, drain_timeout_s: float = 30.0,
                        cycle: bool = False,
                        at_start: Callable[[], None] | None = None,
                        interval_s: float = 1.0, path: str = "/metrics",
                        headers: dict | None = None, on_done=None) -> MeasuredLevel:
    """Scrape ``/metrics``, run ``plan`` on ``session`` while ``_watch`` scrapes, scrape
    again: exactly what each level of ``run_sweep`` does, so that a benchmark of the
    client (``benchmarks/loadgen_vs_stdlib.py``) measures the command's own path.
    ``at_start`` is called between the first scrape and the first send (a benchmark
    that starts several clients at once waits there). ``interval_s``, ``path`` and
    ``headers`` are the timeline's (the bench's endpoint cells scrape more often, on
    their own path, with their key); ``on_done`` goes to ``run_plan``."""
    before = await scrape(session, endpoint.root, path=path, headers=headers)
    if at_start is not None:
        at_start()
    boundaries = [sum(p.duration_s for p in level.phases[:k])
                  for k in range(1, len(level.phases))]
    pages: dict[int, str | None] = {}
    raw_timeline: list[tuple[float, str]] = []
    t_start = time.perf_counter()
    watcher = asyncio.create_task(_watch(session, endpoint.root, t_start, boundaries,
                                         pages, raw_timeline, interval_s, path, headers))
    try:
        run = await run_plan(endpoint, plan, duration_s=duration_s, on_done=on_done,
                             drain_timeout_s=drain_timeout_s, cycle=cycle, session=session)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    after = await scrape(session, endpoint.root, path=path, headers=headers)
    t_after_s = time.perf_counter() - t_start
    timeline = [] if before is None else [_timeline_point(0.0, before)]
    parsed_pages = []
    for t_s, text in raw_timeline:
        parsed = parse_metrics(text)
        if parsed is not None:
            parsed_pages.append(parsed)
            timeline.append(_timeline_point(t_s, parsed))
    if after is not None:
        timeline.append(_timeline_point(t_after_s, after))
    scrapes = {k: parse_metrics(text) for k, text in pages.items()}
    return MeasuredLevel(run, before, after, scrapes, timeline, boundaries, parsed_pages)
