"""A calibration file with NaN bounds, lo > hi or mismatched shapes is refused on load."""
from __future__ import annotations

import json

import pytest
import torch

from kvmap.kv.codecs.calibrate import FORMAT, load_ranges, save_ranges


def ranges(num_layers=2, H=3, D=4):
    return [{"k.lo": -torch.ones(H, D), "k.hi": torch.ones(H, D),
             "v.lo": -2 * torch.ones(H, D), "v.hi": 2 * torch.ones(H, D)}
            for _ in range(num_layers)]


@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
def test_good_ranges_round_trip(tmp_path, suffix):
    path = save_ranges(tmp_path / f"r{suffix}", ranges())
    assert all(torch.equal(a[k], b[k]) for a, b in zip(load_ranges(path), ranges())
               for k in a)


@pytest.mark.parametrize("suffix", [".json", ".safetensors"])
@pytest.mark.parametrize("damage, message", [
    (lambda r: r[1]["k.lo"].__setitem__((0, 0), float("nan")), "NaN or infinite"),
    (lambda r: r[0]["v.hi"].__setitem__((2, 3), float("inf")), "NaN or infinite"),
    (lambda r: r[1]["v.lo"].__setitem__((1, 1), 5.0), "lo > hi"),
    (lambda r: r[0].__setitem__("k.hi", torch.ones(3, 5)), "shapes"),
])
def test_bad_ranges_are_refused_naming_layer_and_key(tmp_path, suffix, damage, message):
    r = ranges()
    damage(r)
    path = save_ranges(tmp_path / f"r{suffix}", r)
    with pytest.raises(ValueError, match=message):
        load_ranges(path)


def test_empty_file_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "layers": []}))
    with pytest.raises(ValueError, match="no layers"):
        load_ranges(path)
