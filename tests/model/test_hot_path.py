"""The decode hot path's shortcuts give the results of the plain path, value for value."""
from __future__ import annotations

import pytest
import torch

from kvmap.kv.spec import KVGeometry
from kvmap.model.shapes import get_shape


@pytest.mark.parametrize("spec", ["int8", "int4", "int2", "fp8",
                                  "int8(granularity=head)", "int4(symmetric=true)"])
def test_joint_kv_write_equals_separate_writes(spec):
    from kvmap.kv.config import KVConfig
    codec = KVConfig.parse(spec).codec
    geom = KVGeometry.of(get_shape("tiny"), 4)
    joint, separate = (codec.allocate(8, geom, "cpu", torch.float32) for _ in range(2))
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(10, geom.num_kv_heads, geom.head_dim, generator=g) * 3 for _ in "kv")
    slots = torch.randperm(32, generator=g)[:10]
    codec.write(joint, slots, k, v)
    codec.quant["k"].write(separate, slots, k)
    codec.quant["v"].write(separate, slots, v)
    assert joint.blocks.keys() == separate.blocks.keys()
    for name in joint.blocks:
        assert torch.equal(joint.blocks[name], separate.blocks[name]), name
