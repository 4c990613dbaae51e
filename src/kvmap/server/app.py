"""The FastAPI app: OpenAI-compatible endpoints over an ``EngineLoop``.

``create_app(loop, model_name, ...)`` returns an ASGI app; its lifespan starts the
engine thread and stops it on shutdown (an ASGI transport that skips the lifespan must
call ``loop.start()`` itself). Tests run it in-process, on uvicorn in a thread
(``tests/server/conftest.py``). Endpoints: ``/v1/completions``, ``/v1/chat/completions``
(both with SSE streaming), ``/v1/models``, ``/health``, ``/metrics``, ``/version``,
``/tokenize``, ``/detokenize``.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import kvmap
from kvmap.server.engine_loop import Delta, EngineDeadError, EngineLoop, QueueFullError
from kvmap.server.errors import APIError, describe_validation_errors, error_response
from kvmap.server.protocol import (ChatCompletionRequest, ChatCompletionResponse,
                                   CompletionRequest, CompletionResponse, DetokenizeRequest,
                                   ErrorResponse, TokenizeRequest)
from kvmap.server.transport import BodyLimitMiddleware, SSEResponse, collect, event_stream

log = logging.getLogger("kvmap.server")

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
COMPLETIONS_DEFAULT_MAX_TOKENS = 16          # OpenAI's and vLLM's default for /v1/completions
_ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 500, 503)}


def create_app(loop: EngineLoop, model_name: str, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_tokens_limit: int | None = None) -> FastAPI:
    """``max_tokens_limit``: the most tokens one request may ask for (more is a 400); a
    request without ``max_tokens`` gets at most this many."""
    metrics = loop.metrics
    tokenizer = loop.tokenizer
    max_model_len = loop.model_config.max_position_embeddings
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(loop.stop)

    app = FastAPI(title="kvmap OpenAI-compatible server", version=kvmap.__version__,
                  lifespan=lifespan)

    # ---- errors ---------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        if exc.status in (400, 404, 413, 503):
            metrics.rejected.labels(*metrics.labels, str(exc.status)).inc()
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        message, param = describe_validation_errors(exc.errors())
        metrics.rejected.labels(*metrics.labels, "400").inc()
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):
        log.exception("internal error")
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    # ---- helpers --------------------------------------------------------------------------
    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(404, f"The model `{name}` does not exist.", "model")

    def check_supported(body) -> None:
        bad = body.unsupported()
        if bad is not None:
            raise APIError(400, bad[1], bad[0])

    def encode(text: str, param: str, add_special: bool = True) -> list[int]:
        if tokenizer is None:
            raise APIError(400, "this model has no tokenizer; send token ids", param)
        return tokenizer.encode(text) if add_special else tokenizer.encode(text, add_bos=False)

    def check_ids(ids: list[int], param: str) -> list[int]:
        vocab = loop.model_config.vocab_size
        if not ids:
            raise APIError(400, f"{param} is empty (0 tokens)", param)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} in {param} is outside the vocabulary "
                                f"[0, {vocab})", param)
        return ids

    def sampling_params(body, num_prompt_tokens: int, default_max_tokens: int | None,
                        max_tokens: int | None):
        remaining = max_model_len - num_prompt_tokens
        if remaining <= 0:
            raise APIError(400, f"This model's maximum context length is {max_model_len} "
                                f"tokens. However, your prompt has {num_prompt_tokens} "
                                f"tokens.", "prompt")
        if max_tokens is None:
            max_tokens = remaining if default_max_tokens is None \
                else min(default_max_tokens, remaining)
            if max_tokens_limit is not None:
                max_tokens = min(max_tokens, max_tokens_limit)
        elif max_tokens_limit is not None and max_tokens > max_tokens_limit:
            raise APIError(400, f"max_tokens={max_tokens} is above this server's limit "
                                f"of {max_tokens_limit}", "max_tokens")
        if num_prompt_tokens + max_tokens > max_model_len:
            raise APIError(400, f"This model's maximum context length is {max_model_len} "
                                f"tokens. However, you requested "
                                f"{num_prompt_tokens + max_tokens} tokens "
                                f"({num_prompt_tokens} in the prompt, {max_tokens} in the "
                                f"completion).", "max_tokens")
        try:
            return body.sampling_params(max_tokens)
        except ValueError as e:
            message = str(e)
            param = message.split("=", 1)[0] if "=" in message.split(" ", 1)[0] else None
            raise APIError(400, message, param) from None

    async def submit(request_id, ids, params, prompt, arrival_s):
        try:
            return await loop.submit(request_id, ids, params, prompt, arrival_s)
        except QueueFullError as e:
            raise APIError(503, str(e)) from None
        except EngineDeadError as e:
            raise APIError(503, str(e)) from None
        except ValueError as e:
            raise APIError(400, str(e), "prompt") from None

    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def sse_response(stream, head: dict, body, first: list, fields) -> SSEResponse:
        """The streamed answer of either route: ``{**head, **fields(delta)}`` per chunk,
        with usage on every chunk and/or a final usage chunk as ``stream_options`` ask."""
        opts = body.stream_options

        def chunk(delta):
            out = {**head, **fields(delta)}
            if opts and opts.continuous_usage_stats:
                out["usage"] = usage(delta.num_prompt_tokens, delta.num_output_tokens)
            return out
        return SSEResponse(event_stream(
            loop, stream, chunk, first, bool(opts and opts.include_usage),
            lambda d: {**head, "choices": [],
                       "usage": usage(d.num_prompt_tokens, d.num_output_tokens)},
            body.return_token_ids))

    # ---- endpoints ------------------------------------------------------------------------
    @app.post("/v1/completions", response_model=CompletionResponse, responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request):
        arrival_s = time.perf_counter()
        check_model(body.model)
        check_supported(body)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, f"prompt holds {len(prompt)} prompts; this server takes "
                                    "one prompt per request", "prompt")
            prompt = prompt[0]
        prompt_text = prompt if isinstance(prompt, str) else None
        ids = check_ids(encode(prompt, "prompt") if isinstance(prompt, str) else list(prompt),
                        "prompt")
        params = sampling_params(body, len(ids), COMPLETIONS_DEFAULT_MAX_TOKENS,
                                 body.max_tokens)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        echo_text = (prompt_text if prompt_text is not None
                     else tokenizer.decode(ids) if tokenizer else "") if body.echo else ""
        stream = await submit(request_id, ids, params, prompt_text, arrival_s)
        head = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                "model": model_name}

        def choice(text, delta: Delta, token_ids=None):
            c = {"index": 0, "text": text, "logprobs": None,
                 "finish_reason": delta.finish_reason, "stop_reason": None}
            if body.return_token_ids:
                c["token_ids"] = token_ids if token_ids is not None else delta.token_ids
            return c

        if body.stream:
            first = []
            if echo_text:
                first.append({**head, "choices": [{"index": 0, "text": echo_text,
                                                   "logprobs": None, "finish_reason": None}]})

            def fields(delta):
                out = {"choices": [choice(delta.text, delta)]}
                if body.return_token_ids and not first_sent[0]:
                    out["prompt_token_ids"] = ids
                    first_sent[0] = True
                return out
            first_sent = [False]
            return sse_response(stream, head, body, first, fields)

        deltas, disconnected = await collect(loop, request, stream)
        if disconnected:                       # aborted; nobody reads this response
            return Response(status_code=499)
        last = deltas[-1]
        token_ids = [t for d in deltas for t in d.token_ids]
        out = {**head, "choices": [choice(echo_text + "".join(d.text for d in deltas), last,
                                          token_ids)],
               "usage": usage(len(ids), last.num_output_tokens)}
        if body.return_token_ids:
            out["prompt_token_ids"] = ids
        return out

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses=_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        arrival_s = time.perf_counter()
        check_model(body.model)
        check_supported(body)
        if tokenizer is None:
            raise APIError(400, "this model has no tokenizer/chat template", "messages")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt)
        except Exception as e:   # noqa: BLE001 -- a template error is the request's fault
            raise APIError(400, f"the chat template failed on these messages: {e}",
                           "messages") from None
        ids = check_ids(tokenizer.encode(prompt), "messages")
        max_tokens = body.max_completion_tokens or body.max_tokens
        params = sampling_params(body, len(ids), None, max_tokens)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        stream = await submit(request_id, ids, params, prompt, arrival_s)
        head = {"id": request_id, "object": "chat.completion.chunk" if body.stream
                else "chat.completion", "created": int(time.time()), "model": model_name}
        echo = messages[-1]["content"] if body.echo and messages[-1]["role"] == "assistant" \
            else ""

        if body.stream:
            role_chunk = {**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                     "content": echo},
                                               "logprobs": None, "finish_reason": None}]}
            if body.return_token_ids:
                role_chunk["prompt_token_ids"] = ids

            def fields(delta):
                c = {"index": 0, "delta": {"content": delta.text} if delta.text else {},
                     "logprobs": None, "finish_reason": delta.finish_reason}
                if body.return_token_ids:
                    c["token_ids"] = delta.token_ids
                return {"choices": [c]}
            return sse_response(stream, head, body, [role_chunk], fields)

        deltas, disconnected = await collect(loop, request, stream)
        if disconnected:                       # aborted; nobody reads this response
            return Response(status_code=499)
        last = deltas[-1]
        c = {"index": 0, "message": {"role": "assistant",
                                     "content": echo + "".join(d.text for d in deltas)},
             "logprobs": None, "finish_reason": last.finish_reason,
             "stop_reason": None}
        if body.return_token_ids:
            c["token_ids"] = [t for d in deltas for t in d.token_ids]
        out = {**head, "choices": [c], "usage": usage(len(ids), last.num_output_tokens)}
        if body.return_token_ids:
            out["prompt_token_ids"] = ids
        return out

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "kvmap",
            "root": model_name, "parent": None, "max_model_len": max_model_len}]}

    @app.get("/health")
    async def health():
        if not loop.alive:
            raise APIError(503, "the engine loop is not running"
                           + (f": {loop.error!r}" if loop.error else ""))
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": kvmap.__version__}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize", responses=_ERRORS)
    async def tokenize(body: TokenizeRequest):
        check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", "prompt")
        if body.messages is not None:
            if tokenizer is None:
                raise APIError(400, "this model has no tokenizer/chat template", "messages")
            try:
                text = tokenizer.apply_chat_template(
                    [{"role": m.role, "content": m.text()} for m in body.messages],
                    add_generation_prompt=body.add_generation_prompt)
            except Exception as e:   # noqa: BLE001
                raise APIError(400, f"the chat template failed: {e}", "messages") from None
            ids = encode(text, "messages")
        else:
            ids = encode(body.prompt, "prompt", body.add_special_tokens)
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids}

    @app.post("/detokenize", responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest):
        check_model(body.model)
        if tokenizer is None:
            raise APIError(400, "this model has no tokenizer", "tokens")
        check_ids(body.tokens, "tokens") if body.tokens else None
        return {"prompt": tokenizer.decode(body.tokens)}

    def openapi_without_422():
        """Schema errors are 400 here, not FastAPI's 422: the schema says so."""
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi_without_422
    if max_body_bytes:
        app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes,
                           on_reject=metrics.rejected.labels(*metrics.labels, "413").inc)
    return app

