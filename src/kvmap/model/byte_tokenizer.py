"""The fallback tokenizer for models that ship none (``dummy:<shape>`` random weights).

One token per UTF-8 byte: token id ``b`` is the byte ``b``, so the same text has the same
ids wherever it is tokenized -- the bench cell, ``kvmap serve`` and ``kvmap loadgen
--tokenizer bytes``. (A model with fewer than 256 ids maps byte ``b`` to ``b % vocab``;
no shape in ``kvmap.model.shapes`` has one.) Ids >= 256 decode to nothing. Decoding is
UTF-8 with replacement, so a partial multi-byte character shows as U+FFFD until its last
byte arrives (the server's streaming detokenizer holds such text back).

A dummy model's output is noise, but its speed and memory are those of the real
geometry, which is what dummy models are for.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

NUM_BYTES = 256


class ByteTokenizer:
    """Duck-types the parts of ``kvmap.model.tokenizer.Tokenizer`` that the engine, the
    server, the bench and the workload builders use."""

    def __init__(self, model_vocab_size: int = NUM_BYTES, bos_token_id: int | None = None,
                 eos_token_ids: Sequence[int] = ()):
        if isinstance(model_vocab_size, bool) or not isinstance(model_vocab_size, int) \
                or model_vocab_size < 1:
            raise ValueError(f"model_vocab_size={model_vocab_size!r} must be an integer >= 1")
        self.num_ids = min(model_vocab_size, NUM_BYTES)
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = False
        self.chat_template = None

    @classmethod
    def for_model(cls, config) -> ByteTokenizer:
        """The tokenizer of a model without one (``config``: its ``ModelConfig``)."""
        return cls(config.vocab_size, config.bos_token_id, config.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self.num_ids

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = [b % self.num_ids for b in text.encode("utf-8")]
        if add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        skip = set(self.eos_token_ids) | {self.bos_token_id} if skip_special_tokens else set()
        data = bytes(int(i) for i in ids if 0 <= int(i) < NUM_BYTES and int(i) not in skip)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """A plain ``role: content`` transcript (dummy models have no chat format)."""
        lines = [f"{m['role']}: {m['content']}\n" for m in messages]
        if add_generation_prompt:
            lines.append("assistant: ")
        return "".join(lines)
