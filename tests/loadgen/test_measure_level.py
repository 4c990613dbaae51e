"""``sweep.measure_level``, the path every ``kvmap loadgen`` level takes: the server's
``/metrics`` is read around and during the level, but parsed only outside it, and the
level's first wave of sends is not met by a scrape of its own."""
from __future__ import annotations

import asyncio

from kvmap.loadgen import server_metrics
from kvmap.loadgen.client import Endpoint
from kvmap.loadgen.runner import open_session
from kvmap.loadgen.schedule import Level, make_plan
from kvmap.loadgen.sweep import measure_level
from kvmap.workloads.spec import WorkloadRequest

PAGE = "".join(f'vllm:num_requests_running{{i="{i}"}} 1\n' for i in range(50)) + \
    'kvmap:kv_config_info{kv="int8"} 1\n'


def _measure(server, requests, level):
    endpoint = Endpoint(server.url, "fake-model")

    async def go():
        async with open_session(endpoint) as session:
            return await measure_level(session, endpoint, make_plan(requests, level), level)
    return asyncio.run(go())


def _requests(n, max_tokens):
    return [WorkloadRequest(f"r{i}", f"prompt {i}", max_tokens) for i in range(n)]


def test_pages_are_parsed_outside_the_level(fake_server, monkeypatch):
    server = fake_server(ttft_s=0.05, itl_s=0.05, metrics_text=PAGE)
    parse_times_s = []
    original = server_metrics.Scrape.parse.__func__
    import time

    def timed(cls, text):
        parse_times_s.append(time.perf_counter())
        return original(cls, text)
    monkeypatch.setattr(server_metrics.Scrape, "parse", classmethod(timed))
    measured = _measure(server, _requests(8, 12), Level(concurrency=2))   # ~2.5 s
    run = measured.run
    assert all(s.result.error_kind is None for s in run.sent) and len(run.sent) == 8
    during = [t for t in server.metrics_times_s if run.t0_s < t < run.end_s]
    assert len(during) >= 1                          # the timeline did read the server
    assert not [t for t in parse_times_s if run.t0_s <= t <= run.end_s]
    assert len(parse_times_s) == len(server.metrics_times_s)   # every page parsed once
    assert len(measured.timeline) == len(server.metrics_times_s)
    assert measured.timeline[0]["t_s"] == 0.0 and measured.timeline[0]["kv"] == "int8"
    assert measured.timeline[0]["num_requests_running"] == 50
    assert [p["t_s"] for p in measured.timeline] == sorted(p["t_s"] for p in measured.timeline)


def test_no_scrape_meets_the_first_wave(fake_server):
    """A level shorter than the timeline's interval is read twice: before and after."""
    server = fake_server(ttft_s=0.01, itl_s=0.005, metrics_text=PAGE)
    measured = _measure(server, _requests(4, 4), Level(concurrency=4))
    run = measured.run
    assert len(server.metrics_times_s) == 2
    before, after = server.metrics_times_s
    assert before < run.t0_s and after > run.end_s
    assert [p["t_s"] for p in measured.timeline][0] == 0.0 and len(measured.timeline) == 2
    assert measured.before is not None and measured.after is not None


def test_a_server_without_metrics_gives_an_empty_timeline(fake_server):
    server = fake_server(ttft_s=0.01, itl_s=0.005, metrics_text="not { prometheus")
    measured = _measure(server, _requests(2, 2), Level(concurrency=2))
    assert measured.before is None and measured.after is None and measured.timeline == []
    assert len(measured.run.sent) == 2
