"""How many requests the server serves at once, counted on requests, not sockets.

uvicorn's own ``limit_concurrency`` counts open *connections*, and a connection counts
from its first byte -- before its headers are complete, before the API key is checked.
Sockets that send half a request and wait (issue 38: 90 of them against a limit of 80)
then made ``/health`` and every authorized request a 503 for as long as they were held.

Here a request is counted when it reaches the app: its headers are complete (an
unfinished header block is closed by ``header_timeout.py``), and it passed the access
check (``AccessMiddleware`` runs outside this one: a request without the key is a 401
and holds no place). ``/health`` and ``/metrics`` are never counted nor refused: a probe
or a scrape must answer while the server is full. Past the limit a request gets a 503
at once, with ``Retry-After``.
"""
from __future__ import annotations

from fastapi.responses import JSONResponse

from kvmap.server.errors import error_body

EXEMPT_PATHS = frozenset({"/health", "/metrics"})
RETRY_AFTER_S = 1


class AdmissionMiddleware:
    """At most ``limit`` requests in flight (None: no limit), ``EXEMPT_PATHS`` aside.
    One event loop runs every call, so the count needs no lock."""

    def __init__(self, app, limit: int | None, on_reject=None):
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit={limit!r} must be an integer >= 1 (or None)")
        self.app = app
        self.limit = limit
        self.in_flight = 0
        self.on_reject = on_reject or (lambda status: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.limit is None \
                or scope.get("path") in EXEMPT_PATHS:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            self.on_reject(503)
            body = error_body(503, f"the server is serving {self.in_flight} requests, its "
                                   f"limit (--limit-concurrency); retry later")
            response = JSONResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_S)})
            return await response(scope, receive, send)
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
