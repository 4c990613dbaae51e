"""Log-probabilities for ``/v1/completions`` (``logprobs: k``, with or without ``echo``),
in OpenAI's legacy shape::

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: lp}, ...],
     "text_offset": [...]}

How they are computed: by the request itself (``SamplingParams.logprobs`` and, with
``echo``, ``prompt_logprobs``; ``kvmap.engine.logprobs``). It is an ordinary request in
the one engine: counted by ``--max-queue``, inside the KV budget, prefilled in chunks of
the step budget between other requests' decode steps, aborted on disconnect or timeout.
Log-probabilities are of the model's raw distribution (log-softmax of the logits, no
temperature), as vLLM's default, through the served KV configuration (a selection policy
acts as it does for any request). Position i's entry is log p(token_i | tokens_<i); the
first prompt token has none (null). Each ``top_logprobs`` entry holds the k most likely
tokens plus the token itself (so up to k + 1 entries, as OpenAI and vLLM); of ids that
decode to the same string the most likely one stands (``kvmap.evals.topk.top_strings``,
which ``prompt_ppl`` uses in-process too).
"""
from __future__ import annotations

from kvmap.engine.logprobs import ScoredTokens
from kvmap.evals.topk import top_strings

__all__ = ["ScoredTokens", "openai_logprobs"]


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
