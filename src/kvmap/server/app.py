"""The FastAPI app: OpenAI-compatible endpoints over an ``EngineLoop``.

``create_app(loop, model_name, ...)`` returns an ASGI app; its lifespan starts the
engine thread and stops it on shutdown (an ASGI transport that skips the lifespan must
call ``loop.start()`` itself). Tests run it in-process, on uvicorn in a thread
(``tests/server/conftest.py``). The routes live in ``routes/`` (``/v1/completions``,
``/v1/chat/completions`` -- both with SSE streaming --, ``/v1/models``, ``/version``,
``/health``, ``/metrics``, ``/tokenize``, ``/detokenize``); this module wires them, the
error handlers, and the middleware: access (API key, Host check) outermost, then
admission (requests in flight, ``admission.py``), then the body limit.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import kvmap
from kvmap.server.admission import AdmissionMiddleware
from kvmap.server.context import ServerContext
from kvmap.server.engine_loop import EngineLoop
from kvmap.server.errors import (APIError, describe_validation_errors, error_response,
                                 incident)
from kvmap.server.limits import DEFAULT_MAX_BODY_BYTES, ServerLimits
from kvmap.server.routes import chat, completions, health, models, tokenize
from kvmap.server.security import AccessMiddleware
from kvmap.server.transport import BodyLimitMiddleware

__all__ = ["create_app", "DEFAULT_MAX_BODY_BYTES"]
_COUNTED = (400, 401, 403, 404, 413, 503, 504)       # kvmap:request_rejected{status}


def create_app(loop: EngineLoop, model_name: str, *, limits: ServerLimits | None = None,
               api_key: str | None = None,
               allowed_hosts: frozenset[str] | None = None,
               cache_salt: str | None = None) -> FastAPI:
    """``limits``: what one request may ask (``ServerLimits``, from ``ServerArgs.limits``).
    ``api_key``: required as a Bearer token on every route but ``/health``.
    ``allowed_hosts``: the Host names answered (None: any; see
    ``security.allowed_hosts_for``). ``cache_salt``: the server's secret salt of every
    request's prefix hashes (``kvmap.kv.prefix``)."""
    limits = limits or ServerLimits()
    ctx = ServerContext(loop, model_name, limits, cache_salt)
    metrics = loop.metrics

    def count_rejected(status: int) -> None:
        if status in _COUNTED:
            metrics.rejected.labels(*metrics.labels, str(status)).inc()

    @asynccontextmanager
    async def lifespan(app):
        loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(loop.stop)
            ctx.executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="kvmap OpenAI-compatible server", version=kvmap.__version__,
                  lifespan=lifespan)
    app.state.server = ctx
    for module in (completions, chat, models, health, tokenize):
        app.include_router(module.router)
    _add_error_handlers(app, count_rejected)
    app.openapi = lambda: _openapi_without_422(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes,
                       on_reject=lambda: count_rejected(413))
    app.add_middleware(AdmissionMiddleware, limit=limits.max_concurrent_requests,
                       on_reject=count_rejected)
    app.add_middleware(AccessMiddleware, api_key=api_key, allowed_hosts=allowed_hosts,
                       on_reject=count_rejected)
    return app


def _add_error_handlers(app: FastAPI, count_rejected) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        count_rejected(exc.status)
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        message, param = describe_validation_errors(exc.errors())
        count_rejected(400)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        return error_response(500, incident("internal error", exc))


def _openapi_without_422(app: FastAPI) -> dict:
    """Schema errors are 400 here, not FastAPI's 422: the schema says so."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        app.openapi_schema = schema
    return app.openapi_schema
