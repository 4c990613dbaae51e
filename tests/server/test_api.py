"""The OpenAI-compatible endpoints on the tiny model: outputs equal ``LLM.generate`` token
for token, SSE framing, every bad input's status and error shape, disconnects, the queue
bound and a dead engine."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from kvmap import SamplingParams
from kvmap.model.byte_tokenizer import ByteTokenizer
from kvmap.server.engine_faults import RestartBudget
from tests.conftest import make_tiny_llm, random_prompts
from tests.server.conftest import aborted_count, free_blocks, held_engine, start_server

PROMPTS = random_prompts([5, 17, 40], vocab=256, seed=3)


def sse_events(text: str) -> list:
    """Body of an SSE response -> decoded ``data:`` payloads ("[DONE]" kept as text)."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def assert_error(r: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and isinstance(err["message"], str) and err["message"]
    if param != "any":
        assert err["param"] == param, err
    return err


@pytest.fixture(scope="module")
def reference():
    """Greedy outputs of ``LLM.generate`` with the same engine settings as the server."""
    llm = make_tiny_llm()
    params = SamplingParams(max_tokens=24, temperature=0)
    return {i: llm.generate([p], params)[0] for i, p in enumerate(PROMPTS)}


def test_completion_matches_llm_generate(tiny_server, reference):
    decode = ByteTokenizer().decode
    with tiny_server.client() as c:
        for i, prompt in enumerate(PROMPTS):
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                "max_tokens": 24, "temperature": 0,
                                                "return_token_ids": True})
            assert r.status_code == 200, r.text
            body = r.json()
            choice = body["choices"][0]
            ref = reference[i]
            assert choice["token_ids"] == ref.token_ids
            assert choice["text"] == decode(ref.token_ids)
            assert choice["finish_reason"] == ref.finish_reason
            assert body["usage"] == {"prompt_tokens": len(prompt),
                                     "completion_tokens": len(ref.token_ids),
                                     "total_tokens": len(prompt) + len(ref.token_ids)}
            assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
            assert body["prompt_token_ids"] == prompt


def test_streaming_matches_llm_generate(tiny_server, reference):
    decode = ByteTokenizer().decode
    with tiny_server.client() as c:
        for i, prompt in enumerate(PROMPTS):
            r = c.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": True,
                "return_token_ids": True, "stream_options": {"include_usage": True}})
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream")
            events = sse_events(r.text)
            assert events[-1] == "[DONE]"
            usage_chunk = events[-2]
            assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] \
                == len(reference[i].token_ids)
            chunks = events[:-2]
            assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])
            assert chunks[-1]["choices"][0]["finish_reason"] == reference[i].finish_reason
            token_ids = [t for ch in chunks for t in ch["choices"][0]["token_ids"]]
            text = "".join(ch["choices"][0]["text"] for ch in chunks)
            assert token_ids == reference[i].token_ids
            assert text == decode(reference[i].token_ids)
            # a multi-byte character is never split: no chunk but the last ends in U+FFFD
            # unless the model really produced an invalid byte sequence there
            assert len({ch["id"] for ch in chunks}) == 1


def test_stream_without_usage_has_no_usage_chunk(tiny_server):
    with tiny_server.client() as c:
        r = c.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 4,
                                            "stream": True, "temperature": 0})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])


def test_chat_completion_and_stream_agree(tiny_server):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with tiny_server.client() as c:
        full = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 12,
                                                    "temperature": 0, "return_token_ids": True})
        assert full.status_code == 200, full.text
        body = full.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 12,
                                                 "temperature": 0, "stream": True,
                                                 "return_token_ids": True,
                                                 "stream_options": {"include_usage": True}})
    events = sse_events(r.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[0]["object"] == "chat.completion.chunk"
    chunks = [e for e in events[1:-1] if e["choices"]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in chunks)
    ids = [t for e in chunks for t in e["choices"][0]["token_ids"]]
    assert text == body["choices"][0]["message"]["content"]
    assert ids == body["choices"][0]["token_ids"]
    assert events[-2]["usage"] == body["usage"]
    # the prompt is the rendered transcript, as /tokenize renders it
    with tiny_server.client() as c:
        tok = c.post("/tokenize", json={"messages": msgs}).json()
    assert tok["count"] == body["usage"]["prompt_tokens"]


def test_stop_string_is_cut_and_never_streamed(tiny_server, reference):
    decode = ByteTokenizer().decode
    # a 2-character stop string from the middle of a reference output (no U+FFFD in it)
    found = [(i, decode(ref.token_ids), k) for i, ref in reference.items()
             for k in range(2, len(decode(ref.token_ids)) - 2)
             if "\ufffd" not in decode(ref.token_ids)[k:k + 2]]
    assert found, "no reference output has a clean stretch to stop on"
    i, full, k = found[0]
    stop = full[k:k + 2]
    expected = full[:full.find(stop)]
    with tiny_server.client() as c:
        plain = c.post("/v1/completions", json={"prompt": PROMPTS[i], "max_tokens": 24,
                                                "temperature": 0, "stop": stop}).json()
        r = c.post("/v1/completions", json={"prompt": PROMPTS[i], "max_tokens": 24,
                                            "temperature": 0, "stop": [stop], "stream": True})
    assert plain["choices"][0]["text"] == expected
    assert plain["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(e["choices"][0]["text"] for e in sse_events(r.text)[:-1])
    assert streamed == expected


def test_info_endpoints(tiny_server):
    with tiny_server.client() as c:
        assert c.get("/health").status_code == 200
        models = c.get("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
        assert models["data"][0]["max_model_len"] == 512
        assert c.get("/version").json()["version"]
        tok = c.post("/tokenize", json={"prompt": "héllo"}).json()
        assert tok == {"count": 6, "max_model_len": 512,
                       "tokens": list("héllo".encode())}
        assert c.post("/detokenize", json={"tokens": tok["tokens"]}).json() == \
            {"prompt": "héllo"}
        assert c.get("/metrics").headers["content-type"].startswith("text/plain")


BAD_REQUESTS = [
    # (endpoint, body, status, param)
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, -3]}, 400, "prompt.1"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 600}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x" * 600}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"prompt": "hi", "seed": 2**70}, 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": 3}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 1, "stream": True}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "suffix": "x"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 1}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("/v1/completions", {"prompt": "hi", "temperature": "NaN"}, 400, "temperature"),
    ("/v1/completions", [1, 2], 400, None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logprobs": True}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "response_format": {"type": "json_object"}}, 400,
     "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
     "prompt"),
    ("/detokenize", {"tokens": [1, 300]}, 400, "tokens"),
]


@pytest.mark.parametrize("endpoint,body,status,param", BAD_REQUESTS,
                         ids=[f"{e}-{json.dumps(b)[:40]}" for e, b, _, _ in BAD_REQUESTS])
def test_bad_request(tiny_server, endpoint, body, status, param):
    with tiny_server.client() as c:
        err = assert_error(c.post(endpoint, json=body), status, param)
    assert err["type"] == "BadRequestError"


def test_malformed_json_and_wrong_content(tiny_server):
    with tiny_server.client() as c:
        assert_error(c.post("/v1/completions", content=b"{not json",
                            headers={"content-type": "application/json"}), 400)
        assert_error(c.post("/v1/completions", content=b"\xff\xfe",
                            headers={"content-type": "application/json"}), 400)
        assert_error(c.post("/v1/completions", content=b""), 400)


def test_unknown_model_is_404(tiny_server):
    with tiny_server.client() as c:
        for path, body in (("/v1/completions", {"prompt": "hi"}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/tokenize", {"prompt": "hi"})):
            err = assert_error(c.post(path, json={**body, "model": "gpt-5"}), 404, "model")
            assert "gpt-5" in err["message"] and err["type"] == "NotFoundError"


def test_unknown_route_and_method_have_the_error_shape(tiny_server):
    with tiny_server.client() as c:
        assert_error(c.get("/v1/nothing"), 404)
        assert_error(c.get("/v1/completions"), 405)


def test_oversized_body_is_413(tiny_server):
    big = {"prompt": "x" * (5 * 2**20)}          # over the 4 MiB default limit
    with tiny_server.client() as c:
        assert_error(c.post("/v1/completions", json=big), 413)

        def chunks():                              # no Content-Length: chunked upload
            yield b'{"prompt": "'
            for _ in range(5):
                yield b"x" * 2**20
            yield b'"}'
        assert_error(c.post("/v1/completions", content=chunks(),
                            headers={"content-type": "application/json"}), 413)
        assert c.get("/health").status_code == 200


def test_bad_requests_do_not_disturb_others(tiny_server, reference):
    """Good requests in flight while bad ones arrive still return the reference."""
    results = {}

    def good(i):
        with tiny_server.client() as c:
            results[i] = c.post("/v1/completions", json={
                "prompt": PROMPTS[i], "max_tokens": 24, "temperature": 0,
                "return_token_ids": True}).json()["choices"][0]["token_ids"]

    threads = [threading.Thread(target=good, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    with tiny_server.client() as c:
        for endpoint, body, status, _ in BAD_REQUESTS[:15]:
            assert c.post(endpoint, json=body).status_code == status
    for t in threads:
        t.join()
    assert results == {i: reference[i].token_ids for i in range(len(PROMPTS))}


def test_disconnect_mid_stream_frees_blocks_and_counts_abort(tiny_server):
    total = free_blocks(tiny_server)
    before = aborted_count(tiny_server)
    with tiny_server.client() as c:
        with c.stream("POST", "/v1/completions", json={
                "prompt": PROMPTS[2], "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            assert free_blocks(tiny_server) < total        # the request holds blocks
        # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (free_blocks(tiny_server) != total
                                           or aborted_count(tiny_server) == before):
        time.sleep(0.05)
    assert free_blocks(tiny_server) == total
    assert aborted_count(tiny_server) == before + 1
    assert tiny_server.call(lambda loop: (loop.active.check_integrity(),
                                          len(loop.active.requests))[1]) == 0


def test_disconnect_of_non_streaming_request_aborts_it():
    """The client gives up (0.5 s timeout) while the engine thread is held busy for 2 s,
    so the request cannot finish first however fast the machine is; when the engine
    runs again it must abort the request, not serve it."""
    server = start_server()

    try:
        total, before = free_blocks(server), aborted_count(server)
        entered = threading.Event()

        def hold(loop):
            entered.set()
            time.sleep(2.0)

        busy = threading.Thread(target=server.call, args=(hold,))
        busy.start()
        assert entered.wait(10)                # the engine thread is held from here on
        with pytest.raises(httpx.ReadTimeout):
            with server.client(timeout=0.5) as c:
                c.post("/v1/completions", json={"prompt": PROMPTS[2], "max_tokens": 450,
                                                "ignore_eos": True, "temperature": 0})
        busy.join()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (free_blocks(server) != total
                                               or aborted_count(server) == before):
            time.sleep(0.05)
        assert free_blocks(server) == total
        assert aborted_count(server) == before + 1
        assert server.call(lambda loop: len(loop.active.requests)) == 0
    finally:
        server.close()


def test_queue_bound_gives_503():
    """The engine thread is held in a ``call`` so that nothing gets scheduled: the first
    request waits (queue 1/1), the second is refused with 503, and once the engine runs
    again the first completes and new requests are accepted."""
    server = start_server(max_queue=1)
    results = {}

    def first():
        with server.client() as c:
            results["first"] = c.post("/v1/completions", json={"prompt": "hi",
                                                               "max_tokens": 3})
    waiting = threading.Thread(target=first)
    try:
        with held_engine(server):
            waiting.start()
            deadline = time.monotonic() + 10
            while server.loop._num_queued < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            with server.client() as c:
                err = assert_error(c.post("/v1/completions", json={"prompt": "hi",
                                                                   "max_tokens": 2}), 503)
            assert "queue is full" in err["message"] \
                and err["type"] == "ServiceUnavailableError"
        waiting.join(30)
        assert results["first"].status_code == 200
        with server.client() as c:
            assert c.post("/v1/completions", json={"prompt": "hi",
                                                   "max_tokens": 2}).status_code == 200
    finally:
        server.close()


def test_dead_engine_gives_503_on_health_and_requests():
    """An internal fault with the restart budget spent (here: none allowed) leaves the
    loop dead for good: 503 on the request in flight, on /health and on every request
    after. (A fault within the budget restarts the engine: ``test_faults``.)"""
    server = start_server()
    try:
        def explode():
            raise RuntimeError("injected fault")

        def inject(loop):
            loop.restarts = RestartBudget(max_restarts=0)
            loop.active.step = explode
        server.call(inject)
        with server.client() as c:
            r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
            assert_error(r, 503)
            message = r.json()["error"]["message"]      # no exception text in a body
            assert "injected fault" not in message and "incident" in message
            health = assert_error(c.get("/health"), 503)
            assert "injected fault" not in health["message"]
            assert_error(c.post("/v1/completions", json={"prompt": "hi"}), 503)
    finally:
        server.close()
