"""One byte tokenizer: a dummy model's text has the same ids in ``kvmap serve`` and in
``kvmap loadgen --tokenizer bytes`` (and the bench cell, once it uses this class)."""
from __future__ import annotations

import pytest

from kvmap.loadgen.prompts import load_tokenizer
from kvmap.model.byte_tokenizer import ByteTokenizer
from kvmap.config import EngineArgs
from kvmap.server.engines import make_engine_factory

TEXT = "The pass key is 84606. Ünïcödé → 東京 🚀\n"


def test_server_and_loadgen_tokenize_a_dummy_model_alike():
    engine, _ = make_engine_factory(EngineArgs(model="dummy:tiny", dtype="fp32", kv="bf16",
                                               num_blocks=8, device="cpu"))
    served, loadgen = engine.tokenizer, load_tokenizer("bytes")
    assert isinstance(served, ByteTokenizer) and isinstance(loadgen, ByteTokenizer)
    ids = served.encode(TEXT)
    assert ids == loadgen.encode(TEXT) == list(TEXT.encode("utf-8"))
    assert served.decode(ids) == loadgen.decode(ids) == TEXT
    assert served.eos_token_ids == tuple(engine.model_config.eos_token_ids)


def test_byte_ids_and_their_edges():
    tok = ByteTokenizer(bos_token_id=1, eos_token_ids=(2,))
    assert tok.vocab_size == 256 and tok.encode("a", add_bos=True) == [1, 97]
    assert tok.decode([104, 105, 300, 2], skip_special_tokens=True) == "hi"   # >= 256: none
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"          # a partial character
    assert ByteTokenizer(100).encode("é") == [b % 100 for b in "é".encode()]
    with pytest.raises(ValueError, match="model_vocab_size=0"):
        ByteTokenizer(0)
