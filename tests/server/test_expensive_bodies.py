"""Valid but expensive bodies (issue 28): what an accepted request may cost is bounded
before it is admitted, and prompt scoring (``echo`` + ``logprobs``) is an ordinary
request in the one engine -- chunked between the other requests' decode steps, inside
the KV budget, aborted on timeout or disconnect.

The model is SmolLM2-135M's shape with 2 layers and random weights (a vocabulary of
49,152 and a context of 8,192, so that scoring a long prompt costs whole seconds, as it
does on a real model), in fp32. The one timing assertion is generous and calibrated in
the same run: a concurrent stream's largest gap between chunks stays under 3x the
longest engine step plus one second (before, a whole prompt was scored in one call on
the engine thread, which froze every stream for that long)."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from kvmap import SamplingParams

from tests.server.conftest import aborted_count, metric, start_server

SHAPE = dict(model="dummy:smollm2-135m?layers=2", kv="fp32", dtype="fp32",
             num_blocks=None, kv_memory="64MiB", block_size=16,
             max_num_batched_tokens=256, served_model_name="s")
BUDGET = SHAPE["max_num_batched_tokens"]
LONG_PROMPT = [(7 * i) % 40_000 + 3 for i in range(6000)]


@pytest.fixture(scope="module")
def server():
    s = start_server(**SHAPE)
    yield s
    s.close()


class StepLog:
    """Every engine step of the active engine: its items (request id, tokens) and time."""

    def __init__(self, server):
        self.steps: list[tuple[list[tuple[str, int]], float]] = []

        def install(loop):
            engine = loop.active
            run = engine.runner.run

            def timed(items, *args, **kwargs):
                start_s = time.perf_counter()
                try:
                    return run(items, *args, **kwargs)
                finally:
                    self.steps.append(([(r.request_id, n) for r, n in items],
                                       time.perf_counter() - start_s))
            engine.runner.run = timed
            self.uninstall = lambda: setattr(engine.runner, "run", run)
        server.call(install)

    def longest_step_s(self) -> float:
        return max(t for _, t in self.steps)


def stream_times(server, stop: threading.Event, out: dict) -> None:
    """A greedy stream of many tokens; the arrival time of each chunk, until ``stop``."""
    times = []
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 4000, "ignore_eos": True,
            "temperature": 0, "stream": True, "return_token_ids": True}  # a chunk a token
    with server.client() as c, c.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                times.append(time.perf_counter())
            if stop.is_set() and len(times) > 1:
                break
    out["times"] = times


def test_prompt_scoring_is_a_chunked_request_in_the_one_engine(server):
    made = []
    factory = server.loop.factory
    server.loop.factory = lambda *a, **k: made.append(a) or factory(*a, **k)
    log = StepLog(server)
    stop, stream = threading.Event(), {}
    thread = threading.Thread(target=stream_times, args=(server, stop, stream))
    thread.start()
    try:
        time.sleep(0.5)                                 # the stream is decoding
        start_s = time.perf_counter()
        with server.client(timeout=300) as c:
            r = c.post("/v1/completions", json={
                "prompt": LONG_PROMPT, "max_tokens": 2, "temperature": 0, "echo": True,
                "logprobs": 5, "return_token_ids": True})
        end_s = time.perf_counter()
    finally:
        stop.set()
        thread.join(60)
        log.uninstall()
        server.loop.factory = factory
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(LONG_PROMPT) + len(choice["token_ids"])
    assert lp["token_logprobs"][0] is None and all(
        isinstance(v, float) for v in lp["token_logprobs"][1:])
    assert not made and len(server.call(lambda loop: loop.engines)) == 1   # no 2nd engine
    rid = r.json()["id"]
    chunks = [i for i, (items, _) in enumerate(log.steps) if any(q == rid for q, _ in items)]
    assert all(n <= BUDGET for items, _ in log.steps for q, n in items if q == rid)
    assert sum(n for items, _ in log.steps for q, n in items if q == rid) >= len(LONG_PROMPT)
    between = [items for items, _ in log.steps[chunks[0]:chunks[-1]]]
    assert any(q != rid for items in between for q, _ in items)   # the stream ran between
    times = [t for t in stream["times"] if start_s <= t <= end_s]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps and max(gaps) < 3 * log.longest_step_s() + 1.0, (max(gaps),
                                                                 log.longest_step_s())


def test_a_scoring_request_is_aborted_on_timeout_and_on_disconnect():
    """The prompt is in the prefix cache first, so that only its scoring is long: the
    request still runs past the deadline (504) and its work stops there; a client that
    goes away mid-scoring aborts it."""
    s = start_server(**SHAPE, request_timeout_s=1.0)
    try:
        body = {"prompt": LONG_PROMPT, "max_tokens": 1, "temperature": 0}
        # the prompt into the prefix cache, straight through the engine (no deadline)
        s.call(lambda loop: loop.active.add_request(LONG_PROMPT, SamplingParams(),
                                                    request_id="warm"))
        deadline = time.monotonic() + 120
        while not s.call(lambda loop: loop.active.requests["warm"].status.finished):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        s.call(lambda loop: loop.active.requests.pop("warm"))
        for case in ("timeout", "disconnect"):
            before = aborted_count(s)
            with s.client(timeout=300 if case == "timeout" else 0.5) as c:
                try:
                    r = c.post("/v1/completions", json={**body, "echo": True, "logprobs": 1})
                    assert case == "timeout" and r.status_code == 504, r.text
                except httpx.ReadTimeout:
                    assert case == "disconnect"
            deadline = time.monotonic() + 30
            while s.call(lambda loop: len(loop.active.requests)) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            assert s.call(lambda loop: len(loop.active.requests)) == 0, case
            assert aborted_count(s) == before + 1, case
        assert metric(s, "kvmap:request_timeouts_total") >= 1
    finally:
        s.close()
