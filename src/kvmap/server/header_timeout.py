"""A deadline on a request's header block, for ``kvmap serve`` by itself.

uvicorn's h11 protocol times out only an idle keep-alive connection: a client that
sends one header line and waits holds its socket for ever (issue 38's pre-auth
lockout). ``header_timeout_protocol(timeout_s)`` is an ``H11Protocol`` whose connection
is closed when a request's headers are not complete ``timeout_s`` after the connection
opened, or after the first byte of a later request on it. The deadline is absolute, not
reset by each byte: a client that trickles one byte a second gets no more time. Once
the headers are complete the request is the app's (admission, access check, body
limit, request timeout). ``kvmap serve`` passes this class to uvicorn as its ``http``
protocol, whatever HTTP parsers are installed.
"""
from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("kvmap.server")


class HeaderTimeoutProtocol(H11Protocol):
    """``H11Protocol`` with a deadline on each header block (``header_timeout_s``, set
    by :func:`header_timeout_protocol`)."""

    header_timeout_s: float = 10.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:          # type: ignore[override]
        super().connection_made(transport)
        self._watch_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def _watch_headers(self) -> None:
        if not self._awaiting_headers():
            self._stop_deadline()
        elif self._header_deadline is None and (self.cycle is None
                                                or self.conn.trailing_data[0]):
            # a header block started: the connection's first, or a later request's
            # first bytes (an idle keep-alive connection is left to uvicorn's own timer)
            self._header_deadline = self.loop.call_later(self.header_timeout_s,
                                                         self._expire)

    def _stop_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expire(self) -> None:
        self._header_deadline = None
        if self._awaiting_headers():
            log.info("closing a connection whose request headers were not complete "
                     "within %.1f s", self.header_timeout_s)
            self.transport.close()


def header_timeout_protocol(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``)."""
    if not timeout_s > 0:
        raise ValueError(f"header timeout {timeout_s!r} s must be > 0")
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,),
                {"header_timeout_s": float(timeout_s)})
