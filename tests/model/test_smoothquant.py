"""SmoothQuant for ``w8a8`` (``model/smoothquant.py``): the migration is exact in real
arithmetic, it cuts the quantization error of an activation with an outlier channel,
and a w8a8 model holds smoothed q|k|v and gate|up, plain W8A8 o and W8A16 down."""
from __future__ import annotations

import torch

from kvmap.model.linear import Int8Linear, W8A8Linear
from kvmap.model.smoothquant import calibration_ids, smooth_scales
from tests.conftest import make_tiny_llm


def test_migration_is_exact_in_real_arithmetic():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=g).double(), torch.randn(32, 64, generator=g).double()
    s = smooth_scales(x.abs().amax(0), w).double()
    assert torch.allclose((x / s) @ (w * s).T, x @ w.T, atol=1e-9)


def test_smoothing_cuts_the_error_of_an_outlier_channel():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g)
    x[:, 5] *= 100                                     # one channel 100x the others
    exact = x @ w.T
    s = smooth_scales(x.abs().amax(0), w)
    plain = (W8A8Linear(w)(x) - exact).norm()
    smoothed = (W8A8Linear(w * s, None, 1 / s)(x) - exact).norm()
    assert smoothed < 0.5 * plain


def test_w8a8_model_layers():
    llm = make_tiny_llm(quantization="w8a8")
    for layer in llm.engine.model.layers:
        assert isinstance(layer["qkv"], W8A8Linear) and layer["qkv"].in_scale is not None
        assert isinstance(layer["gate_up"], W8A8Linear) and layer["gate_up"].in_scale is not None
        assert isinstance(layer["o"], W8A8Linear) and layer["o"].in_scale is None
        assert type(layer["down"]) is Int8Linear
    assert isinstance(llm.engine.model.head, Int8Linear)


def test_calibration_ids_without_a_tokenizer_are_seeded():
    a, b = calibration_ids(None, 256), calibration_ids(None, 256)
    assert a == b and len(a) == 4 and all(len(ids) == 512 for ids in a)
    assert all(0 <= t < 256 for ids in a for t in ids)


def test_int8_model_smooths_and_stays_w8a16():
    llm = make_tiny_llm(quantization="int8")
    for layer in llm.engine.model.layers:
        assert all(type(lin) is Int8Linear for lin in layer.values())
        assert layer["qkv"].in_scale is not None and layer["gate_up"].in_scale is not None
        assert layer["o"].in_scale is None and layer["down"].in_scale is None
