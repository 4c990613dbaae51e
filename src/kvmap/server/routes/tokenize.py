"""``POST /tokenize`` (a prompt, or messages through the chat template) and
``POST /detokenize`` -- vLLM's two utility routes, tokenizing off the event loop."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from kvmap.server.context import ServerContext, server_context
from kvmap.server.errors import ERROR_RESPONSES, APIError
from kvmap.server.protocol import DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.post("/tokenize", responses=ERROR_RESPONSES)
async def tokenize(body: TokenizeRequest, ctx: ServerContext = Depends(server_context)):
    ctx.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", "prompt")
    bad = ctx.limits.check_lists(body)
    if bad is not None:
        raise APIError(400, bad[1], bad[0])
    if body.messages is not None:
        text = await ctx.render_chat(body.messages, body.add_generation_prompt)
        ids = await ctx.encode(text, "messages")
    else:
        ids = await ctx.encode(body.prompt, "prompt", body.add_special_tokens)
    return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids}


@router.post("/detokenize", responses=ERROR_RESPONSES)
async def detokenize(body: DetokenizeRequest, ctx: ServerContext = Depends(server_context)):
    ctx.check_model(body.model)
    if ctx.tokenizer is None:
        raise APIError(400, "this model has no tokenizer", "tokens")
    if len(body.tokens) > ctx.max_model_len:
        raise APIError(400, f"tokens holds {len(body.tokens)} ids; this server detokenizes "
                            f"at most the model's context, {ctx.max_model_len}", "tokens")
    if body.tokens:
        ctx.check_ids(body.tokens, "tokens")
    return {"prompt": await ctx.decode(body.tokens)}
