"""Text boundaries (issue 38): JSON may carry a lone surrogate (``"\\ud800"``), which no
tokenizer, hash or response body can encode. Every text field of every request body is
checked when the body is read: a 400 naming that field -- never a 500, never another
field's name -- and nothing reaches the engine."""
from __future__ import annotations

import json

import pytest

from tests.server.conftest import tiny_server  # noqa: F401  (a module-scoped server)
from tests.server.test_api import assert_error

LONE = "a\ud800b"
USER = {"role": "user", "content": "hi"}

# (path, body, the parameter the 400 must name)
CASES = [
    ("/v1/completions", {"prompt": LONE}, "prompt"),
    ("/v1/completions", {"prompt": [LONE]}, "prompt.0"),
    ("/v1/completions", {"prompt": "hi", "cache_salt": LONE}, "cache_salt"),
    ("/v1/completions", {"prompt": "hi", "stop": LONE}, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop": ["ok", LONE]}, "stop.1"),
    ("/v1/completions", {"prompt": "hi", "model": LONE}, "model"),
    ("/v1/completions", {"prompt": "hi", "user": LONE}, "user"),
    ("/v1/completions", {"prompt": "hi", "suffix": "\udfff"}, "suffix"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]},
     "messages.0.content"),
    ("/v1/chat/completions", {"messages": [USER, {"role": "user", "content": [
        {"type": "text", "text": "ok"}, {"type": "text", "text": LONE}]}]},
     "messages.1.content.1.text"),
    ("/v1/chat/completions", {"messages": [{"role": LONE, "content": "hi"}]},
     "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{**USER, "name": LONE}]}, "messages.0.name"),
    ("/v1/chat/completions", {"messages": [USER], "cache_salt": "\udc80"}, "cache_salt"),
    ("/v1/chat/completions", {"messages": [USER], "response_format": {"type": LONE}},
     "response_format.type"),
    ("/v1/chat/completions", {"messages": [USER], "stop": [LONE]}, "stop.0"),
    ("/tokenize", {"prompt": LONE}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": LONE}]},
     "messages.0.content"),
    ("/detokenize", {"tokens": [1], "model": LONE}, "model"),
]


def post_raw(server, path: str, body: dict):
    """``body`` as JSON with ``\\udXXX`` escapes, as a hostile client sends it."""
    raw = json.dumps(body)                    # ensure_ascii: lone surrogates escaped
    assert "\\ud" in raw
    with server.client() as c:
        return c.post(path, content=raw.encode(), headers={"content-type":
                                                           "application/json"})


@pytest.mark.parametrize("path,body,param", CASES,
                         ids=[f"{p}:{param}" for p, _, param in CASES])
def test_a_lone_surrogate_is_a_400_naming_its_field(tiny_server, path, body, param):
    err = assert_error(post_raw(tiny_server, path, body), 400, param)
    assert "lone surrogate" in err["message"]


def test_nothing_reached_the_engine_and_it_still_serves(tiny_server):
    for path, body, _ in CASES:
        post_raw(tiny_server, path, body)
    assert tiny_server.call(lambda loop: len(loop.active.requests)) == 0
    with tiny_server.client() as c:
        r = c.post("/v1/completions", json={"prompt": "a ✓ 🙂 b", "max_tokens": 2,
                                            "cache_salt": "tenant ✓"})
        assert r.status_code == 200, r.text
