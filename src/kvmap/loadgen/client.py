"""One request to an OpenAI-compatible server, timed chunk by chunk.

``send_request(session, endpoint, request, result)`` POSTs one ``WorkloadRequest`` to
``/v1/completions`` or ``/v1/chat/completions`` and fills ``result`` (a ``RawResult``)
with raw ``time.perf_counter()`` timestamps -- the send, every content chunk, the end of
the stream -- and with what the server said: usage, finish reason, text. Nothing here
derives a metric; ``kvmap.loadgen.results`` does, with vLLM's definitions.

What is a content chunk: a Server-Sent Event whose first choice carries non-empty
``text`` (completions) or ``delta.content`` / ``delta.reasoning_content`` (chat). A
role-only preamble, a finish-only chunk and the usage chunk are not content. (vLLM's
``benchmark_serving`` times any chunk with choices; skipping empty ones keeps a chat
server's role preamble from passing for a first token.) One exception: a stream whose
tokens decode to no text at all (a byte tokenizer over a larger vocabulary, say) but
that finishes with usage > 0 tokens is timed by its finish chunk, as vLLM would.

Failures never raise; they land in ``result.error_kind``:

    connect       no TCP connection (refused, unreachable, DNS)
    timeout       the request outlived ``endpoint.request_timeout_s`` (a hung server)
    http_4xx      the server refused the request (``http_status``, its error message)
    http_5xx      the server failed it
    stream_error  an ``{"error": ...}`` event inside a 200 stream (vLLM does this)
    bad_stream    a body that is not SSE/JSON, an SSE line over aiohttp's line limit, a
                  ``choices`` that is not a list, or a stream cut without ``[DONE]`` or a
                  finish reason
    disconnected  the connection dropped in the middle
    no_output     a clean response without a single content chunk
    cancelled     the load run's time bound ended it (set by the runner)
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

from kvmap.loadgen.stream import (MAX_ERROR_CHARS, BadStream, StreamError, error_message,
                                   read_json, read_stream)
from kvmap.workloads.spec import WorkloadRequest

APIS = ("completions", "chat")
ERROR_KINDS = ("connect", "timeout", "http_4xx", "http_5xx", "stream_error", "bad_stream",
               "disconnected", "no_output", "cancelled")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to send: the server, the API flavour and the request options.

    ``ignore_eos`` adds vLLM's ``ignore_eos`` extra so each request generates exactly
    ``max_tokens`` (turn it off for servers that reject unknown fields); ``include_usage``
    asks for the final usage chunk (``stream_options.include_usage``); ``stream=False``
    sends non-streaming requests (no TTFT or TBT then, only E2E and usage).
    """

    base_url: str
    model: str
    api: str = "completions"
    stream: bool = True
    include_usage: bool = True
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.base_url!r} must start with http:// or https://")
        if self.api not in APIS:
            raise ValueError(f"api={self.api!r} is not one of {APIS}")
        for name in ("request_timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} must be a number of seconds > 0")

    @property
    def root(self) -> str:
        """The server root: ``http://h:p`` from ``http://h:p``, ``.../v1`` or ``.../v1/``."""
        url = self.base_url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def url(self) -> str:
        return f"{self.root}/v1/{'completions' if self.api == 'completions' else 'chat/completions'}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, request: WorkloadRequest) -> dict:
        """The JSON body for ``request``."""
        body: dict = {"model": self.model, "max_tokens": request.max_tokens,
                      "temperature": self.temperature, "stream": self.stream}
        if self.api == "completions":
            body["prompt"] = request.prompt
        else:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        if self.stream and self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos and request.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass
class RawResult:
    """What one request saw; times are ``time.perf_counter()`` seconds.

    ``chunk_times_s`` holds one time per content chunk (see the module docstring);
    ``end_s`` is when the response was complete (``[DONE]`` read, or the JSON body of a
    non-streaming response). ``num_*_tokens`` come from the server's usage (None when it
    sent none).
    """

    request_id: str
    sent_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    output_text: str = ""
    finish_reason: str | None = None
    http_status: int | None = None
    error_kind: str | None = None
    error: str | None = None

    def fail(self, kind: str, message: str) -> None:
        """Record the first failure (a later one, say a cancel after a timeout, is ignored)."""
        if kind not in ERROR_KINDS:
            raise ValueError(f"error kind {kind!r} is not one of {ERROR_KINDS}")
        if self.error_kind is None:
            self.error_kind, self.error = kind, message[:MAX_ERROR_CHARS]


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint,
                       request: WorkloadRequest, result: RawResult) -> RawResult:
    """Send ``request``, filling ``result`` as the response arrives; returns ``result``.

    Never raises for a server or network problem (see ``ERROR_KINDS``). Bounded by
    ``endpoint.request_timeout_s`` from the send, whatever the server does. A
    cancellation marks the result ``cancelled`` and propagates.
    """
    body = endpoint.body(request)
    try:
        async with asyncio.timeout(endpoint.request_timeout_s):
            result.sent_s = time.perf_counter()
            async with session.post(endpoint.url, json=body,
                                    headers=endpoint.headers()) as response:
                result.http_status = response.status
                if response.status >= 400:
                    message = error_message(await response.content.read(4096))
                    kind = "http_4xx" if response.status < 500 else "http_5xx"
                    result.fail(kind, f"HTTP {response.status}: {message}")
                    result.end_s = time.perf_counter()
                    return result
                if endpoint.stream:
                    await read_stream(response, endpoint, result)
                else:
                    await read_json(response, endpoint, result)
    except TimeoutError:
        result.fail("timeout", f"no complete response within {endpoint.request_timeout_s:g} s"
                    f" ({len(result.chunk_times_s)} chunks received)")
    except aiohttp.ClientConnectorError as e:
        result.fail("connect", f"cannot connect to {endpoint.root}: {e}")
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
            aiohttp.ClientOSError) as e:
        result.fail("disconnected", f"{type(e).__name__}: {e}")
    except StreamError as e:
        result.fail("stream_error", str(e))
    except (BadStream, aiohttp.ClientResponseError, UnicodeDecodeError) as e:
        result.fail("bad_stream", f"{type(e).__name__}: {e}" if not isinstance(e, BadStream)
                    else str(e))
    except aiohttp.ClientError as e:
        result.fail("disconnected", f"{type(e).__name__}: {e}")
    except asyncio.CancelledError:
        result.fail("cancelled", "the load run's time bound ended the request")
        raise
    if result.error_kind is None and endpoint.stream and not result.chunk_times_s:
        result.fail("no_output", "the response had no content chunk")
    if result.error_kind is None and not endpoint.stream and not result.output_text \
            and not result.num_output_tokens:
        result.fail("no_output", "the response had no text")
    return result
