"""A GGUF's SentencePiece vocabulary (``tokenizer.ggml.model == "llama"``) as a HF
``tokenizers`` BPE, for the Gemma family, built as transformers' GGUF converter builds
it (``gemma_tokenizer`` in ``integrations/gguf/gguf_tokenizer_mapping.py``), so that
token ids equal the reference's:

- the file lists pieces, scores and types but no merges: merges are rebuilt from the
  vocabulary -- every split of a piece into two pieces that exist -- ordered by the
  piece's position in the file (Gemma's scores do not follow its merge order; the file
  order does), longer left parts first;
- a piece of two or more spaces is stored as real spaces and looked up as ``▁`` runs,
  so it is respelled first;
- text: spaces become ``▁`` (normalizer), split after each ``▁`` run, BPE with byte
  fallback (``<0x41>`` pieces) for what the vocabulary lacks; decoding reverses it.

Control pieces (type 3, ``<start_of_turn>``) are special tokens, user-defined pieces
(type 4) plain added tokens, both matched whole in text.

Gemma GGUFs carry no chat template; ``GEMMA_CHAT_TEMPLATE`` is Gemma 3's own (from its
``tokenizer_config.json``): turns as ``<start_of_turn>user|model ... <end_of_turn>``,
a system message folded into the first user turn, BOS written by the template.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

SPACE = "\u2581"                                 # SentencePiece's visible space
SENTENCEPIECE_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
_CONTROL, _USER_DEFINED = 3, 4                   # llama.cpp token types

GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def sentencepiece_backend(metadata: Mapping[str, Any]) -> Backend:
    """The ``tokenizers`` backend of a Gemma-family GGUF's SentencePiece vocabulary.
    ValueError naming the architecture for any other family (their normalization
    differs: Llama 2 prepends a space, Phi-3 normalizes differently)."""
    arch = metadata.get("general.architecture")
    if arch not in SENTENCEPIECE_ARCHITECTURES:
        raise ValueError(f"a SentencePiece ('llama') GGUF tokenizer is built for "
                         f"{', '.join(SENTENCEPIECE_ARCHITECTURES)} only, not {arch!r}")
    tokens = [SPACE * len(t) if " " in t and not t.strip() else t
              for t in metadata["tokenizer.ggml.tokens"]]
    types = list(metadata.get("tokenizer.ggml.token_type") or [])
    vocab = {token: index for index, token in enumerate(tokens)}
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else "<unk>"
    backend = Backend(models.BPE(vocab=vocab, merges=merges_by_position(tokens, vocab),
                                 fuse_unk=True, unk_token=unk, byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in zip(tokens, types) if kind == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in zip(tokens, types) if kind == _USER_DEFINED])
    return backend


def merges_by_position(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """BPE merges implied by a vocabulary without merges: for each piece (in file order,
    a later duplicate spelling taking the place of an earlier one), every split into two
    pieces of the vocabulary, ordered by (the piece's position, then longer left part,
    then longer right part), ties in the pieces' ids order -- transformers'
    ``generate_merges`` with the negated position as the score."""
    position = {token: index for index, token in enumerate(tokens)}
    merges = []
    for piece, index in position.items():
        local = [(piece[:i], piece[i:]) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        merges += [(index, left, right) for left, right in local]
    merges.sort(key=lambda m: (-m[0], len(m[1]), len(m[2])), reverse=True)
    return [(left, right) for _, left, right in merges]
