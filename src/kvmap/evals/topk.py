"""KL and top-1 agreement from *returned top-k* log-probabilities: what any server that
answers ``logprobs: k`` gives, so a server and kvmap's own engine are compared the same
way (``prompt_ppl`` records them in-process and over HTTP alike).

A sample's record holds, per scored position j = 1 .. T-1, the k most likely next tokens
as ``{token string: logprob}`` (``top_logprobs``), most likely first. Token strings, not
ids, because that is what OpenAI's shape returns, and strings compare across servers.

KL over the returned top-k (``KL_DEFINITION``), per position, baseline B and config C:

    S      = the k tokens of B's top-k
    p(s)   = exp(B[s]) / sum_{s' in S} exp(B[s'])                    s in S
    C'(s)  = C[s] if s is in C's top-k, else min(C's top-k logprobs)  (a token outside C's
             top-k has at most C's k-th probability: its upper bound stands in for it)
    q(s)   = exp(C'(s)) / sum_{s' in S} exp(C'(s'))
    KL_j   = sum_{s in S} p(s) (log p(s) - log q(s))          >= 0; 0 when they agree on S

It is not the full-vocabulary KL (``ppl``'s ``kl_mean``): the mass outside the
baseline's top-k is ignored and both are renormalised over S. Top-1 agreement: B's and
C's most likely token strings are equal (exact whenever the top-k is the true top-k).
A sample's value is the mean over its positions; the figure is the mean over samples
with a 95% percentile-bootstrap interval over samples (``kvmap.evals.stats``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kvmap.evals.stats import bootstrap_mean_ci

DEFAULT_NUM_TOP_LOGPROBS = 5
LOGPROB_DECIMALS = 6            # what a record keeps: its size, not the figure, limits it
KL_DEFINITION = ("KL(baseline || config) over the baseline's returned top-k tokens, both "
                 "renormalised over them; a token missing from the config's top-k takes "
                 "the config's k-th logprob; mean over positions, then over samples")


def top_strings(pairs: Sequence[tuple[int, float]], decode: Callable[[list[int]], str],
                own: tuple[int, float] | None = None) -> dict[str, float]:
    """``{decode([id]): logprob}`` of ``(id, logprob)`` pairs given most likely first: of
    ids that decode to the same string the first (most likely) wins; ``own`` (the scored
    token) is added when its string is not there yet -- OpenAI's ``top_logprobs`` entry."""
    out: dict[str, float] = {}
    for token_id, logprob in pairs:
        out.setdefault(decode([token_id]), float(logprob))
    if own is not None:
        out.setdefault(decode([own[0]]), float(own[1]))
    return out


def top_entries(entry: dict, num_top: int) -> dict[str, float]:
    """The ``num_top`` most likely of a ``{token: logprob}`` entry, most likely first
    (ties in the given order), logprobs rounded to ``LOGPROB_DECIMALS``."""
    ranked = sorted(entry.items(), key=lambda kv: -float(kv[1]))[:num_top]
    return {str(token): round(float(lp), LOGPROB_DECIMALS) for token, lp in ranked}


def _log_softmax(values: list[float]) -> list[float]:
    top = max(values)
    log_total = top + math.log(sum(math.exp(v - top) for v in values))
    return [v - log_total for v in values]


def position_kl(baseline: dict, config: dict) -> float:
    """KL over the baseline's top-k at one position (module docstring)."""
    if not baseline or not config:
        raise ValueError("position_kl needs a non-empty top-k on both sides")
    floor = min(float(v) for v in config.values())
    tokens = list(baseline)
    log_p = _log_softmax([float(baseline[t]) for t in tokens])
    log_q = _log_softmax([float(config.get(t, floor)) for t in tokens])
    return max(0.0, sum(math.exp(a) * (a - b) for a, b in zip(log_p, log_q)))


def argmax_token(entry: dict) -> str:
    return max(entry.items(), key=lambda kv: float(kv[1]))[0]


def sample_topk(baseline: Sequence[dict], config: Sequence[dict]) -> tuple[float, float]:
    """``(mean KL, share of top-1 agreement)`` over a sample's positions."""
    if len(baseline) != len(config) or not baseline:
        raise ValueError(f"top-k positions differ in number: {len(config)} vs "
                         f"{len(baseline)} of the baseline")
    kls = [position_kl(b, c) for b, c in zip(baseline, config)]
    agree = [argmax_token(b) == argmax_token(c) for b, c in zip(baseline, config)]
    return sum(kls) / len(kls), sum(agree) / len(agree)


def topk_comparison(records: Sequence[dict], baseline_records: Sequence[dict],
                    seed: int = 0) -> dict | None:
    """``kl_topk``, ``top1_topk`` (each with ``*_ci95``), ``kl_definition``,
    ``num_top_logprobs`` and ``num_samples`` of the samples both sides scored with a
    top-k over as many positions (joined by ``sample_id``); None when no sample has."""
    theirs = {r.get("sample_id"): r.get("top_logprobs") for r in baseline_records
              if isinstance(r, dict)}
    kls, agree, num_top = [], [], 0
    for r in records:
        mine, base = (r.get("top_logprobs") if isinstance(r, dict) else None), \
            theirs.get(r.get("sample_id") if isinstance(r, dict) else None)
        if not mine or not base or not all(mine) or not all(base) or len(mine) != len(base):
            continue                # no top-k, or not the same tokens (another tokenizer)
        kl, top1 = sample_topk(base, mine)
        kls.append(kl)
        agree.append(top1)
        num_top = max(num_top, max(len(b) for b in base))
    if not kls:
        return None
    return {"kl_topk": sum(kls) / len(kls), "kl_topk_ci95": list(bootstrap_mean_ci(kls, seed=seed)),
            "top1_topk": sum(agree) / len(agree),
            "top1_topk_ci95": list(bootstrap_mean_ci(agree, seed=seed)),
            "kl_definition": KL_DEFINITION, "num_top_logprobs": num_top,
            "num_samples": len(kls)}
