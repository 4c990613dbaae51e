"""``kvmap serve``: the OpenAI-compatible server on uvicorn.

The process exits with ``ENGINE_GAVE_UP_EXIT`` when the engine loop gives up (faults past
the restart budget), for a supervisor to restart it, instead of answering 503 forever.
``--limit-concurrency`` bounds the *requests* served at once (``admission.py``; default:
what the queue bound can admit plus a margin, ``args.default_limit_concurrency``), counted
once a request's headers are complete and its API key checked -- not uvicorn's count of
open sockets, which half-open connections fill before any key is seen (issue 38).
``/health`` and ``/metrics`` are never refused by it. A header block not complete within
``--header-timeout`` closes its connection (``header_timeout.py``).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace

import typer

from kvmap.cli_options import dataclass_options, engine_options
from kvmap.config import EngineArgs
from kvmap.kv.redact import redact_spec
from kvmap.server.args import ServerArgs
from kvmap.server.limits import DEFAULT_HEADER_TIMEOUT_S
from kvmap.server.security import API_KEY_ENV, allowed_hosts_for, is_loopback

log = logging.getLogger("kvmap.server")
ENGINE_GAVE_UP_EXIT = 3
CACHE_SALT_ENV = "KVMAP_CACHE_SALT"
def serve_app(app, loop, host: str, port: int, log_level: str = "warning",
              header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, on_started=None) -> int:
    """Run uvicorn until it stops; returns the exit status: 0, or
    ``ENGINE_GAVE_UP_EXIT`` when the engine loop gave up (uvicorn is told to stop then).
    Connections are never counted against a limit here (the app counts requests); one
    whose headers are not complete within ``header_timeout_s`` is closed.
    ``on_started(server)``: called with the ``uvicorn.Server`` before it runs."""
    import uvicorn

    from kvmap.server.header_timeout import header_timeout_protocol
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level=log_level,
        http=header_timeout_protocol(header_timeout_s)))
    gave_up = threading.Event()

    def give_up() -> None:
        log.error("the engine loop gave up; stopping the server (exit %d)",
                  ENGINE_GAVE_UP_EXIT)
        gave_up.set()
        server.should_exit = True
    loop.on_give_up = give_up
    if on_started is not None:
        on_started(server)
    server.run()
    return ENGINE_GAVE_UP_EXIT if gave_up.is_set() else 0


def build_server(engine: EngineArgs = EngineArgs(), server: ServerArgs = ServerArgs()):
    """Load the model and build the app (not started), its engines from ``engine``, its
    limits and listening settings from ``server``. Raises ValueError on bad options.
    With ``server.adaptive``, the policy's first level is the starting KV configuration
    and ``engine.kv`` is ignored. ``server.host``: the address it will be bound to (a
    loopback bind checks Host headers against loopback names and ``allowed_hosts``).
    ``api_key`` (else ``$KVMAP_API_KEY``): required as a Bearer token on every route but
    /health. ``cache_salt`` (else ``$KVMAP_CACHE_SALT``): the server's secret salt of
    prefix hashes, joined with each request's own ``cache_salt``."""
    from kvmap.server.adaptive import AdaptiveController, AdaptivePolicy
    from kvmap.server.app import create_app
    from kvmap.server.engine_loop import EngineLoop
    from kvmap.hardware.omp_team import in_own_thread
    from kvmap.server.metrics import ServerMetrics

    policy = AdaptivePolicy.load(server.adaptive) if server.adaptive else None
    if policy is not None:              # the starting level's spec and batch limits
        engine = replace(engine, kv=policy.levels[0].kv,
                         **policy.levels[0].scheduler_overrides())
    limits = server.limits(engine.max_num_seqs)
    api_key = server.api_key or os.environ.get(API_KEY_ENV) or None
    cache_salt = server.cache_salt or os.environ.get(CACHE_SALT_ENV) or None
    first, factory = in_own_thread(_build_engines, engine, policy)
    name = server.served_model_name or first.model_id
    metrics = ServerMetrics(name, first.model_config.max_position_embeddings)
    controller = AdaptiveController(policy) if policy else None
    if controller is not None:
        import time
        controller.last_switch_s = time.perf_counter()
    loop = EngineLoop(factory, engine.kv, metrics, max_queue=server.max_queue,
                      controller=controller,
                      first_engine=first, request_timeout_s=limits.request_timeout_s)
    host = server.host
    if api_key is None and not is_loopback(host):
        log.warning("kvmap serve binds %s, which is not a loopback address, without an API "
                    "key: anyone who can reach it can use it (set --api-key or $%s)",
                    host, API_KEY_ENV)
    app = create_app(loop, name, limits=limits, api_key=api_key,
                     allowed_hosts=allowed_hosts_for(host, server.allowed_hosts),
                     cache_salt=cache_salt)
    return app, loop


def _build_engines(engine: EngineArgs, policy):
    """The first engine and the factory of later ones, every level's spec checked. Run in
    a thread of its own that exits (``kvmap.hardware.omp_team``): loading fans out on
    OpenMP, and a pool the main thread kept would turn the engine thread's spinning
    workers into sleeping ones for the life of the server."""
    from kvmap.server.engines import check_kv_specs, make_engine_factory
    first, factory = make_engine_factory(engine)
    if policy is not None:
        check_kv_specs(first, [level.kv for level in policy.levels])
    return first, factory


SERVE_OPTIONS = ("host", "port", "max_queue", "adaptive", "served_model_name",
                 "max_tokens_limit", "max_body_bytes", "max_prompt_chars", "max_stop_strings",
                 "max_stop_chars", "max_stop_token_ids", "max_messages",
                 "max_concurrent_requests", "header_timeout_s", "request_timeout_s",
                 "api_key", "allowed_hosts", "log_level")
SERVE_FLAGS = {"max_concurrent_requests": "--limit-concurrency",
               "header_timeout_s": "--header-timeout", "request_timeout_s": "--request-timeout"}


def register(app: typer.Typer) -> None:
    @app.command()
    @engine_options("model", "kv", "dtype", "quantization", "kv_memory", "max_num_seqs",
                    "max_num_batched_tokens")
    @dataclass_options(ServerArgs, "server", *SERVE_OPTIONS, flags=SERVE_FLAGS)
    def serve(engine: EngineArgs | None = None,       # made by @engine_options
              server: ServerArgs | None = None):      # made by @dataclass_options
        """Serve the OpenAI-compatible API (completions, chat, metrics) on uvicorn.
        Exits with status 3 when the engine keeps failing (for a supervisor). The
        server's prefix-cache salt, if any, comes from $KVMAP_CACHE_SALT."""
        from kvmap.cli_errors import fail
        try:
            server_app, loop = build_server(engine, server)
        except (ValueError, FileNotFoundError) as e:
            fail(redact_spec(str(e)))
        typer.echo(f"kvmap serve: {redact_spec(loop.active_kv)} on http://{server.host}:"
                   f"{server.port} (model {loop.active.model_id})", err=True)
        code = serve_app(server_app, loop, server.host, server.port, server.log_level,
                         server.header_timeout_s)
        if code:
            raise typer.Exit(code)
