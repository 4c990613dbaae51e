"""``POST /v1/completions``: one prompt (text or token ids), streamed or not."""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from kvmap.server.context import ServerContext, server_context, usage
from kvmap.server.errors import ERROR_RESPONSES, APIError
from kvmap.server.logprobs import openai_logprobs
from kvmap.server.messages import Delta
from kvmap.server.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                   CompletionResponse)
from kvmap.server.routes.streaming import collected, sse_response

COMPLETIONS_DEFAULT_MAX_TOKENS = 16          # OpenAI's and vLLM's default for /v1/completions

router = APIRouter()


def _single_prompt(prompt):
    """The one prompt of a request (a list holding one prompt is that prompt)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"prompt holds {len(prompt)} prompts; this server takes "
                                "one prompt per request", "prompt")
        return prompt[0]
    return prompt


@router.post("/v1/completions", response_model=CompletionResponse,
             responses=ERROR_RESPONSES)
async def completions(body: CompletionRequest, request: Request,
                      ctx: ServerContext = Depends(server_context)):
    arrival_s = time.perf_counter()
    ctx.check_model(body.model)
    ctx.check_supported(body)
    prompt = _single_prompt(body.prompt)
    prompt_text = prompt if isinstance(prompt, str) else None
    if prompt_text is not None:
        ids = ctx.check_ids(await ctx.encode(prompt_text, "prompt"), "prompt")
    else:
        if len(prompt) > ctx.max_model_len:       # before looking at every id
            ctx.sampling_params(body, len(prompt), None, body.max_tokens)
        ids = ctx.check_ids(list(prompt), "prompt")
    params = ctx.sampling_params(body, len(ids), COMPLETIONS_DEFAULT_MAX_TOKENS,
                                 body.max_tokens)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    echo_text = ""
    if body.echo:
        echo_text = prompt_text if prompt_text is not None \
            else await ctx.decode(ids) if ctx.tokenizer else ""
    stream = await ctx.submit(request_id, ids, params, prompt_text, arrival_s,
                              ctx.cache_salt_of(body))
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()),
            "model": ctx.model_name}

    def choice(text: str, delta: Delta, token_ids=None) -> CompletionChoice:
        return CompletionChoice(index=0, text=text, finish_reason=delta.finish_reason,
                                token_ids=(token_ids if token_ids is not None
                                           else delta.token_ids)
                                if body.return_token_ids else None)

    if body.stream:
        first = []
        if echo_text:
            first.append({**head, "choices": [{"index": 0, "text": echo_text,
                                               "logprobs": None, "finish_reason": None}]})
        prompt_ids_sent = [False]

        def fields(delta: Delta) -> dict:
            c = choice(delta.text, delta).model_dump(exclude_none=False)
            if not body.return_token_ids:
                c.pop("token_ids")
            out = {"choices": [c]}
            if body.return_token_ids and not prompt_ids_sent[0]:
                out["prompt_token_ids"] = ids
                prompt_ids_sent[0] = True
            return out
        return sse_response(ctx, stream, head, body, first, fields)

    deltas = await collected(ctx, request, stream)
    if deltas is None:
        return Response(status_code=499)
    last = deltas[-1]
    token_ids = [t for d in deltas for t in d.token_ids]
    out = choice(echo_text + "".join(d.text for d in deltas), last, token_ids)
    if body.logprobs is not None:         # scored by the request itself, as it ran
        out.logprobs = CompletionLogprobs(**await ctx.off_loop(
            openai_logprobs, last.logprobs, 0 if body.echo else len(ids),
            ctx.tokenizer.decode))
    return CompletionResponse(
        **head, choices=[out], usage=usage(len(ids), last.num_output_tokens),
        prompt_token_ids=ids if body.return_token_ids else None)
