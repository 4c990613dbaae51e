"""``POST /v1/chat/completions``: the chat template applied (off the event loop), then
generation as for completions."""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from kvmap.server.context import ServerContext, server_context, usage
from kvmap.server.errors import ERROR_RESPONSES
from kvmap.server.messages import Delta
from kvmap.server.protocol import (ChatChoice, ChatCompletionRequest, ChatCompletionResponse,
                                   ChatResponseMessage)
from kvmap.server.routes.streaming import collected, sse_response

router = APIRouter()


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses=ERROR_RESPONSES)
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           ctx: ServerContext = Depends(server_context)):
    arrival_s = time.perf_counter()
    ctx.check_model(body.model)
    ctx.check_supported(body)
    prompt = await ctx.render_chat(body.messages, body.add_generation_prompt)
    ids = ctx.check_ids(await ctx.encode(prompt, "messages"), "messages")
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = ctx.sampling_params(body, len(ids), None, max_tokens)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    stream = await ctx.submit(request_id, ids, params, prompt, arrival_s,
                              ctx.cache_salt_of(body))
    head = {"id": request_id, "object": "chat.completion.chunk" if body.stream
            else "chat.completion", "created": int(time.time()), "model": ctx.model_name}
    last_message = body.messages[-1]
    echo = last_message.text() if body.echo and last_message.role == "assistant" else ""

    if body.stream:
        role_chunk = {**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                 "content": echo},
                                           "logprobs": None, "finish_reason": None}]}
        if body.return_token_ids:
            role_chunk["prompt_token_ids"] = ids

        def fields(delta: Delta) -> dict:
            c = {"index": 0, "delta": {"content": delta.text} if delta.text else {},
                 "logprobs": None, "finish_reason": delta.finish_reason}
            if body.return_token_ids:
                c["token_ids"] = delta.token_ids
            return {"choices": [c]}
        return sse_response(ctx, stream, head, body, [role_chunk], fields)

    deltas = await collected(ctx, request, stream)
    if deltas is None:
        return Response(status_code=499)
    last = deltas[-1]
    choice = ChatChoice(
        index=0, message=ChatResponseMessage(role="assistant", content=echo + "".join(
            d.text for d in deltas)), finish_reason=last.finish_reason,
        token_ids=[t for d in deltas for t in d.token_ids] if body.return_token_ids else None)
    return ChatCompletionResponse(**head, choices=[choice],
                                  usage=usage(len(ids), last.num_output_tokens),
                                  prompt_token_ids=ids if body.return_token_ids else None)
