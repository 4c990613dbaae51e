"""The server on the real embedded SmolLM2-135M: completions and chat, streaming or not,
give exactly what ``LLM.generate`` / ``LLM.chat`` give at temperature 0."""
from __future__ import annotations

import json

import pytest

from kvmap import SamplingParams
from tests.server.conftest import start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_server():
    server = start_server(model=None, kv="auto", dtype="auto", num_blocks=None,
                          block_size=16, max_num_batched_tokens=512,
                          served_model_name="smollm2")
    yield server
    server.close()


def streamed(r) -> tuple[str, list[int], dict]:
    events = [json.loads(b[6:]) for b in r.text.split("\n\n")
              if b.startswith("data: ") and b != "data: [DONE]"]
    chunks = [e for e in events if e["choices"]]
    key = "text" if chunks[0]["object"] == "text_completion" else None

    def text_of(e):
        c = e["choices"][0]
        return c["text"] if key else c.get("delta", {}).get("content", "")
    ids = [t for e in chunks for t in e["choices"][0].get("token_ids") or []]
    return "".join(text_of(e) for e in chunks), ids, events[-1].get("usage")


def test_completion_equals_llm_generate(real_server, real_llm):
    prompt = "The capital of France is"
    ref = real_llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0))[0]
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "return_token_ids": True}
    with real_server.client() as c:
        full = c.post("/v1/completions", json=body).json()
        stream = c.post("/v1/completions", json={**body, "stream": True,
                                                 "stream_options": {"include_usage": True}})
    assert full["choices"][0]["token_ids"] == ref.token_ids
    assert full["choices"][0]["text"] == ref.text
    text, ids, usage = streamed(stream)
    assert (text, ids) == (ref.text, ref.token_ids)
    assert usage["completion_tokens"] == len(ref.token_ids)


def test_chat_equals_llm_chat(real_server, real_llm):
    messages = [{"role": "user", "content": "Name three primary colours."}]
    ref = real_llm.chat(messages, SamplingParams(max_tokens=40, temperature=0))[0]
    body = {"messages": messages, "max_tokens": 40, "temperature": 0,
            "return_token_ids": True}
    with real_server.client() as c:
        full = c.post("/v1/chat/completions", json=body).json()
        stream = c.post("/v1/chat/completions", json={**body, "stream": True})
    assert full["choices"][0]["message"]["content"] == ref.text
    assert full["choices"][0]["token_ids"] == ref.token_ids
    assert full["choices"][0]["finish_reason"] == ref.finish_reason
    text, ids, _ = streamed(stream)
    assert (text, ids) == (ref.text, ref.token_ids)
