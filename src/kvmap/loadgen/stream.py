"""Reading an OpenAI-compatible response: SSE events, content chunks, usage, errors.

Used by ``kvmap.loadgen.client.send_request``; fills its ``RawResult`` in place
(``endpoint`` is its ``Endpoint``; only ``endpoint.api`` is read here, and neither is
imported, so that the client can import this module without a cycle). See the
client's docstring for what counts as a content chunk.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from kvmap.loadgen.endpoint import MAX_ERROR_CHARS, Endpoint, RawResult


def error_message(raw: bytes) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body's start."""
    text = raw.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:MAX_ERROR_CHARS]
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        return json.dumps(err)[:MAX_ERROR_CHARS]
    return text.strip()[:MAX_ERROR_CHARS]


def first_choice(obj: dict) -> dict | None:
    """``obj["choices"][0]`` when it is an object; None when there are no choices.
    ``BadStream`` when ``choices`` is not a list (the request fails, the run goes on)."""
    choices = obj.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        raise BadStream(f"choices is a {type(choices).__name__}, not a list: "
                        f"{json.dumps(choices)[:200]}")
    return choices[0] if choices and isinstance(choices[0], dict) else None


def chunk_text(obj: dict, api: str) -> str:
    """The generated text one stream (or response) object carries; "" when none."""
    choice = first_choice(obj)
    if choice is None:
        return ""
    if api == "completions":
        return choice.get("text") or ""
    part = choice.get("delta") or choice.get("message") or {}
    return (part.get("content") or part.get("reasoning_content") or "") \
        if isinstance(part, dict) else ""


def _take_meta(obj: dict, result) -> None:
    """Usage and finish reason, whichever object carries them (the last one wins)."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if isinstance(usage.get("prompt_tokens"), int):
            result.num_prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            result.num_output_tokens = usage["completion_tokens"]
    choice = first_choice(obj)
    if choice is not None and choice.get("finish_reason"):
        result.finish_reason = str(choice["finish_reason"])


class SSE:
    """Server-Sent Events from lines: ``data:`` lines joined until a blank line."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def feed(self, line: bytes) -> str | None:
        """One line in; the data of a finished event out (else None)."""
        text = line.decode("utf-8", errors="replace").rstrip("\r\n")
        if not text:
            return self.flush()
        if text.startswith("data:"):
            value = text[5:]
            self.data.append(value[1:] if value.startswith(" ") else value)
        return None                      # comments (":..."), event:, id:, retry: ignored

    def flush(self) -> str | None:
        if not self.data:
            return None
        data, self.data = "\n".join(self.data), []
        return data


async def read_stream(response: aiohttp.ClientResponse, endpoint,
                       result) -> None:
    sse, done, pieces = SSE(), False, []
    finish_chunk_s = None

    def handle(data: str) -> None:
        nonlocal done, finish_chunk_s
        now = time.perf_counter()
        if data.strip() == "[DONE]":
            done = True
            return
        obj = _json_object(data, "event")
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            raise StreamError(err.get("message", json.dumps(err)) if isinstance(err, dict)
                               else str(err))
        text = chunk_text(obj, endpoint.api)
        if text:
            result.chunk_times_s.append(now)
            pieces.append(text)
        _take_meta(obj, result)
        if result.finish_reason is not None and finish_chunk_s is None:
            finish_chunk_s = now

    try:
        async for line in response.content:
            data = sse.feed(line)
            if data is not None:
                handle(data)
            if done:
                break
    except (LineTooLong, ValueError) as e:     # ValueError: aiohttp before LineTooLong
        raise BadStream(f"an SSE line is over the client's line limit "
                        f"({type(e).__name__})") from None
    if not done:
        data = sse.flush()
        if data is not None:
            handle(data)
    result.end_s = time.perf_counter()
    result.output_text = "".join(pieces)
    if done:
        await _drain(response)
    if not done and result.finish_reason is None:
        raise BadStream("the stream ended without [DONE] or a finish_reason")
    if not result.chunk_times_s and finish_chunk_s is not None \
            and (result.num_output_tokens or 0) > 0:
        result.chunk_times_s.append(finish_chunk_s)      # tokens without text


async def _drain(response: aiohttp.ClientResponse, limit_s: float = 1.0) -> None:
    """Read what follows ``[DONE]`` (the chunked body's end) so that the connection goes
    back to the pool instead of being closed, and the next request of the closed loop
    does not open a new one. A server that keeps the stream open after ``[DONE]`` costs
    at most ``limit_s``; its connection is then closed, as before."""
    try:
        async with asyncio.timeout(limit_s):
            while await response.content.readany():
                pass
    except (TimeoutError, aiohttp.ClientError):
        pass


def _json_object(raw: str | bytes, what: str) -> dict:
    """``raw`` parsed as a JSON object, or ``BadStream`` naming ``what`` it was."""
    try:
        obj = json.loads(raw)
    except ValueError:
        raise BadStream(f"{what} is not JSON: {raw[:200]!r}") from None
    if not isinstance(obj, dict):
        raise BadStream(f"{what} is not a JSON object: {raw[:200]!r}")
    return obj


async def read_json(response: aiohttp.ClientResponse, endpoint,
                     result) -> None:
    raw = await response.read()
    result.end_s = time.perf_counter()
    obj = _json_object(raw, "response")
    result.output_text = chunk_text(obj, endpoint.api)
    _take_meta(obj, result)


class BadStream(Exception):
    pass


class StreamError(Exception):
    pass
