"""What the two generation routes share: the SSE answer (one chunk per ``Delta``, usage
as ``stream_options`` ask) and the collected, non-streaming answer."""
from __future__ import annotations

from fastapi import Request

from kvmap.server.context import ServerContext, usage
from kvmap.server.messages import Delta
from kvmap.server.request_stream import RequestStream
from kvmap.server.transport import SSEResponse, collect, event_stream


def sse_response(ctx: ServerContext, stream: RequestStream, head: dict, body, first: list,
                 fields) -> SSEResponse:
    """``{**head, **fields(delta)}`` per chunk, with usage on every chunk and/or a final
    usage chunk as ``body.stream_options`` ask."""
    opts = body.stream_options

    def chunk(delta: Delta) -> dict:
        out = {**head, **fields(delta)}
        if opts and opts.continuous_usage_stats:
            out["usage"] = usage(delta.num_prompt_tokens, delta.num_output_tokens).model_dump()
        return out

    def usage_chunk(delta: Delta) -> dict:
        return {**head, "choices": [],
                "usage": usage(delta.num_prompt_tokens, delta.num_output_tokens).model_dump()}
    return SSEResponse(event_stream(ctx.loop, stream, chunk, first,
                                    bool(opts and opts.include_usage), usage_chunk,
                                    body.return_token_ids))


async def collected(ctx: ServerContext, request: Request, stream: RequestStream
                    ) -> list[Delta] | None:
    """Every delta of a non-streaming request; None when the client went away (the
    request was aborted and nobody reads the response)."""
    deltas, disconnected = await collect(ctx.loop, request, stream)
    return None if disconnected else deltas
