"""One model of a step: the simulator's ``step_time`` is the budget estimate's
``seconds_of`` one step at a time (a decode step, a prefill chunk), same calibration."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvmap.model.loader import model_config_of
from kvmap.perf.calibration import CALIBRATION, shipped
from kvmap.perf.rates import Rates
from kvmap.perf.roofline import seconds_of, step_time
from kvmap.perf.shape import StepShape

CHUNK = 256


def _work(**counts):
    base = dict(prefill_tokens=0, prefill_pairs=0, decode_steps=0, decode_tokens=0,
                decode_pairs=0, num_requests=0)
    return SimpleNamespace(**{**base, **counts})


@pytest.mark.parametrize("cal", [CALIBRATION, *shipped()],
                         ids=lambda c: f"{c.machine_class}-{c.dtype}")
@pytest.mark.parametrize("codec", ["bf16", "int8", "int4"])
def test_a_step_is_the_estimates_terms_one_step_at_a_time(cal, codec):
    config = model_config_of("dummy:tiny", "float32")
    shape = StepShape.of(config, cal.dtype)
    rates = Rates.of(None, cal.dtype, None, cal)
    decode = step_time(shape, rates, codec, cal, prefill_tokens=0, prefill_pairs=0,
                       decode_tokens=8, decode_pairs=8 * 300)
    _, want = seconds_of(_work(decode_steps=1, decode_tokens=8, decode_pairs=8 * 300),
                         shape, rates, codec, CHUNK, cal)
    assert decode.total_s == pytest.approx(want)
    chunk = step_time(shape, rates, codec, cal, prefill_tokens=CHUNK,
                      prefill_pairs=CHUNK * (CHUNK + 1) // 2, decode_tokens=0, decode_pairs=0)
    want, _ = seconds_of(_work(prefill_tokens=CHUNK, prefill_pairs=CHUNK * (CHUNK + 1) // 2),
                         shape, rates, codec, CHUNK, cal)
    assert chunk.total_s == pytest.approx(want) and chunk.stream_s == 0
    mixed = step_time(shape, rates, codec, cal, prefill_tokens=CHUNK, prefill_pairs=1000,
                      decode_tokens=8, decode_pairs=2400)
    assert mixed.total_s < chunk.total_s + decode.total_s     # one dispatch, not two
