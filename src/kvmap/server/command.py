"""``kvmap serve``: the OpenAI-compatible server on uvicorn."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import typer


def build_server(model: str | None = None, kv: str = "bf16", *, dtype: str = "bf16",
                 kv_memory: str = "256MiB", num_blocks: int | None = None,
                 block_size: int = 16, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 512, max_queue: int | None = 256,
                 adaptive: str | None = None, served_model_name: str | None = None,
                 max_body_bytes: int | None = None, max_tokens_limit: int | None = None,
                 device: str | None = None, seed: int = 0):
    """Load the model and build the app (not started). Raises ValueError on bad options.
    With ``adaptive``, the policy's first level is the starting KV configuration and
    ``kv`` is ignored."""
    import torch

    from kvmap.config import EngineArgs
    from kvmap.server.adaptive import AdaptiveController, AdaptivePolicy
    from kvmap.server.app import DEFAULT_MAX_BODY_BYTES, create_app
    from kvmap.server.engine_loop import EngineLoop
    from kvmap.server.engines import check_kv_specs, make_engine_factory
    from kvmap.server.metrics import ServerMetrics

    if device is None and not torch.cuda.is_available():
        device = "cpu"
    policy = AdaptivePolicy.load(adaptive) if adaptive else None
    if policy is not None:
        kv = policy.levels[0].kv
    if max_tokens_limit is not None and max_tokens_limit < 1:
        raise ValueError(f"max_tokens_limit={max_tokens_limit} must be >= 1")
    config = EngineArgs(model=model, dtype=dtype, kv_memory=kv_memory,
                        num_blocks=num_blocks, block_size=block_size,
                        max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens,
                        device=device, seed=seed)
    if policy is not None:              # the starting level's own batch limits, if any
        config = replace(config, **policy.levels[0].scheduler_overrides())
    first, factory = make_engine_factory(config, kv)
    if policy is not None:
        check_kv_specs(first, [level.kv for level in policy.levels])
    name = served_model_name or first.model_id
    metrics = ServerMetrics(name, first.model_config.max_position_embeddings)
    controller = AdaptiveController(policy) if policy else None
    if controller is not None:
        import time
        controller.last_switch_s = time.perf_counter()
    loop = EngineLoop(factory, kv, metrics, max_queue=max_queue, controller=controller,
                      first_engine=first)
    app = create_app(loop, name, max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                     max_tokens_limit=max_tokens_limit)
    return app, loop


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        model: Optional[str] = typer.Option(None, help="GGUF path, HF dir, dummy:<shape>; "
                                                        "default: embedded SmolLM2-135M."),
        kv: str = typer.Option("bf16", help="KV spec, e.g. 'int8(granularity=token)'"),
        host: str = typer.Option("127.0.0.1"),
        port: int = typer.Option(8000),
        max_queue: int = typer.Option(256, help="Requests that may wait for the engine; "
                                                "more get 503."),
        adaptive: Optional[str] = typer.Option(None, help="Adaptive KV policy file (YAML)"),
        dtype: str = typer.Option("bf16", help="fp32 | bf16 | fp16"),
        kv_memory: str = typer.Option("256MiB", help="KV pool budget per engine: bytes "
                                     "(256MiB) or the model's bf16 tokens ('3072 tokens')"),
        max_num_seqs: int = typer.Option(64, help="Running sequences at once"),
        max_num_batched_tokens: int = typer.Option(512, help="Token budget of one step"),
        served_model_name: Optional[str] = typer.Option(None, help="Name in /v1/models "
                                                                   "(default: the model id)"),
        max_tokens_limit: Optional[int] = typer.Option(None, help="Most tokens one request "
                                                                  "may ask for"),
        max_body_bytes: int = typer.Option(4 * 2**20, help="Largest request body"),
        log_level: str = typer.Option("warning", help="uvicorn log level"),
    ):
        """Serve the OpenAI-compatible API (completions, chat, metrics) on uvicorn."""
        import uvicorn

        from kvmap.cli import fail
        if not 0 < port < 65536:
            fail(f"--port={port} must be in 1..65535")
        if max_queue < 1:
            fail(f"--max-queue={max_queue} must be >= 1")
        if max_body_bytes < 1:
            fail(f"--max-body-bytes={max_body_bytes} must be >= 1")
        try:
            server_app, loop = build_server(
                model, kv, dtype=dtype, kv_memory=kv_memory, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, max_queue=max_queue,
                adaptive=adaptive, served_model_name=served_model_name,
                max_body_bytes=max_body_bytes, max_tokens_limit=max_tokens_limit)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        typer.echo(f"kvmap serve: {loop.active_kv} on http://{host}:{port} "
                   f"(model {loop.active.model_id})", err=True)
        uvicorn.run(server_app, host=host, port=port, log_level=log_level)
