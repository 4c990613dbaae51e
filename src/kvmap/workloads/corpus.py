"""Natural English text for prompts, with no download.

The built-in corpus is CPython's own documentation topics (``pydoc_data.topics.topics``,
shipped with every Python: ~460 KB of reST), cleaned into ~1,080 distinct prose
paragraphs (~38K words, roughly 50K BPE tokens): headings, tables, grammar rules and code
examples are dropped, emphasis markers removed, whitespace collapsed, repeats removed.
Topics are read in sorted key order, so the paragraphs are deterministic for a given
Python version (the docs change between versions; pin it where exact prompts matter).

A user corpus replaces it: ``load_text_file(path)`` reads plain text, or JSONL with one
``{"text": ...}`` object per line, and the result goes to ``take_tokens(..., text=...)``.
"""
from __future__ import annotations

import functools
import inspect
import re
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from kvmap.workloads.files import jsonl_records, require_file

_UNDERLINE = re.compile(r"[*=\-^~+#]{3,}")          # reST heading underline
_EMPHASIS = re.compile(r"\*+([^*\s][^*]*?)\*+")     # *word* / **word**
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_MIN_WORDS = 8
_MIN_LETTER_FRACTION = 0.88                          # letters+spaces; drops code-ish text


class TokenizerLike(Protocol):
    """What the workload code needs of a tokenizer (``kvmap.model.tokenizer.Tokenizer`` fits).

    When ``encode`` takes an ``add_bos`` keyword it is called with ``add_bos=False``:
    lengths count the text's own tokens, and the engine adds BOS itself.
    """

    def encode(self, text: str) -> Sequence[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def encode_text(tokenizer: TokenizerLike, text: str) -> list[int]:
    """``tokenizer.encode(text)`` without a BOS token where the tokenizer can say so."""
    try:
        takes_add_bos = "add_bos" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):          # builtins without a signature
        takes_add_bos = False
    ids = tokenizer.encode(text, add_bos=False) if takes_add_bos else tokenizer.encode(text)
    return list(ids)


def _is_prose(lines: list[str], text: str) -> bool:
    if any(_UNDERLINE.fullmatch(line) for line in lines):
        return False
    if any(line.startswith(("|", "+", ">>>", "...")) or "::=" in line for line in lines):
        return False
    if len(text.split()) < _MIN_WORDS or text[-1] not in ".:?!)\"":
        return False
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return letters / len(text) >= _MIN_LETTER_FRACTION


@functools.lru_cache(maxsize=1)
def corpus_paragraphs() -> tuple[str, ...]:
    """The cleaned built-in paragraphs, in deterministic order."""
    from pydoc_data.topics import topics

    seen: dict[str, None] = {}           # ordered set: some topics repeat others verbatim
    for key in sorted(topics):
        for block in _PARAGRAPH_BREAK.split(topics[key]):
            lines = [line.strip() for line in block.splitlines() if line.strip()]
            if not lines:
                continue
            text = _EMPHASIS.sub(r"\1", " ".join(lines))
            text = re.sub(r"\s+", " ", text)
            if _is_prose(lines, text):
                seen.setdefault(text)
    return tuple(seen)


def corpus_text() -> str:
    """The built-in corpus as one string, paragraphs separated by blank lines."""
    return "\n\n".join(corpus_paragraphs())


def load_text_file(path: str | Path) -> str:
    """Read a corpus: ``*.jsonl`` as one ``{"text": str}`` per line, anything else as text.

    Raises ``ValueError`` naming the path for a missing or empty file, and the line
    number for a bad JSONL line.
    """
    path = require_file(path, "corpus file")
    raw = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".jsonl":
        texts = []
        for line_no, record in jsonl_records(raw.splitlines(), lambda n: f"{path}:{n}"):
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{line_no}: expected an object with a string "
                                 f"field 'text'")
            texts.append(record["text"])
        raw = "\n\n".join(texts)
    if not raw.strip():
        raise ValueError(f"corpus file {str(path)!r} has no text")
    return raw


@functools.lru_cache(maxsize=4)
def paragraphs_of(text: str) -> tuple[str, ...]:
    """Split ``text`` on blank lines, collapsing whitespace; empty pieces dropped."""
    pieces = (re.sub(r"\s+", " ", block).strip() for block in _PARAGRAPH_BREAK.split(text))
    result = tuple(p for p in pieces if p)
    if not result:
        raise ValueError("corpus text is empty")
    return result


def paragraphs(text: str | None = None) -> tuple[str, ...]:
    """The paragraphs of ``text``, or of the built-in corpus when ``text`` is None."""
    return corpus_paragraphs() if text is None else paragraphs_of(text)


def take_tokens(tokenizer: TokenizerLike, num_tokens: int, *, start_paragraph: int = 0,
                text: str | None = None) -> str:
    """About ``num_tokens`` tokens of natural text, from paragraph ``start_paragraph``.

    Whole paragraphs are read in order from ``start_paragraph`` (taken modulo the number
    of paragraphs; the text wraps around when shorter than asked), encoded, cut to exactly
    ``num_tokens`` ids and decoded. Re-encoding the result gives ``num_tokens`` give or
    take a token or two (BPE merges at the cut). ``text`` replaces the built-in corpus.
    Pure: same inputs, same string. Builders give each request its own start paragraph,
    so two prompts never share a prefix by accident.
    """
    if not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
        raise ValueError(f"num_tokens={num_tokens!r} must be an integer >= 1")
    source = paragraphs(text)
    index = int(start_paragraph) % len(source)
    pieces: list[str] = []
    target_chars = 8 * int(num_tokens) + 64    # generous: English BPE is ~4 chars/token
    num_chars = 0
    while True:
        while num_chars < target_chars:
            pieces.append(source[index % len(source)])
            num_chars += len(pieces[-1]) + 2
            index += 1
        ids = encode_text(tokenizer, "\n\n".join(pieces))
        if len(ids) >= num_tokens:
            return tokenizer.decode(ids[:num_tokens])
        if not ids and len(pieces) > len(source):
            raise ValueError("tokenizer.encode returned no tokens for the whole corpus")
        target_chars *= 2


class TextSource:
    """Hands out pieces of corpus text, each from a start paragraph not used before.

    Start paragraphs follow a ``rng`` permutation of the corpus (re-drawn when used up),
    so no two prompts of a workload share a prefix by accident until the workload asks
    for more pieces than the corpus has paragraphs. Mutates ``rng``.
    """

    def __init__(self, tokenizer: TokenizerLike, rng: np.random.Generator,
                 text: str | None = None) -> None:
        self.tokenizer, self.rng, self.text = tokenizer, rng, text
        self._num_paragraphs = len(paragraphs(text))
        self._order: list[int] = []

    def take(self, num_tokens: int) -> str:
        """About ``num_tokens`` tokens of text (see ``take_tokens``)."""
        if not self._order:
            self._order = [int(i) for i in self.rng.permutation(self._num_paragraphs)][::-1]
        return take_tokens(self.tokenizer, num_tokens, start_paragraph=self._order.pop(),
                           text=self.text)

    def num_tokens(self, text: str) -> int:
        return len(encode_text(self.tokenizer, text))
