"""The sampler's batch pass: greedy tokens and the finite check, against the plain
definitions (argmax; every logit finite), on rows built to break a shortcut."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from kvmap import SamplingParams
from kvmap.engine.sampler import SamplingError, sample

NAN, INF = float("nan"), float("inf")


def _rows() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 4096, generator=g).round()       # rounded: ties for the maximum
    x[1, 3000] = NAN                                     # NaN away from the maximum
    x[2, 17] = INF                                       # +inf
    x[3, 4000] = -INF                                    # -inf at the end
    x[4, :] = -INF                                       # nothing to pick
    x[5, 1000:] = -INF                                   # a -inf tail: not finite either
    x[6, 0] = NAN
    x[6, 1] = INF                                        # NaN first, then +inf
    x[7, 5] = x[7, 9] = x[7].max() + 1                   # two equal maxima: the first
    x[8, 4095] = torch.finfo(torch.float32).max          # finite, as large as fp32 goes
    return x


def test_greedy_and_finite_rows_match_the_definitions():
    x = _rows()
    reqs = [SimpleNamespace(request_id=f"r{i}", params=SamplingParams(), generator=None)
            for i in range(len(x))]
    got = sample(x, reqs)
    want_finite = torch.isfinite(x).all(dim=-1).tolist()
    assert want_finite == [True, False, False, False, False, False, False, True, True]
    for row, (token, finite) in enumerate(zip(got, want_finite)):
        if finite:
            assert token == int(x[row].argmax()), row
        else:
            assert isinstance(token, SamplingError) and f"r{row}" in str(token), (row, token)
    assert got[7] == 5 and got[8] == 4095
