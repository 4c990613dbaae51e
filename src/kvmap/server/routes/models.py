"""``GET /v1/models`` and ``GET /version``."""
from __future__ import annotations

from fastapi import APIRouter, Depends

import kvmap
from kvmap.server.context import ServerContext, server_context
from kvmap.server.protocol import ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", response_model=ModelList)
async def models(ctx: ServerContext = Depends(server_context)):
    return ModelList(data=[ModelCard(id=ctx.model_name, created=ctx.created,
                                     root=ctx.model_name, max_model_len=ctx.max_model_len)])


@router.get("/version")
async def version():
    return {"version": kvmap.__version__}
