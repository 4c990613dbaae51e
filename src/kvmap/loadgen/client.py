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

import aiohttp

from kvmap.loadgen.endpoint import APIS, ERROR_KINDS, Endpoint, RawResult
from kvmap.loadgen.stream import BadStream, StreamError, error_message, read_json, read_stream
from kvmap.workloads.spec import WorkloadRequest

__all__ = ["APIS", "ERROR_KINDS", "Endpoint", "RawResult", "send_request"]


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint,
                       request: WorkloadRequest, result: RawResult) -> RawResult:
    """``_send`` once; again, once, when the server dropped the connection before any
    response (a pooled keep-alive connection it had closed: llama.cpp's server does
    this), from a fresh send time and on a connection of its own (another pooled one may
    be just as stale) -- a request the server never answered is not load it served."""
    await _send(session, endpoint, request, result)
    if result.error_kind == "disconnected" and result.http_status is None \
            and not result.chunk_times_s:
        fresh = RawResult(result.request_id)
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=session.timeout) as own:
            await _send(own, endpoint, request, fresh)
        result.__dict__.update(fresh.__dict__)
    return result


async def _send(session: aiohttp.ClientSession, endpoint: Endpoint,
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
