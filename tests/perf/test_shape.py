"""Every weight format has a byte rule in ``kvmap.perf``; the bytes a step streams follow it."""
from __future__ import annotations

import pytest

from kvmap.model.loader import model_config_of
from kvmap.model.wquant import QUANTIZATIONS, WEIGHT_FORMATS
from kvmap.perf.shape import StepShape
from kvmap.perf.weights import ENGINE_RULES, engine_weight_bytes


def test_every_weight_format_has_a_byte_rule():
    assert set(QUANTIZATIONS) <= set(ENGINE_RULES), set(QUANTIZATIONS) - set(ENGINE_RULES)


@pytest.mark.parametrize("quantization", [None, *WEIGHT_FORMATS])
def test_a_step_streams_the_engines_weights_less_a_looked_up_embedding(quantization):
    config = model_config_of("dummy:tiny", "fp32")
    shape = StepShape.of(config, "fp32", quantization)
    held = engine_weight_bytes(config, quantization, 4)
    embedding = config.vocab_size * config.hidden_size * 4
    shared = config.tie_word_embeddings and quantization is None
    assert shape.weight_bytes == held - (0 if shared else embedding)
    assert shape.prefill_flop == StepShape.of(config, "fp32").prefill_flop


def test_a_format_without_a_rule_is_named():
    config = model_config_of("dummy:tiny", "fp32")
    with pytest.raises(ValueError, match="'nf4'"):
        StepShape.of(config, "fp32", "nf4")


def test_a_sliding_layer_computes_the_pairs_inside_its_window():
    """Gemma 3 270M: 15 layers of a 512-token window, 3 global (``shapes.py``). A prompt
    of 4,096 tokens: a global layer computes 4096^2/2 pairs, a sliding one
    4096 x 512 - 512^2/2 (hand-computed); a decoded token reads at most 512 in a sliding
    layer. A model without windows keeps every pair."""
    config = model_config_of("gemma3-270m", "bf16")
    shape = StepShape.of(config, "bf16")
    assert dict(shape.attn_windows) == {512: 15 / 18, None: 3 / 18}
    per_layer = shape.attn_flop_per_pair / 18
    pairs = 4096 * 4096 / 2
    want = per_layer * (3 * pairs + 15 * (4096 * 512 - 512 * 512 / 2))
    assert shape.prefill_attention_flop(pairs, 4096, 1) == pytest.approx(want)
    # two prompts of 300 tokens sit inside the window: every pair counts
    short = 2 * 300 * 300 / 2
    assert shape.prefill_attention_flop(short, 600, 2) == pytest.approx(
        shape.attn_flop_per_pair * short)
    # 10 tokens decoded at a 2,000-token context
    assert shape.decode_attention_flop(10 * 2000, 10) == pytest.approx(
        per_layer * (3 * 20000 + 15 * 10 * 512))
    llama = StepShape.of(model_config_of("dummy:tiny", "fp32"), "fp32")
    assert llama.prefill_attention_flop(pairs, 4096, 1) == llama.attn_flop_per_pair * pairs
