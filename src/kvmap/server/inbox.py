"""Commands from the event loop to the engine thread: one frozen dataclass each,
queued in the loop's inbox and applied between steps."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from kvmap.request import SamplingParams
from kvmap.server.request_stream import RequestStream


@dataclass(frozen=True)
class AddRequest:
    stream: RequestStream
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None
    arrival_s: float
    cache_salt: str | None = None


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class CallInEngine:
    """Run ``fn(engine_loop)`` between steps; its result or exception settles ``future``."""

    fn: Callable
    future: asyncio.Future


Command = AddRequest | AbortRequest | CallInEngine
