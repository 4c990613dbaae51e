"""The stdlib reference client beside the asyncio client: the same requests, the same
tokens back, the same metrics from both (what does not depend on timing), and the
client CPU time every load run records."""
from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
import pytest

from kvmap.loadgen.client import Endpoint
from kvmap.loadgen.results import load_metrics
from kvmap.loadgen.runner import open_session, run_plan
from kvmap.loadgen.schedule import Level, make_plan
from stdlib_client import run_reference         # benchmarks/ (tests/loadgen/conftest.py)
from kvmap.workloads.spec import WorkloadRequest


def _requests(n, max_tokens=4):
    return [WorkloadRequest(f"r{i}", f"prompt number {i}", max_tokens) for i in range(n)]


def _both(endpoint, requests, concurrency=4):
    plan = make_plan(requests, Level(concurrency=concurrency))
    return (asyncio.run(run_plan(endpoint, plan)),
            run_reference(endpoint, requests, concurrency))


def _tokens(run):
    return {s.request.request_id: s.result.num_output_tokens for s in run.sent}


def test_both_clients_send_the_same_bodies(fake_server):
    server = fake_server(ttft_s=0.01, itl_s=0.002)
    endpoint = Endpoint(server.url, "fake-model")
    requests = _requests(10, max_tokens=5)
    aio, ref = _both(endpoint, requests)
    bodies = [repr(sorted(b.items())) for b in server.requests]
    assert len(bodies) == 20
    assert Counter(bodies[:10]) == Counter(bodies[10:])      # same bodies, same count
    first_wave = {r.prompt for r in requests[:4]}              # in flight at once: any order
    assert {b["prompt"] for b in server.requests[:4]} == first_wave
    assert {b["prompt"] for b in server.requests[10:14]} == first_wave
    assert _tokens(aio) == _tokens(ref) == {r.request_id: 5 for r in requests}
    for run in (aio, ref):
        m = load_metrics(run.sent, run.t0_s, run.duration_s)
        assert m["num_completed"] == 10 and m["num_output_tokens"] == 50
        assert m["num_content_chunks"] == 50
        assert 0 < run.client_cpu_s and 0 < run.client_cpu_share


def test_closed_loop_reuses_its_connections(fake_server):
    """After ``[DONE]`` the stream's end is read, so a connection serves the next request
    instead of being closed and a new one opened for each."""
    server = fake_server(ttft_s=0.005, itl_s=0.001, done_tail_s=0.05)
    endpoint = Endpoint(server.url, "fake-model")
    created = []

    async def go():
        trace = aiohttp.TraceConfig()

        async def on_create(session, ctx, params):
            created.append(1)
        trace.on_connection_create_end.append(on_create)
        async with aiohttp.ClientSession(trace_configs=[trace],
                                         connector=aiohttp.TCPConnector(limit=0)) as s:
            return await run_plan(endpoint, make_plan(_requests(12), Level(concurrency=3)),
                                  session=s)
    run = asyncio.run(go())
    assert all(s.result.error_kind is None for s in run.sent) and len(run.sent) == 12
    assert len(created) == 3


def test_open_session_has_no_connection_limit():
    async def go():
        async with open_session(Endpoint("http://127.0.0.1:1", "m")) as s:
            return s.connector.limit
    assert asyncio.run(go()) == 0


def test_reference_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="concurrency"):
        run_reference(Endpoint("http://127.0.0.1:1", "m"), _requests(1), 0)


@pytest.mark.slow
def test_same_requests_and_tokens_against_kvmap_serve(kvmap_serve):
    """The embedded model served by ``kvmap serve``: 16 requests at concurrency 4, each
    client's requests are the same and each gets back exactly its max_tokens."""
    from kvmap.loadgen import prompts
    server = kvmap_serve("--dtype", "auto")   # the fast dtype of this class
    import json
    import urllib.request
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    endpoint = Endpoint(server.url, model)
    spec = prompts.workload_spec("throughput", None, prompt_tokens=64, output_tokens=16)
    requests = prompts.build(spec, prompts.load_tokenizer("smollm2"), 16)
    aio, ref = _both(endpoint, requests)
    for run in (aio, ref):
        assert sorted(s.request.prompt for s in run.sent) == sorted(r.prompt for r in requests)
        assert all(s.result.error_kind is None for s in run.sent)
    assert _tokens(aio) == _tokens(ref) == {r.request_id: r.max_tokens for r in requests}
    prompt_tokens = [{s.request.request_id: s.result.num_prompt_tokens for s in run.sent}
                     for run in (aio, ref)]
    assert prompt_tokens[0] == prompt_tokens[1]
    ma, mr = (load_metrics(r.sent, r.t0_s, r.duration_s) for r in (aio, ref))
    assert ma["num_output_tokens"] == mr["num_output_tokens"] == sum(r.max_tokens
                                                                      for r in requests)
    assert ma["num_content_chunks"] == mr["num_content_chunks"]
