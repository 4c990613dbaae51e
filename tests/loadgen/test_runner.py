"""The asyncio runner: open and closed loops, conversations, and its count/time bounds."""
from __future__ import annotations

import asyncio
import time

import pytest

from kvmap.loadgen.client import Endpoint
from kvmap.loadgen.runner import run_plan
from kvmap.loadgen.schedule import Level, Plan, make_plan
from kvmap.workloads.spec import WorkloadRequest


def _requests(n, max_tokens=3, **kw):
    return [WorkloadRequest(f"r{i}", "p", max_tokens, **kw) for i in range(n)]


def _run(url, plan, **kw):
    endpoint = Endpoint(url, "fake-model", request_timeout_s=kw.pop("request_timeout_s", 30))
    return asyncio.run(run_plan(endpoint, plan, **kw))


def test_open_loop_sends_on_time(fake_server):
    server = fake_server(ttft_s=0.01, itl_s=0.005)
    plan = Plan(tuple(_requests(5)), (0.0, 0.1, 0.2, 0.3, 0.4), None, (0,) * 5)
    run = _run(server.url, plan)
    assert [s.request.request_id for s in run.sent] == ["r0", "r1", "r2", "r3", "r4"]
    assert all(s.result.error_kind is None for s in run.sent)
    assert all(0 <= lag < 0.05 for lag in run.send_lag_s), run.send_lag_s
    assert 0.4 <= run.duration_s < 1.5 and run.stopped_by == "count"


def test_closed_loop_keeps_n_in_flight(fake_server):
    server = fake_server(ttft_s=0.05, itl_s=0.01)
    run = _run(server.url, make_plan(_requests(12), Level(concurrency=3)))
    assert len(run.sent) == 12 and all(s.result.error_kind is None for s in run.sent)
    assert server.max_in_flight == 3


def test_duration_stops_sending(fake_server):
    server = fake_server(ttft_s=0.0, itl_s=0.0)
    plan = Plan(tuple(_requests(40)), tuple(i * 0.05 for i in range(40)), None, (0,) * 40)
    run = _run(server.url, plan, duration_s=0.5)
    assert 8 <= len(run.sent) <= 11 and run.num_not_sent == 40 - len(run.sent)
    assert run.stopped_by == "duration" and run.duration_s < 1.5


def test_closed_loop_cycles_for_a_duration(fake_server):
    server = fake_server(ttft_s=0.0, itl_s=0.0)
    run = _run(server.url, make_plan(_requests(2), Level(concurrency=2)), duration_s=0.4,
               cycle=True)
    assert len(run.sent) > 4
    ids = [s.request.request_id for s in run.sent]
    assert len(set(ids)) == len(ids) and "r0-r1" in ids


def test_hung_server_cannot_hang_the_run(fake_server):
    server = fake_server(mode="hang", ttft_s=0.0)
    t = time.perf_counter()
    run = _run(server.url, make_plan(_requests(3), Level(concurrency=3)), duration_s=0.3,
               drain_timeout_s=0.3, request_timeout_s=100)
    assert time.perf_counter() - t < 3
    assert run.stopped_by == "drain_timeout"
    assert [s.result.error_kind for s in run.sent] == ["cancelled"] * 3


def test_request_timeout_bounds_a_run_without_duration(fake_server):
    server = fake_server(mode="hang", ttft_s=0.0)
    run = _run(server.url, make_plan(_requests(2), Level(concurrency=1)),
               request_timeout_s=0.3)
    assert [s.result.error_kind for s in run.sent] == ["timeout", "timeout"]


@pytest.mark.parametrize("level", [Level(concurrency=4), "open"])
def test_turns_wait_for_the_previous_turn(fake_server, level):
    server = fake_server(ttft_s=0.05, itl_s=0.01)
    reqs = [WorkloadRequest(f"c{c}-t{t}", "p", 3, conversation_id=f"c{c}", turn=t)
            for c in range(2) for t in range(3)]
    plan = (make_plan(reqs, level) if level != "open" else
            Plan(tuple(reqs), (0.0,) * len(reqs), None, (0,) * len(reqs)))
    run = _run(server.url, plan)
    by_id = {s.request.request_id: s.result for s in run.sent}
    assert len(by_id) == 6
    for c in range(2):
        for t in (1, 2):
            assert by_id[f"c{c}-t{t}"].sent_s >= by_id[f"c{c}-t{t - 1}"].end_s


def test_bad_bounds():
    plan = make_plan(_requests(1), Level(concurrency=1))
    with pytest.raises(ValueError, match="duration_s"):
        _run("http://127.0.0.1:1", plan, duration_s=0)
    with pytest.raises(ValueError, match="cycle"):
        _run("http://127.0.0.1:1", plan, cycle=True)
