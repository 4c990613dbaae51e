"""Why the engine refuses a request, naming the parameter at fault.

``Engine.add_request`` runs every check of a request before it stores anything, and
raises :class:`InvalidRequest` (a ``ValueError``) for the first that fails: a refused
request leaves no trace in the engine. ``param`` is the request field to blame
(``prompt``, ``cache_salt``, ``request_id``, ``params``), which the server puts in its
400 (issue 38: a ``cache_salt`` that could not be hashed was reported as ``prompt``).
"""
from __future__ import annotations

from kvmap.kv.offload.admission import check_prompt
from kvmap.request import SamplingParams


class InvalidRequest(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def unencodable_at(text: str) -> int | None:
    """The index of the first character of ``text`` that UTF-8 cannot encode (a lone
    surrogate, U+D800..U+DFFF), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def check_text(text, param: str) -> None:
    """InvalidRequest unless ``text`` is a string UTF-8 can encode (the tokenizer, the
    prefix hashes and every response must be able to)."""
    if not isinstance(text, str):
        raise InvalidRequest(f"{param} must be a string, got {type(text).__name__}", param)
    at = unencodable_at(text)
    if at is not None:
        raise InvalidRequest(f"{param} holds a lone surrogate (U+{ord(text[at]):04X} at "
                             f"character {at}), which is not valid Unicode text", param)


def check_request(engine, prompt_token_ids: list[int], params: SamplingParams,
                  prompt: str | None, cache_salt: str | None) -> None:
    """InvalidRequest for the first check a request to ``engine`` (an ``Engine``) fails:
    its parameters, its texts, its token ids against the model, its size against the
    pool (``kv.offload.admission``). Nothing here stores anything."""
    if not isinstance(params, SamplingParams):
        raise InvalidRequest(f"params={params!r} is not a SamplingParams", "params")
    if prompt is not None:
        check_text(prompt, "prompt")
    if cache_salt is not None:
        check_text(cache_salt, "cache_salt")
    if not prompt_token_ids:
        raise InvalidRequest(f"prompt {prompt!r} is empty (0 tokens)", "prompt")
    max_pos = engine.model_config.max_position_embeddings
    if len(prompt_token_ids) >= max_pos:
        raise InvalidRequest(f"prompt has {len(prompt_token_ids)} tokens; the model's "
                             f"context is {max_pos} tokens", "prompt")
    vocab = engine.model_config.vocab_size
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequest(f"prompt token id {bad} is outside the vocabulary "
                             f"[0, {vocab})", "prompt")
    chunk = engine.config.scheduler.max_num_batched_tokens
    try:
        check_prompt(len(prompt_token_ids), params.max_tokens, engine.kv.block_size,
                     engine.kv.pool.num_blocks, chunk, engine.policy, engine.offload,
                     need_blocks=engine.kv.peak_blocks(len(prompt_token_ids), chunk))
    except ValueError as e:
        raise InvalidRequest(str(e), "prompt") from None
