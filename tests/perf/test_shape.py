"""Every weight format and every codec has a byte rule in ``kvmap.perf``."""
from __future__ import annotations

import pytest

from kvmap.model.loader import model_config_of
from kvmap.model.wquant import WEIGHT_FORMATS
from kvmap.perf.shape import DENSE_BYTES, WEIGHT_BYTES, StepShape


def test_every_weight_format_has_a_byte_rule():
    assert set(WEIGHT_FORMATS) <= set(WEIGHT_BYTES), set(WEIGHT_FORMATS) - set(WEIGHT_BYTES)


@pytest.mark.parametrize("quantization", [None, *WEIGHT_FORMATS])
def test_weight_bytes_follow_the_format(quantization):
    config = model_config_of("dummy:tiny", "fp32")
    dense = StepShape.of(config, "fp32")
    shape = StepShape.of(config, "fp32", quantization)
    width = WEIGHT_BYTES[quantization] if quantization else DENSE_BYTES["fp32"]
    assert shape.weight_bytes == pytest.approx(dense.weight_bytes * width / 4.0)
    assert shape.prefill_flop == dense.prefill_flop


def test_a_format_without_a_rule_is_named():
    config = model_config_of("dummy:tiny", "fp32")
    with pytest.raises(ValueError, match="'nf4'"):
        StepShape.of(config, "fp32", "nf4")
