"""The event-loop side of one request: an asyncio queue fed by the engine thread, read
with a deadline (the server's ``--request-timeout``), so no client waits forever."""
from __future__ import annotations

import asyncio
import time

from kvmap.server.messages import Delta, RequestTimeoutError


class RequestStream:
    """``await stream.next()`` -> ``Delta``; raises what the engine thread sent, or
    ``RequestTimeoutError`` once ``deadline_s`` (``time.monotonic`` clock) has passed."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop,
                 deadline_s: float | None = None):
        self.request_id = request_id
        self.loop = loop
        self.deadline_s = deadline_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    async def get(self):
        """The next raw item (a ``Delta``, an answer, or an exception), within the deadline."""
        if self.deadline_s is None:
            return await self.queue.get()
        remaining_s = self.deadline_s - time.monotonic()
        try:
            return await asyncio.wait_for(self.queue.get(), max(remaining_s, 0.0))
        except asyncio.TimeoutError:
            raise RequestTimeoutError(f"request {self.request_id} ran past the server's "
                                      f"request timeout") from None

    async def next(self) -> Delta:
        item = await self.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finish_reason is not None:
            self.finished = True
        return item
