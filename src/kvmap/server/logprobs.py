"""Log-probabilities for ``/v1/completions`` (``logprobs: k``, with or without ``echo``),
in OpenAI's legacy shape::

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: lp}, ...],
     "text_offset": [...]}

How they are computed: after the request is generated, its prompt + output tokens are
scored in one teacher-forced pass (``Engine.score``: chunked prefill through the same KV
configuration) on a *scoring engine* -- an engine of its own over the same weights, built
on the first such request, so scoring never waits for the serving engine to be idle.
It has its own KV pool (``--kv-memory`` again). Log-probabilities are of the model's raw
distribution (log-softmax of the logits, no temperature), as vLLM's default. Position i's
entry is log p(token_i | tokens_<i); the first prompt token has none (null). Each
``top_logprobs`` entry holds the k most likely tokens plus the token itself (so up to
k + 1 entries, as OpenAI and vLLM); of ids that decode to the same string the most
likely one stands (``kvmap.evals.topk.top_strings``, which ``prompt_ppl`` uses
in-process too). A selection policy does not act while scoring.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmap.engine.engine import Engine
from kvmap.evals.topk import top_strings


@dataclass(frozen=True)
class ScoredTokens:
    """Per position of ``token_ids``: its log-probability and the top-k (id, lp) pairs
    predicted for it; None for position 0 (nothing predicts it)."""

    token_ids: list[int]
    token_logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]


def scoring_engine(loop) -> Engine:
    """The loop's scoring engine for its active KV configuration (engine thread only)."""
    scorer = loop.scorer
    if scorer is None or scorer[0] != loop.active_kv:
        if scorer is not None:
            scorer[1].close()
        loop.scorer = (loop.active_kv, loop.factory(loop.active_kv))
    return loop.scorer[1]


def score_tokens(engine: Engine, token_ids: list[int], num_top: int) -> ScoredTokens:
    """Teacher-forced log-probabilities of ``token_ids`` (engine thread; idle engine)."""
    logprobs: list[float | None] = [None]
    top: list[list[tuple[int, float]] | None] = [None]
    num_done = [0]

    def reduce(logits: torch.Tensor) -> torch.Tensor:
        # logits (n, V) at positions start .. start+n-1 predict tokens start+1 .. start+n
        logp = torch.log_softmax(logits.float(), dim=-1)
        start = num_done[0]
        num_done[0] += logp.shape[0]
        targets = token_ids[start + 1:start + 1 + logp.shape[0]]
        if targets:
            rows = logp[:len(targets)]
            logprobs.extend(rows[torch.arange(len(targets)),
                                 torch.tensor(targets)].tolist())
            if num_top:
                values, ids = rows.topk(num_top, dim=-1)
                top.extend([list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())])
            else:
                top.extend([] for _ in targets)
        return logits.new_empty(0)

    engine.score(list(token_ids), per_chunk=reduce)
    return ScoredTokens(list(token_ids), logprobs, top)


def openai_logprobs(scored: ScoredTokens, first: int, decode, text_start: int = 0) -> dict:
    """The legacy completions ``logprobs`` object for positions ``first ..`` of
    ``scored``; ``decode`` maps token ids to text (offsets are cumulative from
    ``text_start``)."""
    tokens, offsets, tops = [], [], []
    offset = text_start
    for pos in range(first, len(scored.token_ids)):
        token_id = scored.token_ids[pos]
        text = decode([token_id])
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if scored.top[pos] is None:
            tops.append(None)
            continue
        tops.append(top_strings(scored.top[pos], decode,
                                (token_id, scored.token_logprobs[pos])))
    return {"tokens": tokens, "token_logprobs": scored.token_logprobs[first:],
            "top_logprobs": tops, "text_offset": offsets}
