"""``GET /health`` (open even with an API key: probes need no secret) and
``GET /metrics`` (Prometheus text; it follows the key)."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from kvmap.server.context import ServerContext, server_context
from kvmap.server.errors import APIError

router = APIRouter()


@router.get("/health")
async def health(ctx: ServerContext = Depends(server_context)):
    loop = ctx.loop
    if not loop.alive:            # why is in the server log, never in a body
        raise APIError(503, "the engine loop is not running")
    return Response(status_code=200)


@router.get("/metrics")
async def prometheus_metrics(ctx: ServerContext = Depends(server_context)):
    return Response(await ctx.loop.metrics.render_off_loop(),
                    media_type="text/plain; version=0.0.4; charset=utf-8")
