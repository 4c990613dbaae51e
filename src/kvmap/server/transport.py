"""HTTP plumbing of the server: the request body limit, Server-Sent Events that notice a
client going away, and the two ways a handler consumes a request's ``Delta``s -- all at
once (``collect``) or as SSE lines (``event_stream``). Either way, a request whose client
disconnects is aborted in the engine (its blocks freed) before the handler returns.
"""
from __future__ import annotations

import asyncio
import json
import logging

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvmap.server.engine_loop import EngineLoop
from kvmap.server.errors import APIError, error_body
from kvmap.server.messages import (Delta, EngineDeadError, RequestFailedError,
                                   RequestTimeoutError)
from kvmap.server.request_stream import RequestStream

log = logging.getLogger("kvmap.server")


class BodyLimitMiddleware:
    """413 for a body over ``max_bytes``: by Content-Length up front, or while reading a
    body sent without one (chunked)."""

    def __init__(self, app, max_bytes: int, on_reject=None):
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject or (lambda: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = error_body(413, f"request body is larger than {self.max_bytes} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = 0
                if length > self.max_bytes:
                    self.on_reject()
                    return await JSONResponse(too_big, 413)(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI passes HTTPExceptions from body reading through as they are
                    raise StarletteHTTPException(413, too_big["error"]["message"])
            return message

        await self.app(scope, limited_receive, send)


class SSEResponse(StreamingResponse):
    """Server-sent events that stop, and close their iterator at once (its ``finally``
    aborts the request), when the client disconnects -- whatever the ASGI version."""

    def __init__(self, content):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})

    async def __call__(self, scope, receive, send):
        disconnected = False

        async def listen(scope_to_cancel):
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    scope_to_cancel.cancel()
                    return

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(listen, tg.cancel_scope)
                try:
                    await self.stream_response(send)
                except OSError:
                    disconnected = True
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()
        if disconnected:
            log.debug("client disconnected mid-stream")


def stream_error_status(loop: EngineLoop, error: Exception) -> int:
    """The HTTP status of a request that ended with ``error`` instead of a finish."""
    if isinstance(error, RequestTimeoutError):
        loop.metrics.timeouts.inc()
        return 504
    return 500 if isinstance(error, RequestFailedError) else 503


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


async def collect(loop: EngineLoop, request: Request, stream: RequestStream
                  ) -> tuple[list[Delta], bool]:
    """All deltas of a non-streaming request, and whether the client went away (the
    request is then aborted). A dead or restarted engine is a 503, a fault pinned on the
    request a 500, the request timeout a 504."""
    deltas: list[Delta] = []
    disconnected = False

    async def wait_disconnect():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    listener = asyncio.ensure_future(wait_disconnect())
    try:
        while True:
            step = asyncio.ensure_future(stream.next())
            await asyncio.wait({step, listener}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                disconnected = True
                break
            delta = step.result()
            deltas.append(delta)
            if delta.finish_reason is not None:
                break
    except (EngineDeadError, RequestFailedError, RequestTimeoutError) as e:
        raise APIError(stream_error_status(loop, e), str(e)) from None
    finally:
        listener.cancel()
        if not stream.finished:
            loop.abort(stream.request_id)
    return deltas, disconnected


async def event_stream(loop: EngineLoop, stream: RequestStream, make_chunk, first_chunks,
                       include_usage: bool, usage_chunk, with_token_ids: bool):
    """SSE lines: ``first_chunks``, one chunk per delta that has text (or token ids
    when asked for, or the finish reason), the usage chunk, ``[DONE]``. A request that
    ends in an error event gets no usage chunk after it (its usage is not known)."""
    last = None
    try:
        for chunk in first_chunks:
            yield sse(chunk)
        while True:
            try:
                delta = await stream.next()
            except (EngineDeadError, RequestFailedError, RequestTimeoutError) as e:
                yield sse(error_body(stream_error_status(loop, e), str(e)))
                last = None
                break
            last = delta
            if delta.text or delta.finish_reason is not None \
                    or (with_token_ids and delta.token_ids):
                yield sse(make_chunk(delta))
            if delta.finish_reason is not None:
                break
        if include_usage and last is not None:
            yield sse(usage_chunk(last))
        yield sse("[DONE]")
    finally:
        if not stream.finished:
            loop.abort(stream.request_id)
