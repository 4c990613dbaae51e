"""API fuzzing: schemathesis generates requests from the server's own OpenAPI schema,
valid ones and invalid ones, for every operation; none may get a 5xx, and every 4xx has
the error shape. The test counts the requests it sent and requires at least 1,000.

It found two bodies that killed the engine loop through the sampler (``temperature``
and ``top_p`` of 5e-324: NaN probabilities); the server now floors both as vLLM does.

A streaming client runs beside the fuzzer and must keep completing its streams; at the
end the pool passes ``check_integrity()`` with no request left in the engine.

Generation is capped with the server's ``max_tokens_limit`` (4 tokens) so that the
tiny model answers each valid request in milliseconds.
"""
from __future__ import annotations

import threading

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.server.conftest import start_server

# examples per (operation, mode); GET endpoints without parameters need few
EXAMPLES = {"POST /v1/completions": 220, "POST /v1/chat/completions": 160,
            "POST /tokenize": 90, "POST /detokenize": 70}
DEFAULT_EXAMPLES = 15
MIN_REQUESTS = 1000


def stream_until(server, stop: threading.Event, finished: list) -> None:
    """A well-behaved streaming client beside the fuzzer: each of its streams must
    complete (finish reason, then [DONE]) however hostile the other traffic is."""
    with server.client() as c:
        while not stop.is_set():
            r = c.post("/v1/completions", json={"prompt": [3, 4, 5], "max_tokens": 4,
                                                "ignore_eos": True, "stream": True})
            events = [line for line in r.text.split("\n\n") if line.strip()]
            ok = r.status_code == 200 and events[-1] == "data: [DONE]" \
                and '"finish_reason": "length"' in events[-2]
            finished.append(r.text if not ok else None)


def test_fuzz_no_server_errors():
    server = start_server(max_tokens_limit=4)
    sent: list[tuple[str, int]] = []
    session = requests.Session()
    stop, finished = threading.Event(), []
    streamer = threading.Thread(target=stream_until, args=(server, stop, finished))
    streamer.start()
    try:
        schema = schemathesis.openapi.from_dict(server.app.openapi())
        for result in schema.get_all_operations():
            operation = result.ok()
            n = EXAMPLES.get(operation.label, DEFAULT_EXAMPLES)
            modes = ([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
                     if operation.method.upper() == "POST" else [GenerationMode.POSITIVE])
            for mode in modes:
                @settings(max_examples=n, deadline=None, database=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
                @given(case=operation.as_strategy(generation_mode=mode))
                def fuzz(case):
                    response = case.call(base_url=server.url, session=session, timeout=30)
                    sent.append((operation.label, response.status_code))
                    assert response.status_code < 500, (case.body, response.text)
                    if 400 <= response.status_code < 500:
                        error = response.json()["error"]
                        assert set(error) == {"message", "type", "param", "code"}
                        assert error["code"] == response.status_code

                fuzz()
        with server.client() as c:
            assert c.get("/health").status_code == 200     # the engine loop survived
        stop.set()
        streamer.join(60)
        assert not streamer.is_alive() and finished        # the stream kept completing
        assert [f for f in finished if f is not None] == []
        assert server.call(lambda loop: (loop.active.check_integrity(),
                                         len(loop.active.requests))[1]) == 0
    finally:
        stop.set()
        server.close()
    statuses = sorted({s for _, s in sent})
    ok = sum(1 for _, s in sent if s == 200)
    print(f"fuzz: {len(sent)} requests, statuses {statuses}, {ok} answered 200")
    assert len(sent) >= MIN_REQUESTS
    assert ok >= 100        # the fuzzer reached the engine, not only the validator
