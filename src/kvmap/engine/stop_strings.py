"""The per-token stop-string check, on the tail of the output only.

Every generated token is checked against the request's stop strings (on the engine
thread). Decoding the whole output each time costs O(output) per token -- O(n^2) a
request. The check before this token found no match, so a new match must end in the
text this token added (or a character it completed) and start at most
``len(longest stop) - 1`` characters earlier: decoding enough trailing tokens to cover
that is enough. ``SLACK_CHARS`` covers what the tail's first tokens may decode to
differently from inside the full text (an incomplete UTF-8 sequence decodes to up to
three U+FFFD; some decoders drop a leading space).
"""
from __future__ import annotations

from collections.abc import Sequence

SLACK_CHARS = 4


def stop_in_tail(tokenizer, output_token_ids: Sequence[int], stop: Sequence[str]) -> bool:
    """Whether a stop string may have been completed by the newest token. No false
    negatives given that the same check ran after every earlier token; a True is
    confirmed by the caller on the full text (where it also finds the cut)."""
    if not output_token_ids or not stop:
        return False
    longest = max(len(s) for s in stop)
    need_chars = longest + len(tokenizer.decode(list(output_token_ids[-1:]))) + SLACK_CHARS
    num_ids = min(len(output_token_ids), longest + 1)
    while True:
        tail = tokenizer.decode(list(output_token_ids[-num_ids:]))
        if len(tail) >= need_chars or num_ids >= len(output_token_ids):
            return any(s in tail for s in stop)
        num_ids = min(2 * num_ids, len(output_token_ids))
