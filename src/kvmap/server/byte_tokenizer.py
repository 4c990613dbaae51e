"""A byte-level tokenizer for models that ship none (``dummy:<shape>`` random weights).

Token id ``b`` (0 <= b < 256) is the byte ``b``; ids >= 256 decode to nothing. With it, a
dummy model can be served and load-tested over the text API: its output is noise, but
its speed and memory are those of the real geometry, which is what dummy models are for.
Decoding is UTF-8 with replacement, so a partial multi-byte character shows as U+FFFD
until its last byte arrives (the streaming detokenizer holds such text back).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NUM_BYTES = 256


class ByteTokenizer:
    """Duck-types the parts of ``kvmap.model.tokenizer.Tokenizer`` the server and engine use."""

    def __init__(self, bos_token_id: int | None = None, eos_token_ids: Sequence[int] = ()):
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = False
        self.chat_template = None

    @property
    def vocab_size(self) -> int:
        return NUM_BYTES

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = list(text.encode("utf-8"))
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        skip = set(self.eos_token_ids) | {self.bos_token_id} if skip_special_tokens else set()
        data = bytes(i for i in ids if 0 <= i < NUM_BYTES and i not in skip)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """A plain ``role: content`` transcript (dummy models have no chat format)."""
        lines = [f"{m['role']}: {m['content']}\n" for m in messages]
        if add_generation_prompt:
            lines.append("assistant: ")
        return "".join(lines)
