"""``kvmap serve``: the OpenAI-compatible server on uvicorn.

The process exits with ``ENGINE_GAVE_UP_EXIT`` when the engine loop gives up (faults past
the restart budget), for a supervisor to restart it, instead of answering 503 forever.
``--limit-concurrency`` bounds the *requests* served at once (``admission.py``; default:
what the queue bound can admit plus a margin, ``default_limit_concurrency``), counted
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
from typing import Optional

import typer

from kvmap.cli_options import engine_options
from kvmap.config import EngineArgs
from kvmap.kv.redact import redact_spec
from kvmap.server.limits import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_MESSAGES,
                                 DEFAULT_MAX_STOP_CHARS, DEFAULT_MAX_STOP_STRINGS,
                                 DEFAULT_MAX_STOP_TOKEN_IDS, DEFAULT_MAX_TOKENIZER_QUEUE,
                                 DEFAULT_HEADER_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S,
                                 ServerLimits)
from kvmap.server.security import API_KEY_ENV, allowed_hosts_for, is_loopback

log = logging.getLogger("kvmap.server")
ENGINE_GAVE_UP_EXIT = 3
CACHE_SALT_ENV = "KVMAP_CACHE_SALT"
REQUEST_MARGIN = 64      # requests beyond the queue bound: tokenize, models, 503s


def default_limit_concurrency(max_queue: int, max_num_seqs: int) -> int:
    """Requests served at once: every request the engine may hold (waiting or running)
    plus ``REQUEST_MARGIN``."""
    return max_queue + max_num_seqs + REQUEST_MARGIN


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


def build_server(engine: EngineArgs = EngineArgs(), *, max_queue: int | None = 256,
                 adaptive: str | None = None, served_model_name: str | None = None,
                 max_body_bytes: int | None = None, max_tokens_limit: int | None = None,
                 host: str = "127.0.0.1",
                 api_key: str | None = None, allowed_hosts: tuple[str, ...] = (),
                 request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
                 max_stop_strings: int = DEFAULT_MAX_STOP_STRINGS,
                 max_stop_chars: int = DEFAULT_MAX_STOP_CHARS,
                 max_prompt_chars: int | None = None,
                 max_stop_token_ids: int = DEFAULT_MAX_STOP_TOKEN_IDS,
                 max_messages: int = DEFAULT_MAX_MESSAGES,
                 max_tokenizer_queue: int = DEFAULT_MAX_TOKENIZER_QUEUE,
                 cache_salt: str | None = None, limit_concurrency: int | None = None):
    """Load the model and build the app (not started), its engines from ``engine``.
    Raises ValueError on bad options. With ``adaptive``, the policy's first level is the
    starting KV configuration and ``engine.kv`` is ignored. ``host``: the address it will
    be bound to (a loopback bind checks Host headers against loopback names and
    ``allowed_hosts``). ``api_key`` (else ``$KVMAP_API_KEY``): required as a Bearer token
    on every route but /health. ``cache_salt`` (else ``$KVMAP_CACHE_SALT``): the server's
    secret salt of prefix hashes, joined with each request's own ``cache_salt``.
    ``limit_concurrency``: requests served at once (default: ``max_queue`` + max_num_seqs
    + ``REQUEST_MARGIN``; none with neither a limit nor a queue bound)."""
    from kvmap.server.adaptive import AdaptiveController, AdaptivePolicy
    from kvmap.server.app import create_app
    from kvmap.server.engine_loop import EngineLoop
    from kvmap.server.engines import check_kv_specs, make_engine_factory
    from kvmap.server.metrics import ServerMetrics

    policy = AdaptivePolicy.load(adaptive) if adaptive else None
    if policy is not None:              # the starting level's spec and batch limits
        engine = replace(engine, kv=policy.levels[0].kv,
                         **policy.levels[0].scheduler_overrides())
    limits = ServerLimits(max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                          max_tokens_limit=max_tokens_limit,
                          max_stop_strings=max_stop_strings, max_stop_chars=max_stop_chars,
                          max_prompt_chars=max_prompt_chars,
                          request_timeout_s=request_timeout_s,
                          max_stop_token_ids=max_stop_token_ids, max_messages=max_messages,
                          max_tokenizer_queue=max_tokenizer_queue,
                          max_concurrent_requests=limit_concurrency or (
                              default_limit_concurrency(max_queue, engine.max_num_seqs)
                              if max_queue is not None else None))
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    cache_salt = cache_salt or os.environ.get(CACHE_SALT_ENV) or None
    if max_tokens_limit is not None and max_tokens_limit < 1:
        raise ValueError(f"max_tokens_limit={max_tokens_limit} must be >= 1")
    first, factory = make_engine_factory(engine)
    if policy is not None:
        check_kv_specs(first, [level.kv for level in policy.levels])
    name = served_model_name or first.model_id
    metrics = ServerMetrics(name, first.model_config.max_position_embeddings)
    controller = AdaptiveController(policy) if policy else None
    if controller is not None:
        import time
        controller.last_switch_s = time.perf_counter()
    loop = EngineLoop(factory, engine.kv, metrics, max_queue=max_queue, controller=controller,
                      first_engine=first, request_timeout_s=limits.request_timeout_s)
    if api_key is None and not is_loopback(host):
        log.warning("kvmap serve binds %s, which is not a loopback address, without an API "
                    "key: anyone who can reach it can use it (set --api-key or $%s)",
                    host, API_KEY_ENV)
    app = create_app(loop, name, limits=limits, api_key=api_key,
                     allowed_hosts=allowed_hosts_for(host, tuple(allowed_hosts)),
                     cache_salt=cache_salt)
    return app, loop


def register(app: typer.Typer) -> None:
    @app.command()
    @engine_options("model", "kv", "dtype", "quantization", "kv_memory", "max_num_seqs",
                    "max_num_batched_tokens")
    def serve(
        host: str = typer.Option("127.0.0.1"),
        port: int = typer.Option(8000),
        max_queue: int = typer.Option(256, help="Requests that may wait for the engine; "
                                                "more get 503."),
        adaptive: Optional[str] = typer.Option(None, help="Adaptive KV policy file (YAML)"),
        served_model_name: Optional[str] = typer.Option(None, help="Name in /v1/models "
                                                                   "(default: the model id)"),
        max_tokens_limit: Optional[int] = typer.Option(None, help="Most tokens one request "
                                                                  "may ask for"),
        max_body_bytes: int = typer.Option(DEFAULT_MAX_BODY_BYTES, help="Largest request body"),
        max_prompt_chars: Optional[int] = typer.Option(
            None, help="Longest prompt in characters, refused before tokenizing "
                       "(default: 32 x the model's context)"),
        max_stop_strings: int = typer.Option(DEFAULT_MAX_STOP_STRINGS,
                                             help="Most stop strings one request may give"),
        max_stop_chars: int = typer.Option(DEFAULT_MAX_STOP_CHARS,
                                           help="Longest stop string, in characters"),
        max_stop_token_ids: int = typer.Option(DEFAULT_MAX_STOP_TOKEN_IDS,
                                               help="Most stop token ids one request may "
                                                    "give"),
        max_messages: int = typer.Option(DEFAULT_MAX_MESSAGES,
                                         help="Most chat messages plus content parts one "
                                              "request may give"),
        limit_concurrency: Optional[int] = typer.Option(
            None, help="Requests served at once, more get 503; /health and /metrics are "
                       "never refused, open sockets are not counted (default: max-queue "
                       f"+ max-num-seqs + {REQUEST_MARGIN})"),
        header_timeout: float = typer.Option(DEFAULT_HEADER_TIMEOUT_S,
                                             help="Seconds a request's headers may take; "
                                                  "then the connection is closed"),
        request_timeout: float = typer.Option(DEFAULT_REQUEST_TIMEOUT_S,
                                              help="Seconds a request may take; then 504"),
        api_key: Optional[str] = typer.Option(None, help=f"Require 'Authorization: Bearer "
                                                         f"KEY' (else ${API_KEY_ENV})"),
        allowed_hosts: list[str] = typer.Option([], "--allowed-hosts",
                                                help="Host header names a loopback server "
                                                     "also answers ('*': any)"),
        log_level: str = typer.Option("warning", help="uvicorn log level"),
        engine: EngineArgs | None = None,       # made by @engine_options
    ):
        """Serve the OpenAI-compatible API (completions, chat, metrics) on uvicorn.
        Exits with status 3 when the engine keeps failing (for a supervisor). The
        server's prefix-cache salt, if any, comes from $KVMAP_CACHE_SALT."""
        from kvmap.cli_errors import fail
        if not 0 < port < 65536:
            fail(f"--port={port} must be in 1..65535")
        if max_queue < 1:
            fail(f"--max-queue={max_queue} must be >= 1")
        if max_body_bytes < 1:
            fail(f"--max-body-bytes={max_body_bytes} must be >= 1")
        if not header_timeout > 0:
            fail(f"--header-timeout={header_timeout} must be > 0")
        if limit_concurrency is not None and limit_concurrency < 1:
            fail(f"--limit-concurrency={limit_concurrency} must be >= 1")
        try:
            server_app, loop = build_server(
                engine, max_queue=max_queue,
                adaptive=adaptive, served_model_name=served_model_name,
                max_body_bytes=max_body_bytes, max_tokens_limit=max_tokens_limit,
                host=host, api_key=api_key, allowed_hosts=tuple(allowed_hosts),
                request_timeout_s=request_timeout, max_stop_strings=max_stop_strings,
                max_stop_chars=max_stop_chars, max_prompt_chars=max_prompt_chars,
                max_stop_token_ids=max_stop_token_ids, max_messages=max_messages,
                limit_concurrency=limit_concurrency)
        except (ValueError, FileNotFoundError) as e:
            fail(redact_spec(str(e)))
        typer.echo(f"kvmap serve: {redact_spec(loop.active_kv)} on http://{host}:{port} "
                   f"(model {loop.active.model_id})", err=True)
        code = serve_app(server_app, loop, host, port, log_level, header_timeout)
        if code:
            raise typer.Exit(code)
