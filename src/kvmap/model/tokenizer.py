"""Text <-> token ids, and chat templates, for GGUF files and Hugging Face directories.

A ``Tokenizer`` wraps a HF ``tokenizers.Tokenizer`` (the fast Rust BPE) plus the few facts
the engine needs: which id begins a sequence, which ids end a generation, whether
``encode`` prepends BOS, and the chat template. Build one with

- ``Tokenizer.from_gguf_metadata(metadata)`` -- byte-level BPE (``tokenizer.ggml.model ==
  "gpt2"``) from the vocabulary and merges llama.cpp stores as metadata, or a Gemma
  SentencePiece vocabulary (``"llama"``, ``kvmap.model.sentencepiece``);
- ``Tokenizer.from_hf_dir(path)`` -- a directory with ``tokenizer.json``;
- ``Tokenizer.load(path)`` -- what ``save(path)`` wrote (the weights cache uses this).

Pre-tokenizers. A GGUF names its pre-tokenizer (``tokenizer.ggml.pre``) and llama.cpp maps
that name to split regexes, which we mirror: ``smollm`` (like ``starcoder``) splits every
digit apart, then applies the GPT-2 regex -- exactly the ``Digits(individual_digits) +
ByteLevel`` of SmolLM2's own ``tokenizer.json``. transformers' GGUF loader does not know
``smollm`` and uses the plain GPT-2 regex, which differs wherever whitespace precedes a
digit: ``"\n\n1."`` is ``["\n\n", "1", "."]`` here (and for the model's training
tokenizer) but ``["\n", "\n", "1", "."]`` there.
"""
from __future__ import annotations

import json
import warnings
from datetime import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

# llama.cpp token types (tokenizer.ggml.token_type)
_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_PRE = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais")
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                         "minerva")
_SPLIT_PRE = {**dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx",
                               "pixtral"), _LLAMA3_SPLIT),
              **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT)}

# Control tokens that end a turn in common chat formats; llama.cpp stops on these too.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>",
                "<end_of_turn>", "<|end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@dataclass
class Tokenizer:
    """A fast BPE tokenizer with the model's special ids and chat template.

    ``eos_token_ids`` are all the ids that end a generation (EOS first, then end-of-turn
    tokens found in the vocabulary). ``add_bos``: ``encode`` prepends ``bos_token_id``.
    """

    backend: Backend
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos: bool = False
    chat_template: str | None = None

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (``tokenizer.ggml.*`` keys as Python values)."""
        kind = metadata.get("tokenizer.ggml.model")
        if kind == "llama":
            return cls._from_sentencepiece(metadata)
        if kind != "gpt2":
            raise ValueError(f"tokenizer.ggml.model={kind!r} is not supported; only byte-level "
                             "BPE ('gpt2') and Gemma SentencePiece ('llama') GGUF "
                             "tokenizers can be built")
        tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        token_types = list(metadata.get("tokenizer.ggml.token_type") or [])
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges") or []]
        vocab = {_byte_level_spelling(t): i for i, t in enumerate(tokens)}
        backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        backend.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
        # A control token spelled outside the byte alphabet is a converter mislabel; adding
        # it would grow the vocabulary past the model's (transformers skips these too).
        typed = [(t, kind) for t, kind in zip(tokens, token_types) if _byte_level_spelling(t) == t]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t, kind in typed if kind == _CONTROL])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, kind in typed if kind == _USER_DEFINED])

        bos = metadata.get("tokenizer.ggml.bos_token_id")
        eos_ids = [metadata.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
        control = {t for t, kind in typed if kind == _CONTROL}
        eos_ids += [tokens.index(t) for t in _END_OF_TURN if t in control]
        return cls(backend=backend, bos_token_id=None if bos is None else int(bos),
                   eos_token_ids=_unique_ids(eos_ids),
                   add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=metadata.get("tokenizer.chat_template"))

    @classmethod
    def _from_sentencepiece(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        from kvmap.model.sentencepiece import GEMMA_CHAT_TEMPLATE, sentencepiece_backend
        backend = sentencepiece_backend(metadata)
        tokens = metadata["tokenizer.ggml.tokens"]
        bos = metadata.get("tokenizer.ggml.bos_token_id")
        eos_ids = [metadata.get("tokenizer.ggml.eos_token_id")]
        eos_ids += [backend.token_to_id(t) for t in _END_OF_TURN if _is_special(backend, t)]
        return cls(backend=backend, bos_token_id=None if bos is None else int(bos),
                   eos_token_ids=_unique_ids(eos_ids),
                   add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
                   chat_template=metadata.get("tokenizer.chat_template") or (
                       GEMMA_CHAT_TEMPLATE if "<start_of_turn>" in tokens else None))

    @classmethod
    def from_hf_dir(cls, path: str | Path,
                    eos_token_ids: Sequence[int] = ()) -> Tokenizer:
        """Build from a HF model directory's ``tokenizer.json`` (+ ``tokenizer_config.json``).

        ``eos_token_ids`` (from ``config.json``) are added to the tokenizer's own EOS.
        """
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"no tokenizer.json in {str(path)!r}")
        backend = Backend.from_file(str(path / "tokenizer.json"))
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        bos = _token_id(backend, cfg.get("bos_token"))
        eos = [_token_id(backend, cfg.get("eos_token")), *eos_token_ids]
        eos += [backend.token_to_id(t) for t in _END_OF_TURN if _is_special(backend, t)]
        add_bos = cfg.get("add_bos_token")
        if add_bos is None:      # no flag: does the tokenizer's own post-processor add BOS?
            ids = backend.encode("a", add_special_tokens=True).ids
            add_bos = bos is not None and ids[:1] == [bos]
        return cls(backend=backend, bos_token_id=bos, eos_token_ids=_unique_ids(eos),
                   add_bos=bool(add_bos), chat_template=_hf_chat_template(path, cfg))

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_meta.json`` into the directory ``path``."""
        path = Path(path)
        self.backend.save(str(path / "tokenizer.json"))
        meta = {"bos_token_id": self.bos_token_id, "eos_token_ids": list(self.eos_token_ids),
                "add_bos": self.add_bos, "chat_template": self.chat_template}
        (path / "tokenizer_meta.json").write_text(json.dumps(meta, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read what ``save`` wrote."""
        path = Path(path)
        meta = json.loads((path / "tokenizer_meta.json").read_text())
        return cls(backend=Backend.from_file(str(path / "tokenizer.json")),
                   bos_token_id=meta["bos_token_id"],
                   eos_token_ids=tuple(meta["eos_token_ids"]), add_bos=meta["add_bos"],
                   chat_template=meta["chat_template"])

    # ---- use ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; BOS prepended when ``add_bos`` (default: the model's flag)
        and the text does not begin with it already.

        Special-token strings in ``text`` (``<|im_start|>``) become their single ids, so a
        rendered chat template (Gemma's writes BOS itself) encodes as the model expects.
        """
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None \
                and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens dropped when ``skip_special_tokens``."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render ``messages`` ([{"role", "content"}]) with the model's Jinja2 chat template.

        The template runs in a sandboxed Jinja2 environment, as in transformers; a model
        without a template gets ChatML. Extra ``kwargs`` reach the template as variables.
        """
        template = _compiled_template(self.chat_template or CHATML_TEMPLATE)
        special = {"bos_token": self._token_text(self.bos_token_id),
                   "eos_token": self._token_text(self.eos_token_ids[0]
                                                 if self.eos_token_ids else None)}
        return template.render(messages=list(messages),
                               add_generation_prompt=add_generation_prompt,
                               **{**special, **kwargs})

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")


# ---- helpers -----------------------------------------------------------------------------
def _pre_tokenizer(name: str | None) -> pre_tokenizers.PreTokenizer:
    """The HF pre-tokenizer matching llama.cpp's ``tokenizer.ggml.pre`` name."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name is None or name in _GPT2_PRE:
        return byte_level
    if name in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        byte_level])
    if name in _SPLIT_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PRE[name]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    warnings.warn(f"tokenizer.ggml.pre={name!r} is not known; using the GPT-2 split regex, "
                  "token ids may differ from llama.cpp's", stacklevel=3)
    return byte_level


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (``bytes_to_unicode``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _byte_level_spelling(token: str) -> str:
    """A vocabulary entry spelled in GPT-2's byte alphabet (files sometimes store raw text)."""
    alphabet = _byte_alphabet()
    if set(token) <= _byte_chars():
        return token
    return "".join(alphabet[b] for b in token.encode("utf-8"))


@lru_cache(maxsize=1)
def _byte_chars() -> frozenset[str]:
    return frozenset(_byte_alphabet().values())


def _unique_ids(ids: Sequence[int | None]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def _token_id(backend: Backend, token: str | Mapping | None) -> int | None:
    if isinstance(token, Mapping):       # {"content": "<s>", ...} in older configs
        token = token.get("content")
    return None if token is None else backend.token_to_id(token)


def _is_special(backend: Backend, token: str) -> bool:
    token_id = backend.token_to_id(token)
    return token_id is not None and token in {
        t.content for t in backend.get_added_tokens_decoder().values() if t.special}


def _hf_chat_template(path: Path, cfg: Mapping[str, Any]) -> str | None:
    """The default chat template of a HF directory (``chat_template.jinja`` or the config)."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    template = cfg.get("chat_template")
    if isinstance(template, list):      # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default", next(iter(named.values()), None))
    return template


@lru_cache(maxsize=8)
def _compiled_template(source: str):
    """Compile a chat template in a sandbox, with the helpers HF templates expect."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=False)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
