"""The streaming client against the fake server: timing, usage, and every failure kind."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kvmap.loadgen.client import Endpoint, RawResult, send_request
from kvmap.workloads.spec import WorkloadRequest


def _send(url, request=None, **endpoint_kw) -> RawResult:
    request = request or WorkloadRequest("r0", "hello there", max_tokens=5)
    endpoint = Endpoint(url, "fake-model", **endpoint_kw)

    async def go():
        async with aiohttp.ClientSession() as session:
            return await send_request(session, endpoint, request, RawResult("r0"))
    return asyncio.run(go())


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_stream_timing_and_usage(fake_server, api):
    server = fake_server(ttft_s=0.05, itl_s=0.02)
    r = _send(server.url, api=api)
    assert r.error_kind is None, r.error
    assert len(r.chunk_times_s) == 5
    assert r.num_output_tokens == 5 and r.num_prompt_tokens == 7
    assert r.finish_reason == "length"
    assert r.output_text == "t0 t1 t2 t3 t4 "
    # the server sleeps 50 ms before the first chunk and 20 ms between chunks; the
    # upper bounds leave room for a loaded machine
    ttft = r.chunk_times_s[0] - r.sent_s
    assert 0.05 <= ttft < 0.05 + 0.25
    gaps = sorted(b - a for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:]))
    assert 0.015 <= gaps[len(gaps) // 2] and gaps[-1] < 0.02 + 0.25, gaps
    assert r.end_s >= r.chunk_times_s[-1]
    body = server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 5
    assert ("prompt" in body) == (api == "completions")
    assert ("messages" in body) == (api == "chat")


def test_request_options_off(fake_server):
    server = fake_server(ttft_s=0.0, itl_s=0.0)
    r = _send(server.url, include_usage=False, ignore_eos=False)
    assert r.error_kind is None
    assert r.num_output_tokens is None          # no usage asked, none given
    assert "stream_options" not in server.requests[0]
    assert "ignore_eos" not in server.requests[0]


def test_no_usage_chunk(fake_server):
    r = _send(fake_server(mode="no_usage", ttft_s=0, itl_s=0).url)
    assert r.error_kind is None and r.num_output_tokens is None
    assert len(r.chunk_times_s) == 5


def test_multi_token_chunks(fake_server):
    r = _send(fake_server(mode="multi", ttft_s=0, itl_s=0).url)
    assert r.error_kind is None
    assert len(r.chunk_times_s) == 3 and r.num_output_tokens == 5


def test_chat_role_preamble_is_not_the_first_token(fake_server):
    r = _send(fake_server(mode="preamble", ttft_s=0.08, itl_s=0).url, api="chat")
    assert r.error_kind is None and len(r.chunk_times_s) == 5
    assert r.chunk_times_s[0] - r.sent_s >= 0.08


def test_non_streaming(fake_server):
    r = _send(fake_server(ttft_s=0.01, itl_s=0.0).url, stream=False)
    assert r.error_kind is None
    assert r.chunk_times_s == [] and r.num_output_tokens == 5
    assert r.end_s - r.sent_s >= 0.01 and r.output_text.startswith("t0")


@pytest.mark.parametrize("mode, kind, status", [
    ("http_400", "http_4xx", 400), ("http_500", "http_5xx", 500),
    ("bad_json", "bad_stream", 200), ("stream_error", "stream_error", 200),
    ("cut", "disconnected", 200), ("long_line", "bad_stream", 200),
    ("choices_dict", "bad_stream", 200), ("choices_int", "bad_stream", 200)])
def test_failure_kinds(fake_server, mode, kind, status):
    r = _send(fake_server(mode=mode, ttft_s=0, itl_s=0).url)
    assert r.error_kind == kind, (r.error_kind, r.error)
    assert r.http_status == status
    if mode.startswith("http"):
        assert f"fake {status}" in r.error


@pytest.mark.parametrize("mode", ["choices_dict", "choices_int"])
def test_non_list_choices_fail_a_non_streaming_request(fake_server, mode):
    r = _send(fake_server(mode=mode, ttft_s=0, itl_s=0).url, stream=False)
    assert r.error_kind == "bad_stream" and "choices" in r.error


def test_hung_server_times_out(fake_server):
    r = _send(fake_server(mode="hang", ttft_s=0).url, request_timeout_s=0.5)
    assert r.error_kind == "timeout"
    assert len(r.chunk_times_s) == 1 and "1 chunks" in r.error


def test_connect_error():
    import socket
    with socket.socket() as s:                  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = _send(f"http://127.0.0.1:{port}")
    assert r.error_kind == "connect" and r.http_status is None


def test_bad_endpoint_values():
    with pytest.raises(ValueError, match="http"):
        Endpoint("localhost:8000", "m")
    with pytest.raises(ValueError, match="api"):
        Endpoint("http://x", "m", api="embeddings")
    with pytest.raises(ValueError, match="request_timeout_s"):
        Endpoint("http://x", "m", request_timeout_s=0)
    assert Endpoint("http://h:1/v1/", "m").url == "http://h:1/v1/completions"
    assert Endpoint("http://h:1", "m", api="chat").url == "http://h:1/v1/chat/completions"


def test_tokens_without_text_are_timed_by_the_finish_chunk(fake_server):
    server = fake_server(ttft_s=0.0, itl_s=0.0)
    # every token decodes to nothing: only the finish chunk has a finish_reason
    import json as _json

    async def silent(resp, body, chat, n):
        await resp.write(b'data: {"choices": [{"index": 0, "text": "", '
                         b'"finish_reason": "length"}]}\n\n')
        if body.get("stream_options"):
            await resp.write(("data: " + _json.dumps({"choices": [], "usage": {
                "prompt_tokens": 3, "completion_tokens": n}}) + "\n\n").encode())
        await resp.write(b"data: [DONE]\n\n")
    server._stream = silent
    r = _send(server.url)
    assert r.error_kind is None and len(r.chunk_times_s) == 1 and r.num_output_tokens == 5
    r = _send(server.url, include_usage=False)
    assert r.error_kind == "no_output"


def test_sse_events_from_lines():
    from kvmap.loadgen.stream import SSE
    sse = SSE()
    lines = [b": keep-alive\n", b"event: message\r\n", b"data: {\"a\":\n", b"data:1}\r\n",
             b"\n", b"data: [DONE]\n", b"\n", b"\n"]
    events = [e for e in (sse.feed(line) for line in lines) if e is not None]
    assert events == ['{"a":\n1}', "[DONE]"]
    sse.feed(b"data: tail\n")
    assert sse.flush() == "tail" and sse.flush() is None
