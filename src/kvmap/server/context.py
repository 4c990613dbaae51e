"""What every route needs: the engine loop, the served name, the limits, and the checks
and conversions they share (model name, sizes, token ids, sampling parameters,
submission). Routes get it with ``Depends(server_context)``.

Tokenization and chat templates run on ``executor`` (worker threads), never on the
event loop: a long prompt must not stall the other requests' streams. The work waiting
for those threads is bounded (``ServerLimits.max_tokenizer_queue``): past it a request
gets a 503 at once instead of a place in an unbounded queue in front of ``--max-queue``.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request

from kvmap.request import SamplingParams
from kvmap.server.engine_loop import EngineLoop
from kvmap.server.errors import APIError
from kvmap.server.limits import ServerLimits
from kvmap.server.messages import (EngineDeadError, QueueFullError, RequestFailedError,
                                   RequestTimeoutError)
from kvmap.server.protocol import Usage
from kvmap.server.request_stream import RequestStream

TOKENIZER_THREADS = 2


@dataclass(frozen=True)
class ServerContext:
    loop: EngineLoop
    model_name: str
    limits: ServerLimits
    cache_salt: str | None = None       # the server's own salt of prefix hashes (secret)
    created: int = field(default_factory=lambda: int(time.time()))
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        TOKENIZER_THREADS, thread_name_prefix="kvmap-tokenize"))
    _slots: threading.BoundedSemaphore | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_slots",
                           threading.BoundedSemaphore(self.limits.max_tokenizer_queue))

    @property
    def tokenizer(self):
        return self.loop.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.loop.model_config.max_position_embeddings

    # ---- checks before any work -----------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist.", "model")

    def check_supported(self, body) -> None:
        bad = body.unsupported() or self.limits.check_lists(body)
        if bad is not None:
            raise APIError(400, bad[1], bad[0])

    def check_text_size(self, num_chars: int, param: str) -> None:
        limit = self.limits.prompt_chars(self.max_model_len)
        if num_chars > limit:
            raise APIError(400, f"{param} holds {num_chars} characters; this server takes at "
                                f"most {limit} (--max-prompt-chars), and the model's context "
                                f"is {self.max_model_len} tokens", param)

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        vocab = self.loop.model_config.vocab_size
        if not ids:
            raise APIError(400, f"{param} is empty (0 tokens)", param)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} in {param} is outside the vocabulary "
                                f"[0, {vocab})", param)
        return ids

    # ---- tokenizer work, off the event loop -------------------------------------------
    def _need_tokenizer(self, param: str, what: str = "tokenizer; send token ids") -> None:
        if self.tokenizer is None:
            raise APIError(400, f"this model has no {what}", param)

    async def off_loop(self, fn, *args):
        """``fn(*args)`` on a worker thread. 503 when ``max_tokenizer_queue`` jobs are
        queued or running already (a job holds its place until it has run, even if its
        client has gone)."""
        if not self._slots.acquire(blocking=False):
            raise APIError(503, f"the tokenizer queue is full "
                                f"({self.limits.max_tokenizer_queue} jobs); retry later")

        def job():
            try:
                return fn(*args)
            finally:
                self._slots.release()
        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, job)
        except BaseException:
            self._slots.release()
            raise
        return await future

    async def encode(self, text: str, param: str, add_special: bool = True) -> list[int]:
        self.check_text_size(len(text), param)
        self._need_tokenizer(param)
        if add_special:
            return await self.off_loop(self.tokenizer.encode, text)
        return await self.off_loop(lambda: self.tokenizer.encode(text, add_bos=False))

    async def decode(self, ids: list[int]) -> str:
        return await self.off_loop(self.tokenizer.decode, ids)

    async def render_chat(self, messages, add_generation_prompt: bool) -> str:
        """The chat template applied to ``messages`` (protocol ``ChatMessage``s)."""
        self._need_tokenizer("messages", "tokenizer/chat template")
        plain = [{"role": m.role, "content": m.text()} for m in messages]
        self.check_text_size(sum(len(m["content"]) + len(m["role"]) for m in plain),
                             "messages")
        try:
            return await self.off_loop(lambda: self.tokenizer.apply_chat_template(
                plain, add_generation_prompt=add_generation_prompt))
        except Exception as e:   # noqa: BLE001 -- a template error is the request's fault
            raise APIError(400, f"the chat template failed on these messages: {e}",
                           "messages") from None

    # ---- sampling and submission ------------------------------------------------------
    def sampling_params(self, body, num_prompt_tokens: int, default_max_tokens: int | None,
                        max_tokens: int | None) -> SamplingParams:
        max_model_len, limit = self.max_model_len, self.limits.max_tokens_limit
        remaining = max_model_len - num_prompt_tokens
        if remaining <= 0:
            raise APIError(400, f"This model's maximum context length is {max_model_len} "
                                f"tokens. However, your prompt has {num_prompt_tokens} "
                                f"tokens.", "prompt")
        if max_tokens is None:
            max_tokens = remaining if default_max_tokens is None \
                else min(default_max_tokens, remaining)
            if limit is not None:
                max_tokens = min(max_tokens, limit)
        elif limit is not None and max_tokens > limit:
            raise APIError(400, f"max_tokens={max_tokens} is above this server's limit "
                                f"of {limit}", "max_tokens")
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

    def cache_salt_of(self, body) -> str | None:
        """The salt of a request's prefix hashes: the server's (``--cache-salt``) and the
        request's own ``cache_salt`` (a tenant's), or None when neither is set."""
        mine, theirs = self.cache_salt, getattr(body, "cache_salt", None)
        if mine is None and theirs is None:
            return None
        return f"{len(mine or '')}:{mine or ''}{theirs or ''}"    # an unambiguous join

    async def submit(self, request_id: str, ids: list[int], params: SamplingParams,
                     prompt: str | None, arrival_s: float,
                     cache_salt: str | None = None) -> RequestStream:
        try:
            return await self.loop.submit(request_id, ids, params, prompt, arrival_s,
                                          cache_salt)
        except (QueueFullError, EngineDeadError) as e:
            raise APIError(503, str(e)) from None
        except RequestTimeoutError as e:
            self.loop.metrics.timeouts.inc()
            raise APIError(504, str(e)) from None
        except RequestFailedError as e:
            raise APIError(500, str(e)) from None
        except ValueError as e:          # the engine's InvalidRequest names its field
            raise APIError(400, str(e), getattr(e, "param", None) or "prompt") from None


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens)


def server_context(request: Request) -> ServerContext:
    """The FastAPI dependency: the context ``create_app`` put on the app."""
    return request.app.state.server
