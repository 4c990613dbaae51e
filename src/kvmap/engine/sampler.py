"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Greedy rows (temperature 0) take the argmax; the others are sampled one row at a time
with the request's own ``torch.Generator`` so that a seeded request gives the same
tokens whatever else is in the batch.

A row that cannot be sampled -- non-finite logits (greedy or not: an argmax over NaN
means nothing), or a sampling call that raises -- gives a ``SamplingError`` in its place
instead of raising, so that the engine fails that request alone and the rest of the
batch keeps its tokens.
"""
from __future__ import annotations

import torch

from kvmap.request import Request, SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits (V,) fp32 -> temperature-scaled logits with top-k / top-p mass removed."""
    # shift first: a tiny temperature then sends the rest to -inf, never inf - inf = NaN
    # (and a temperature below the dtype's smallest normal would round to 0: clamp it)
    logits = (logits - logits.max()) / max(params.temperature, torch.finfo(logits.dtype).tiny)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (keeps >= 1 token)
        drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop[0] = False              # rounding must not drop the top token at a tiny top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop),
                                    float("-inf"))
    return logits


class SamplingError(RuntimeError):
    """One row of a batch could not be sampled (see the module docstring)."""


def sample(logits: torch.Tensor, requests: list[Request], engine_seed: int = 0
           ) -> list[int | SamplingError]:
    """logits (N, V) fp32, one row per request -> N token ids (a ``SamplingError`` for a
    row that could not be sampled)."""
    # two reductions where argmax + isfinite().all() were five passes (~3 ms a step at
    # 32 rows of SmolLM2's 49k vocabulary): max propagates NaN and +inf, min -inf, so a
    # row is all finite exactly when its max and min are; max's index is argmax's (the
    # first of equal maxima, NaN's own index)
    top, arg = logits.max(dim=-1)
    finite = (torch.isfinite(top) & torch.isfinite(logits.amin(dim=-1))).tolist()
    greedy = arg.tolist()
    out: list[int | SamplingError] = []
    for row, req in enumerate(requests):
        if not finite[row]:
            out.append(SamplingError(f"the logits of request {req.request_id} are not "
                                     f"finite"))
        elif req.params.greedy:
            out.append(greedy[row])
        else:
            try:
                out.append(_sample_row(logits[row], req, engine_seed))
            except (RuntimeError, ValueError) as e:
                out.append(SamplingError(f"sampling request {req.request_id} failed: {e}"))
    return out


def _sample_row(logits: torch.Tensor, req: Request, engine_seed: int) -> int:
    params = req.params
    if req.generator is None:
        req.generator = torch.Generator(device=logits.device)
        seed = params.seed if params.seed is not None else \
            hash((engine_seed, req.request_id)) & 0x7FFFFFFF
        req.generator.manual_seed(seed)
    probs = torch.softmax(filter_logits(logits, params), dim=-1)
    return int(torch.multinomial(probs, 1, generator=req.generator))
