"""Bounds checked before any work: stop lists (count and length, configurable), the
prompt's size before it is tokenized, tokenization off the event loop, the request
deadline; and the engine's stop check, which decodes only the output's tail."""
from __future__ import annotations

import random
import threading
import time

import pytest

from kvmap.engine.stop_strings import stop_in_tail
from kvmap.model.byte_tokenizer import ByteTokenizer
from tests.server.conftest import held_engine, metric, start_server
from tests.server.test_api import assert_error


@pytest.fixture(scope="module")
def server():
    s = start_server(max_stop_strings=3, max_stop_chars=8, max_prompt_chars=1000)
    yield s
    s.close()


@pytest.mark.parametrize("stop,ok", [(["ab", "cd", "ef"], True), (["a", "b", "c", "d"], False),
                                     ("x" * 8, True), ("x" * 9, False),
                                     (["ok", "y" * 9], False)])
def test_stop_list_is_bounded(server, stop, ok):
    with server.client() as c:
        for path, body in (("/v1/completions", {"prompt": "hi"}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}]})):
            r = c.post(path, json={**body, "max_tokens": 2, "stop": stop})
            if ok:
                assert r.status_code == 200, r.text
            else:
                err = assert_error(r, 400, "stop")
                assert "--max-stop" in err["message"]


def test_default_stop_bounds_are_16_strings_of_256_chars():
    s = start_server()
    try:
        with s.client() as c:
            assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                   "stop": ["s%d" % i for i in range(16)]
                                                   }).status_code == 200
            assert_error(c.post("/v1/completions", json={
                "prompt": "hi", "stop": ["s%d" % i for i in range(17)]}), 400, "stop")
            assert_error(c.post("/v1/completions", json={"prompt": "hi",
                                                          "stop": "z" * 257}), 400, "stop")
    finally:
        s.close()


def test_long_prompt_is_refused_before_tokenizing(server):
    calls = []
    tokenizer = server.loop.tokenizer
    original = tokenizer.encode

    def spy(text, *args, **kwargs):
        calls.append((len(text), threading.current_thread().name))
        return original(text, *args, **kwargs)
    tokenizer.encode = spy
    try:
        with server.client() as c:
            err = assert_error(c.post("/v1/completions", json={"prompt": "x" * 1001}),
                               400, "prompt")
            assert "1001 characters" in err["message"]
            assert_error(c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "y" * 2000}]}), 400, "messages")
            assert not calls                       # never reached the tokenizer
            assert c.post("/v1/completions", json={"prompt": "hello",
                                                   "max_tokens": 1}).status_code == 200
    finally:
        tokenizer.encode = original
    assert calls and all(name.startswith("kvmap-tokenize") for _, name in calls)


def test_request_timeout_while_the_engine_is_held():
    """The engine thread is held, so nothing can finish: the client still gets a 504
    at the deadline, not a hang, and the next request succeeds."""
    s = start_server(request_timeout_s=0.5)
    try:
        with held_engine(s):
            with s.client() as c:
                for stream in (False, True):
                    err = assert_error(c.post("/v1/completions", json={
                        "prompt": "hi", "max_tokens": 3, "stream": stream}), 504)
                    assert err["type"] == "TimeoutError"
        with s.client() as c:
            assert c.post("/v1/completions", json={"prompt": "hi",
                                                   "max_tokens": 3}).status_code == 200
        assert metric(s, "kvmap:request_timeouts_total") >= 1
    finally:
        s.close()


def _full_check(tok, ids, stop) -> bool:
    text = tok.decode(ids)
    return any(s in text for s in stop)


@pytest.mark.parametrize("seed", range(6))
def test_tail_stop_check_agrees_with_the_full_text(seed):
    """Token by token, the tail check fires exactly when a stop string first appears in
    the full decoded text (multi-byte characters, empty tokens and all)."""
    rng = random.Random(seed)
    tok = ByteTokenizer()
    text = "".join(rng.choice(["a", "b", "é", "日本", "ab", " ", "\n"]) for _ in range(300))
    ids = tok.encode(text)
    for _ in range(20):                               # tokens that decode to nothing
        ids.insert(rng.randrange(len(ids)), 300)
    for _ in range(5):
        k = rng.randrange(len(text) - 6)
        stop = [text[k:k + rng.randint(1, 5)], "zz"]
        for n in range(1, len(ids) + 1):
            full = _full_check(tok, ids[:n], stop)
            assert stop_in_tail(tok, ids[:n], stop) == full or not full
            if full:
                assert stop_in_tail(tok, ids[:n], stop)
                break


def test_tail_stop_check_decodes_a_bounded_tail():
    class Counting(ByteTokenizer):
        longest = 0

        def decode(self, ids, skip_special_tokens=False):
            Counting.longest = max(Counting.longest, len(ids))
            return super().decode(ids, skip_special_tokens)
    tok = Counting()
    ids = tok.encode("abc" * 2000)
    for n in range(1, len(ids) + 1):
        assert not stop_in_tail(tok, ids[:n], ["xyz", "q" * 10])
    assert Counting.longest <= 64                     # not the 6,000-token output


# ---- every list and size of a body is bounded before admission (issue 28) ---------------
def _annotation_fields(model) -> list[str]:
    """Fields of a protocol model (and its nested models) that hold a list, a dict or
    a free string, by name."""
    import typing
    from pydantic import BaseModel
    out = []
    for name, info in model.model_fields.items():
        text = str(info.annotation)
        if any(t in text for t in ("list", "dict", "str")):
            out.append(name)
        for arg in typing.get_args(info.annotation) or (info.annotation,):
            for inner in typing.get_args(arg) or (arg,):
                if isinstance(inner, type) and issubclass(inner, BaseModel) \
                        and inner is not model:
                    out += _annotation_fields(inner)
    return out


def test_every_list_and_string_of_a_body_names_its_bound():
    from kvmap.server.limits import BODY_BOUNDS
    from kvmap.server.protocol import (ChatCompletionRequest, CompletionRequest,
                                       DetokenizeRequest, TokenizeRequest)
    fields = {f for m in (CompletionRequest, ChatCompletionRequest, TokenizeRequest,
                          DetokenizeRequest) for f in _annotation_fields(m)}
    assert "stop_token_ids" in fields and "messages" in fields
    assert fields <= set(BODY_BOUNDS), sorted(fields - set(BODY_BOUNDS))


def test_stop_token_ids_messages_salt_and_detokenize_are_bounded():
    s = start_server(max_stop_token_ids=4, max_messages=3)
    try:
        with s.client() as c:
            ok = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                 "stop_token_ids": [5, 6, 7, 8]})
            assert ok.status_code == 200, ok.text
            err = assert_error(c.post("/v1/completions", json={
                "prompt": "hi", "stop_token_ids": list(range(5))}), 400, "stop_token_ids")
            assert "--max-stop-token-ids" in err["message"]
            msgs = [{"role": "user", "content": "a"}] * 2
            assert c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}
                          ).status_code == 200
            parts = [{"role": "user", "content": [{"type": "text", "text": "t"}] * 2}]
            for body in ({"messages": msgs * 2}, {"messages": parts * 2}):
                assert_error(c.post("/v1/chat/completions", json=body), 400, "messages")
                assert_error(c.post("/tokenize", json=body), 400, "messages")
            assert_error(c.post("/v1/completions", json={"prompt": "hi",
                                                          "cache_salt": "s" * 257}),
                         400, "cache_salt")
            assert_error(c.post("/detokenize", json={"tokens": [1] * 513}), 400, "tokens")
    finally:
        s.close()


def test_stop_token_ids_are_a_set_for_the_engine():
    from kvmap import SamplingParams
    params = SamplingParams(stop_token_ids=[3, 1, 3])
    assert params.stop_token_ids == frozenset({1, 3})
    assert isinstance(params.stop_token_ids, frozenset)


def test_tokenizer_queue_is_bounded():
    """With the worker threads busy and ``max_tokenizer_queue`` jobs waiting, the next
    request is a 503 at once, not a place in an unbounded queue."""
    s = start_server(max_tokenizer_queue=1)
    gate, entered = threading.Event(), threading.Event()
    tokenizer = s.loop.tokenizer
    original = tokenizer.encode

    def slow(text, *args, **kwargs):
        entered.set()
        gate.wait(30)
        return original(text, *args, **kwargs)
    tokenizer.encode = slow
    try:
        first = {}
        thread = threading.Thread(target=lambda: first.update(r=s.client().post(
            "/v1/completions", json={"prompt": "hi", "max_tokens": 1})))
        thread.start()
        assert entered.wait(10)
        with s.client() as c:
            err = assert_error(c.post("/v1/completions", json={"prompt": "ho"}), 503)
            assert "tokenizer queue is full" in err["message"]
        gate.set()
        thread.join(30)
        assert first["r"].status_code == 200
    finally:
        gate.set()
        tokenizer.encode = original
        s.close()
