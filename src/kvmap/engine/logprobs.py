"""Log-probabilities of a request's tokens, gathered while the request runs (vLLM's
``logprobs`` and ``prompt_logprobs`` sampling parameters).

A request that asks for them is an ordinary request: it is queued, admitted under the
KV budget, prefilled in chunks of the step's token budget and can be aborted like any
other; its log-probabilities are read from the hidden states its own forward passes
compute. Per step, for a scheduled item of ``n`` tokens starting at position ``c``::

    rows   c   c+1  ...  c+n-1          (the chunk's hidden states, one row a token)
    predict  c+1 c+2  ...  c+n           (row p predicts the token at position p + 1)

Rows that predict a token already known (a prompt token, or an output token being
recomputed after a preemption) are scored as soon as the chunk has run; the last row of a
chunk that completes the sequence predicts the token sampled in this step, scored once
it is known, from the logits the sampler used. Only positions from ``first_position`` on
are kept (1 with ``prompt_logprobs``; else the first output position), so a request that
wants only its output's log-probabilities computes no extra logits for its prompt.

Values are of the model's raw distribution (log-softmax of the logits: no temperature, no
top-k/top-p), as vLLM's default. A request with ``prompt_logprobs`` takes no prefix-cache
hit (every prompt position must be computed to be scored); a recomputed position
overwrites its earlier entry.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvmap.request import Request

ROWS_AT_ONCE = 256          # logits (rows, vocab) in fp32 computed at a time: ~50 MB at 49k


@dataclass
class ScoredTokens:
    """Per position of ``token_ids``: its log-probability and the top-k (id, lp) pairs
    predicted for it; None where it was not scored (position 0 has no predictor)."""

    token_ids: list[int]
    token_logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]


class TokenLogprobs:
    """The scores gathered for one request (``Request.logprobs``)."""

    def __init__(self, first_position: int, num_top: int):
        self.first_position = first_position
        self.num_top = num_top
        self.token_logprobs: list[float | None] = []
        self.top: list[list[tuple[int, float]] | None] = []

    @classmethod
    def for_request(cls, req: Request) -> TokenLogprobs | None:
        p = req.params
        if p.prompt_logprobs is None and p.logprobs is None:
            return None
        first = 1 if p.prompt_logprobs is not None else req.num_prompt_tokens
        return cls(first, max(p.prompt_logprobs or 0, p.logprobs or 0))

    def record(self, first_target: int, logits: torch.Tensor, targets: list[int]) -> None:
        """``logits`` (n, V) predict the tokens ``targets`` at positions
        ``first_target .. first_target + n - 1``; positions before ``first_position``
        are skipped."""
        skip = max(0, self.first_position - first_target)
        if skip >= len(targets):
            return
        logp = torch.log_softmax(logits[skip:].float(), dim=-1)
        targets = targets[skip:]
        chosen = logp[torch.arange(len(targets)), torch.tensor(targets)].tolist()
        if self.num_top:
            values, ids = logp.topk(self.num_top, dim=-1)
            tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
        else:
            tops = [[] for _ in targets]
        start = first_target + skip
        end = start + len(targets)
        if len(self.token_logprobs) < end:
            grow = end - len(self.token_logprobs)
            self.token_logprobs += [None] * grow
            self.top += [None] * grow
        self.token_logprobs[start:end] = chosen
        self.top[start:end] = tops

    def scored(self, token_ids: list[int]) -> ScoredTokens:
        """The scores of every position of ``token_ids`` (None where not scored);
        entries past its end (a sampled EOS that was dropped from the output) are not
        part of it."""
        n = len(token_ids)
        pad = max(0, n - len(self.token_logprobs))
        return ScoredTokens(list(token_ids), self.token_logprobs[:n] + [None] * pad,
                            self.top[:n] + [None] * pad)


def record_known_targets(model, items: list[tuple[Request, int]],
                         hidden: torch.Tensor) -> None:
    """After a forward pass over ``items`` (before they advance): score the rows whose
    next token is already known, for the requests that gather log-probabilities.
    ``hidden`` (T, hidden): the batch's final hidden states, items laid out in order."""
    offset = 0
    for req, n in items:
        scores = req.logprobs
        if scores is not None:
            c = req.num_computed_tokens
            # rows c .. c+n-1 predict c+1 .. c+n; known while < num_tokens
            num_known = min(n, req.num_tokens - 1 - c)
            first = max(c + 1, scores.first_position)
            for start in range(first, c + num_known + 1, ROWS_AT_ONCE):
                end = min(start + ROWS_AT_ONCE, c + num_known + 1)   # target positions
                rows = hidden[offset + start - 1 - c:offset + end - 1 - c]
                scores.record(start, model.logits(rows), req.token_ids[start:end])
        offset += n


def record_sampled(req: Request, logits_row: torch.Tensor) -> None:
    """The token just appended to ``req`` was sampled from ``logits_row`` (V,)."""
    if req.logprobs is not None:
        position = req.num_tokens - 1
        req.logprobs.record(position, logits_row.unsqueeze(0), [req.token_ids[position]])
