"""The server's fault suite: a fault pinned on one request fails only it (blocks freed,
pool checked) and the next requests succeed; an internal engine fault restarts the
engine over the same weights (counted); nothing submitted while the engine dies hangs;
10x overload of a bounded queue gives 503s and every admitted request completes;
hostile bodies get no 5xx while a concurrent stream completes."""
from __future__ import annotations

import json
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvmap import SamplingParams
from kvmap.server.engine_faults import RestartBudget
from tests.conftest import make_tiny_llm, random_prompts
from tests.server.conftest import free_blocks, metric, start_server
from tests.server.test_api import assert_error, sse_events

PROMPTS = random_prompts([9, 23], vocab=256, seed=11)
MARKER = [201, 202, 203, 204, 205]          # the prompt the injected fault picks out


@pytest.fixture(scope="module")
def reference():
    llm = make_tiny_llm()
    params = SamplingParams(max_tokens=20, temperature=0)
    return [llm.generate([p], params)[0].token_ids for p in PROMPTS]


@pytest.fixture
def server():
    s = start_server()
    yield s
    s.close()


def complete(server, prompt, **extra) -> httpx.Response:
    with server.client() as c:
        return c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 20,
                                               "temperature": 0, "return_token_ids": True,
                                               **extra})


def stream_ids(server, prompt, out: dict) -> None:
    """A streamed greedy completion of ``prompt``; its token ids in ``out["ids"]``."""
    with server.client() as c:
        r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 20,
                                            "temperature": 0, "stream": True,
                                            "return_token_ids": True})
    out["ids"] = [t for e in sse_events(r.text)[:-1] for t in e["choices"][0]["token_ids"]]


def inject_runner_fault(server, error_factory, named: bool = False):
    """The runner raises for any batch that holds the MARKER request (once per step)."""
    def install(loop):
        runner = loop.active.runner
        original = runner.run

        def run(items, *args, **kwargs):
            marked = [r for r, _ in items if r.prompt_token_ids == MARKER]
            if marked:
                error = error_factory()
                if named:
                    error.request_id = marked[0].request_id
                raise error
            return original(items, *args, **kwargs)
        runner.run = run
    server.call(install)


def check_pool(server) -> int:
    """check_integrity() on every engine; the number of requests still held."""
    return server.call(lambda loop: [e.check_integrity() for e in loop.engines]
                       and sum(len(e.requests) for e in loop.engines))


@pytest.mark.parametrize("error", [lambda: RuntimeError("injected"),
                                   lambda: struct.error("unpack requires a buffer"),
                                   lambda: MemoryError()],
                         ids=["RuntimeError", "struct.error", "MemoryError"])
def test_fault_in_one_request_fails_only_it(server, reference, error):
    total = free_blocks(server)
    inject_runner_fault(server, error)
    err = assert_error(complete(server, MARKER), 500)
    assert "failed in the engine" in err["message"]
    assert free_blocks(server) == total and check_pool(server) == 0
    for prompt, ref in zip(PROMPTS, reference):            # the next requests succeed
        assert complete(server, prompt).json()["choices"][0]["token_ids"] == ref
    assert metric(server, "kvmap:request_failed_total") == 1
    assert metric(server, "kvmap:engine_restarts_total") == 0
    with server.client() as c:
        assert c.get("/health").status_code == 200


def test_named_fault_spares_the_requests_beside_it(server, reference):
    """An exception naming its request (as ``PageLost`` does) fails that request alone,
    while another request in the same batches streams on to the reference tokens."""
    inject_runner_fault(server, lambda: RuntimeError("bad block"), named=True)
    results = {}
    thread = threading.Thread(target=stream_ids, args=(server, PROMPTS[1], results))
    thread.start()
    assert_error(complete(server, MARKER, max_tokens=400, ignore_eos=True), 500)
    thread.join(60)
    assert results["ids"] == reference[1]
    assert check_pool(server) == 0


def test_internal_fault_restarts_the_engine(server, reference):
    old = server.call(lambda loop: id(loop.active))

    def explode_once(loop):
        engine, original = loop.active, loop.active.step

        def step():
            engine.step = original
            raise RuntimeError("injected engine fault")
        engine.step = step
    server.call(explode_once)
    err = assert_error(complete(server, PROMPTS[0]), 503)
    assert "restarted" in err["message"] and "incident" in err["message"]
    assert "injected engine fault" not in err["message"]      # the log has it, not the body
    with server.client() as c:
        assert c.get("/health").status_code == 200
    assert metric(server, "kvmap:engine_restarts_total") == 1
    assert server.call(lambda loop: id(loop.active)) != old
    for prompt, ref in zip(PROMPTS, reference):     # same weights: same tokens
        assert complete(server, prompt).json()["choices"][0]["token_ids"] == ref


def test_requests_sent_as_the_engine_dies_never_hang(server):
    def inject(loop):
        loop.restarts = RestartBudget(max_restarts=0)

        def explode():
            raise RuntimeError("dies now")
        loop.active.step = explode
    server.call(inject)
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda i: complete(server, PROMPTS[i % 2]).status_code,
                                 range(48)))
    assert set(statuses) == {503}                  # all answered, none hung (timeout 60 s)
    with server.client() as c:
        assert_error(c.get("/health"), 503)


def test_overload_gives_503_and_every_admitted_request_completes():
    """40 concurrent requests (10x) against a queue of 4."""
    server = start_server(max_queue=4, max_num_seqs=2)
    try:
        total = free_blocks(server)
        with ThreadPoolExecutor(40) as pool:
            responses = list(pool.map(lambda i: complete(
                server, PROMPTS[i % 2], max_tokens=24, ignore_eos=True), range(40)))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses
        for r in responses:
            if r.status_code == 200:
                body = r.json()
                assert len(body["choices"][0]["token_ids"]) == 24
                assert body["choices"][0]["finish_reason"] == "length"
            else:
                assert "queue is full" in r.json()["error"]["message"]
        assert free_blocks(server) == total and check_pool(server) == 0
    finally:
        server.close()


LONE_SURROGATES = [
    ("/v1/completions", {"prompt": "x\ud800"}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "cache_salt": "\udfff"}, "cache_salt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udc00"}]},
     "messages.0.content"),
    ("/tokenize", {"prompt": "\ud83d"}, "prompt"),
]


def hostile_bodies() -> list[tuple[str, bytes]]:
    nested = "[" * 50_000 + "]" * 50_000
    bodies = [
        {"prompt": "hi", "stop": ["s"] * 10_000},
        {"prompt": "hi", "stop": "x" * 100_000},
        {"prompt": "a" * (3 * 2**20)},
        {"prompt": [2**40, 1]}, {"prompt": [-1]}, {"prompt": [[2**63]]},
        {"prompt": list(range(300)) * 40},
        {"prompt": {"nested": {"deeper": [1, 2]}}},
        {"prompt": "hi", "max_tokens": 2**64}, {"prompt": "hi", "max_tokens": 1.5},
        {"prompt": "hi", "temperature": "hot"}, {"prompt": None},
        {"prompt": "hi", "stream_options": {"include_usage": "yes"}, "stream": True},
    ]
    out = [("/v1/completions", json.dumps(b).encode()) for b in bodies]
    out += [("/v1/completions", ('{"prompt": ' + nested + "}").encode()),
            ("/v1/chat/completions", json.dumps({"messages": [
                {"role": "user", "content": "z" * (3 * 2**20)}]}).encode()),
            ("/v1/chat/completions", json.dumps({"messages": [
                {"role": "user", "content": [{"type": "text", "text": "t"}] * 50_000}]
            }).encode()),
            ("/tokenize", json.dumps({"prompt": "q" * (3 * 2**20)}).encode()),
            ("/detokenize", json.dumps({"tokens": [10**30]}).encode())]
    # lone surrogates (issue 38: a 500 before) -- every text field: test_text_fields.py
    out += [(path, json.dumps(body).encode()) for path, body, _ in LONE_SURROGATES]
    return out


def test_hostile_bodies_get_no_5xx_while_a_stream_completes(reference):
    """Beside half-open connections at twice the server's request limit (issue 38)."""
    from tests.server.test_admission import HALF_A_REQUEST
    limit = 8
    server = start_server(max_concurrent_requests=limit)
    stalled = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
               for _ in range(2 * limit)]
    try:
        for s in stalled:
            s.sendall(HALF_A_REQUEST)
        done = {}
        thread = threading.Thread(target=stream_ids, args=(server, PROMPTS[0], done))
        thread.start()
        with server.client() as c:
            for path, body in hostile_bodies():
                r = c.post(path, content=body, headers={"content-type": "application/json"})
                assert 400 <= r.status_code < 500, (path, body[:80], r.status_code,
                                                    r.text[:200])
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        thread.join(60)
        assert done["ids"] == reference[0]
        with server.client() as c:
            assert c.get("/health").status_code == 200
    finally:
        for s in stalled:
            s.close()
        server.close()
