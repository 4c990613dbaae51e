"""Faults stay with their request (issue 28): a fault in one request's sampling (non-finite
logits with temperature > 0) or post-processing (its stop check, its detokenizer) fails
that request alone with a 500 -- no restart, the stream beside it completes with the
reference tokens -- and no 500 body carries the exception's text; a stream that ends in
an error event gets no usage chunk after it; a spent restart budget makes ``kvmap
serve`` exit non-zero for its supervisor. (Requests past ``--limit-concurrency``:
``test_admission.py``.)"""
from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from kvmap.server.engine_faults import RestartBudget
from tests.server.conftest import build_tiny, free_blocks, metric, start_server
from tests.server.test_api import assert_error, sse_events
from tests.server.test_faults import MARKER, PROMPTS, check_pool, reference, stream_ids  # noqa: F401


@pytest.fixture
def server():
    s = start_server()
    yield s
    s.close()


def poison_logits(server, after_tokens: int = 0):
    """The MARKER request's logits become NaN once it has ``after_tokens`` outputs."""
    def install(loop):
        runner = loop.active.runner
        original = runner.run

        def run(items, *args, **kwargs):
            out = original(items, *args, **kwargs)
            out.logits = out.logits.clone()         # (an inference tensor is read-only)
            for row, req in enumerate(out.sampled):
                if req.prompt_token_ids == MARKER and \
                        req.num_tokens - req.num_prompt_tokens >= after_tokens:
                    out.logits[row] = float("nan")
            return out
        runner.run = run
    server.call(install)


def marker_beside_a_stream(server, **body) -> tuple[httpx.Response, dict]:
    results = {}
    thread = threading.Thread(target=stream_ids, args=(server, PROMPTS[1], results))
    thread.start()
    with server.client() as c:
        r = c.post("/v1/completions", json={"prompt": MARKER, "max_tokens": 40,
                                            "ignore_eos": True, **body})
    thread.join(60)
    return r, results


@pytest.mark.parametrize("temperature", [0.8, 0.0])
def test_non_finite_logits_fail_only_their_request(server, reference, temperature):
    total = free_blocks(server)
    poison_logits(server)
    r, results = marker_beside_a_stream(server, temperature=temperature)
    err = assert_error(r, 500)
    assert "failed in the engine" in err["message"] and "incident" in err["message"]
    assert "finite" not in err["message"]              # the text is in the log only
    assert results["ids"] == reference[1]
    assert metric(server, "kvmap:engine_restarts_total") == 0
    assert metric(server, "kvmap:request_failed_total") == 1
    assert free_blocks(server) == total and check_pool(server) == 0


def test_a_stop_check_that_raises_fails_only_its_request(server, reference):
    def install(loop):
        engine = loop.active
        original = engine._check_stop

        def check(req, token):
            if req.prompt_token_ids == MARKER:
                raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
            return original(req, token)
        engine._check_stop = check
    server.call(install)
    r, results = marker_beside_a_stream(server)
    assert_error(r, 500)
    assert results["ids"] == reference[1]
    assert metric(server, "kvmap:engine_restarts_total") == 0 and check_pool(server) == 0


def test_a_detokenizer_that_raises_fails_only_its_request(server, reference, monkeypatch):
    import kvmap.server.publisher as publisher

    class Exploding(publisher.IncrementalDetokenizer):
        def __init__(self, tokenizer, stop=()):
            super().__init__(tokenizer, stop)
            self.explodes = "boom" in stop

        def update(self, ids):
            if self.explodes:
                raise RuntimeError("injected detokenizer fault")
            return super().update(ids)
    monkeypatch.setattr(publisher, "IncrementalDetokenizer", Exploding)
    r, results = marker_beside_a_stream(server, stop=["boom"])
    err = assert_error(r, 500)
    assert "injected" not in err["message"]
    assert results["ids"] == reference[1]
    assert metric(server, "kvmap:engine_restarts_total") == 0 and check_pool(server) == 0
    with server.client() as c:
        assert c.get("/health").status_code == 200


def test_no_usage_chunk_after_an_error_event(server):
    poison_logits(server, after_tokens=3)
    with server.client() as c:
        r = c.post("/v1/completions", json={
            "prompt": MARKER, "max_tokens": 20, "ignore_eos": True, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    errors = [i for i, e in enumerate(events) if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0] == len(events) - 2, events
    assert events[errors[0]]["error"]["code"] == 500
    assert sum(len(e["choices"][0].get("token_ids") or []) for e in events[:errors[0]]) >= 3
    assert not any(isinstance(e, dict) and "usage" in e for e in events)


def run_serve_app(header_timeout_s: float = 10.0, **options):
    """``serve_app`` (what ``kvmap serve`` runs) in a thread, over ``build_tiny(**options)``:
    (engine loop, thread, {"url", "port", "server", "code" once it returned})."""
    from kvmap.server.command import serve_app
    app, loop = build_tiny(**options)
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = {"url": f"http://127.0.0.1:{port}", "port": port}

    def target():
        result["code"] = serve_app(app, loop, "127.0.0.1", port,
                                   header_timeout_s=header_timeout_s,
                                   on_started=lambda s: result.update(server=s))
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not getattr(result.get("server"), "started", False):
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    return loop, thread, result


def test_a_spent_restart_budget_exits_non_zero():
    from kvmap.server.command import ENGINE_GAVE_UP_EXIT
    loop, thread, result = run_serve_app()

    def explode():
        raise RuntimeError("dies for good")
    loop.restarts = RestartBudget(max_restarts=0)
    loop.active.step = explode
    with httpx.Client(base_url=result["url"], timeout=30) as c:
        assert_error(c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}), 503)
    thread.join(30)
    assert not thread.is_alive() and result["code"] == ENGINE_GAVE_UP_EXIT


def test_sampling_a_non_finite_row_gives_an_error_in_its_place():
    """The sampler itself: the bad row becomes a SamplingError, the others are sampled."""
    from kvmap import SamplingParams
    from kvmap.engine import sampler
    from kvmap.request import Request
    reqs = [Request(str(i), [1], SamplingParams(temperature=t), 0.0)
            for i, t in enumerate((0.0, 0.7, 0.7))]
    logits = torch.zeros(3, 8)
    logits[0, 5] = logits[2, 3] = 10.0
    logits[1, 2] = float("inf")
    out = sampler.sample(logits, reqs)
    assert out[0] == 5 and isinstance(out[1], sampler.SamplingError) and out[2] == 3
