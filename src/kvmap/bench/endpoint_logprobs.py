"""A prompt's log-probabilities from an endpoint, in the two shapes servers answer.

- OpenAI's legacy completions shape, ``echo: true`` + ``logprobs: k`` + ``max_tokens: 1``
  (``kvmap serve``, vLLM): ``choices[0].logprobs`` = ``{"token_logprobs": [null, lp_1,
  ...], "top_logprobs": [null, {token: lp, ...}, ...]}`` over prompt + output tokens;
- vLLM's ``prompt_logprobs: k`` extra: ``choices[0].prompt_logprobs`` = ``[null,
  {"<token id>": {"logprob": lp, "rank": r, "decoded_token": s}, ...}, ...]``, each entry
  holding the prompt's own token and its top k.

Either gives ``PromptLogprobs``: ``logprobs[j-1]`` = log p(t_j | t_<j) for j = 1 .. T-1,
and, when ``num_top`` > 0 and the server returned them, ``top[j-1]`` = the ``num_top``
most likely next tokens ``{token string: logprob}`` (``evals.topk.top_entries``: the
same cut ``prompt_ppl`` applies in-process). A server that returns the log-probabilities
but no top-k gives ``top = None`` (the KL is then not measured); one that returns neither
makes the task ``EndpointUnavailable``, with what it answered to both.
"""
from __future__ import annotations

from kvmap.evals.prompt_ppl import PromptLogprobs
from kvmap.evals.topk import top_entries


def from_echo(choice: dict, num_tokens: int, num_top: int) -> PromptLogprobs | str:
    """The scores of an ``echo`` + ``logprobs`` answer, or why there are none."""
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not (isinstance(values, list) and len(values) >= num_tokens
            and all(isinstance(v, (int, float)) for v in values[1:num_tokens])):
        return (f"no prompt log-probabilities for echo + logprobs (got "
                f"{len(values) if isinstance(values, list) else 0} values for a "
                f"{num_tokens}-token prompt)")
    top = None
    entries = logprobs.get("top_logprobs")
    if num_top and isinstance(entries, list) and len(entries) >= num_tokens \
            and all(isinstance(e, dict) and e for e in entries[1:num_tokens]):
        top = [top_entries(e, num_top) for e in entries[1:num_tokens]]
    return PromptLogprobs([float(v) for v in values[1:num_tokens]], top)


def from_vllm(choice: dict, token_ids: list[int], num_top: int) -> PromptLogprobs | None:
    """vLLM's ``prompt_logprobs`` (module docstring); None when absent or another shape."""
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) < len(token_ids):
        return None
    out, tops = [], []
    for token_id, entry in zip(token_ids[1:], entries[1:]):
        found = entry.get(str(token_id)) if isinstance(entry, dict) else None
        value = found.get("logprob") if isinstance(found, dict) else found
        if not isinstance(value, (int, float)):
            return None
        out.append(float(value))
        tops.append(_vllm_top(entry) if num_top else None)
    if not num_top or not all(tops):
        return PromptLogprobs(out, None)
    return PromptLogprobs(out, [top_entries(t, num_top) for t in tops])


def _vllm_top(entry: dict) -> dict | None:
    """``{decoded token: logprob}`` of one vLLM entry, the most likely of equal strings
    first; None without ``decoded_token`` strings."""
    ranked = []
    for value in entry.values():
        if not isinstance(value, dict) or not isinstance(value.get("decoded_token"), str) \
                or not isinstance(value.get("logprob"), (int, float)):
            return None
        ranked.append((float(value["logprob"]), value["decoded_token"]))
    out: dict[str, float] = {}
    for logprob, token in sorted(ranked, key=lambda x: -x[0]):
        out.setdefault(token, logprob)
    return out or None
