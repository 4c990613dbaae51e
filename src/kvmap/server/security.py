"""Who may talk to the server: an API key (vLLM's ``--api-key``, or ``KVMAP_API_KEY``)
and, on a loopback bind, a Host-header check.

- With a key, every path but ``OPEN_PATHS`` needs ``Authorization: Bearer <key>``
  (``/v1/*``, ``/metrics``, ``/tokenize``, ...); ``/health`` stays open for probes.
- A server bound to a loopback address answers only Host headers naming loopback
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port) or a host in ``allowed_hosts``: a
  web page the user opens cannot re-point its own domain at 127.0.0.1 (DNS rebinding)
  and reach the API with the browser's help.
"""
from __future__ import annotations

import hmac
import logging

from fastapi.responses import JSONResponse

from kvmap.hosts import is_loopback
from kvmap.server.errors import error_body

log = logging.getLogger("kvmap.server")

API_KEY_ENV = "KVMAP_API_KEY"
OPEN_PATHS = frozenset({"/health"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


def host_name(header: str) -> str:
    """``"127.0.0.1:8000"`` -> ``"127.0.0.1"``, ``"[::1]:80"`` -> ``"[::1]"``, lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[:header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_hosts_for(bind_host: str, extra: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The Host names a server bound to ``bind_host`` answers; None: no check (a public
    bind, or ``"*"`` in ``extra``)."""
    if "*" in extra or not is_loopback(bind_host):
        return None
    return LOOPBACK_HOSTS | {host_name(h) for h in extra}


class AccessMiddleware:
    """401 / 403 before anything else runs (the body is not read)."""

    def __init__(self, app, api_key: str | None = None,
                 allowed_hosts: frozenset[str] | None = None, on_reject=None):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.allowed_hosts = allowed_hosts
        self.on_reject = on_reject or (lambda status: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        status, message = self._refusal(scope.get("path", ""), headers)
        if status is None:
            return await self.app(scope, receive, send)
        self.on_reject(status)
        extra = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        response = JSONResponse(error_body(status, message), status, headers=extra)
        return await response(scope, receive, send)

    def _refusal(self, path: str, headers: dict) -> tuple[int | None, str]:
        if self.allowed_hosts is not None:
            host = host_name(headers.get(b"host", b"").decode("latin-1"))
            if host not in self.allowed_hosts:
                return 403, (f"Host header {host!r} is not allowed on this loopback server "
                             f"(allowed: {sorted(self.allowed_hosts)}; see --allowed-hosts)")
        if self.api_key is not None and path not in OPEN_PATHS:
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(),
                                                                       self.api_key):
                return 401, "a valid API key is required: Authorization: Bearer <key>"
        return None, ""
