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
