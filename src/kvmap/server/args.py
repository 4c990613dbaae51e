"""Every setting of ``kvmap serve``, declared once (as ``kvmap.config.EngineArgs`` for the
engine): ``ServerArgs`` is the per-request limits (``ServerLimits``) plus the server's
own settings. ``kvmap serve``'s options come from its fields' defaults and help
(``kvmap.cli_options.server_options``), ``build_server`` takes one, and the tests build
one from keywords. A bad value raises ValueError naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kvmap.server.limits import DEFAULT_HEADER_TIMEOUT_S, ServerLimits, _setting

REQUEST_MARGIN = 64      # requests beyond the queue bound: tokenize, models, 503s


def default_limit_concurrency(max_queue: int, max_num_seqs: int) -> int:
    """Requests served at once: every request the engine may hold (waiting or running)
    plus ``REQUEST_MARGIN``."""
    return max_queue + max_num_seqs + REQUEST_MARGIN


@dataclass(frozen=True)
class ServerArgs(ServerLimits):
    """The limits, then where and how the server listens (``api_key``: else
    ``$KVMAP_API_KEY``; ``cache_salt``: else ``$KVMAP_CACHE_SALT``; ``allowed_hosts``:
    Host names a loopback bind also answers)."""

    host: str = _setting("127.0.0.1", "Address to bind")
    port: int = _setting(8000, "Port to bind")
    max_queue: int | None = _setting(256, "Requests that may wait for the engine; more "
                                          "get 503.")
    adaptive: str | None = _setting(None, "Adaptive KV policy file (YAML)")
    served_model_name: str | None = _setting(None, "Name in /v1/models (default: the "
                                                   "model id)")
    header_timeout_s: float = _setting(DEFAULT_HEADER_TIMEOUT_S,
                                       "Seconds a request's headers may take; then the "
                                       "connection is closed")
    api_key: str | None = _setting(None, "Require 'Authorization: Bearer KEY' (else "
                                         "$KVMAP_API_KEY)")
    allowed_hosts: tuple[str, ...] = _setting((), "Host header names a loopback server "
                                                  "also answers ('*': any)")
    cache_salt: str | None = _setting(None, "The server's prefix-hash salt (else "
                                            "$KVMAP_CACHE_SALT)")
    log_level: str = _setting("warning", "uvicorn log level")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.port, int) or not 0 < self.port < 65536:
            raise ValueError(f"port={self.port!r} must be in 1..65535")
        if self.max_queue is not None and (not isinstance(self.max_queue, int)
                                           or self.max_queue < 1):
            raise ValueError(f"max_queue={self.max_queue!r} must be an integer >= 1 "
                             f"(or None)")
        if not self.header_timeout_s > 0:
            raise ValueError(f"header_timeout_s={self.header_timeout_s!r} must be > 0")
        if not isinstance(self.allowed_hosts, tuple):
            object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))

    def limits(self, max_num_seqs: int) -> ServerLimits:
        """The per-request limits, ``max_concurrent_requests`` defaulted from the queue
        bound (``default_limit_concurrency``; None with neither)."""
        own = {f.name: getattr(self, f.name) for f in fields(ServerLimits)}
        limits = ServerLimits(**own)
        if limits.max_concurrent_requests is None and self.max_queue is not None:
            limits = replace(limits, max_concurrent_requests=default_limit_concurrency(
                self.max_queue, max_num_seqs))
        return limits
