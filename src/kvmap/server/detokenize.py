"""Incremental detokenization for streaming.

Each engine step adds tokens; the client must get text deltas that

- never split a multi-byte character: byte-level BPE tokens can end in the middle of a
  UTF-8 sequence, which decodes to U+FFFD until the rest arrives -- such text is held
  back (the two-offset decode window of vLLM's ``detokenize_incrementally``: the
  previous chunk of tokens is decoded again as context, so a token whose text depends
  on its neighbours comes out right);
- never show a stop string: the engine cuts the text where a stop string begins, so the
  last ``len(longest stop) - 1`` characters are held back until the request finishes
  (a stop string can only complete with a later token).

When the request finishes, the engine's own ``output_text`` is authoritative: the deltas
sent so far plus the last one concatenate exactly to it.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.hold_chars = max((len(s) for s in stop), default=1) - 1
        self.text = ""             # decoded text of the tokens consumed so far
        self.sent = ""             # prefix of ``text`` already given to the client
        self._prefix_offset = 0    # token index where the decode window starts
        self._read_offset = 0      # tokens before this are in ``text``

    def update(self, output_token_ids: list[int]) -> str:
        """New tokens have been appended to ``output_token_ids``; returns the text delta
        that is safe to send now (may be empty)."""
        if self.tokenizer is None:
            return ""
        ids = output_token_ids
        prefix = self.tokenizer.decode(ids[self._prefix_offset:self._read_offset])
        full = self.tokenizer.decode(ids[self._prefix_offset:])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT):
            self.text += full[len(prefix):]
            # the tokens just consumed are the context of the next decode window
            self._prefix_offset, self._read_offset = self._read_offset, len(ids)
        safe = self.text[:len(self.text) - self.hold_chars] if self.hold_chars else self.text
        return self._emit(safe)

    def finish(self, final_text: str) -> str:
        """The request finished with ``final_text`` (the engine's); the last delta."""
        return self._emit(final_text)

    def _emit(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta = text[len(self.sent):]
        self.sent = text
        return delta
