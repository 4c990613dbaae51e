"""The host tier's staging buffer: pageable and reused on the CPU, pinned for CUDA."""
from __future__ import annotations

import pytest
import torch

from kvmap.kv.tiers.host import HostTier


def test_cpu_upload_is_a_plain_copy_of_the_bytes():
    tier = HostTier(1 << 20)
    data = bytes(range(256)) * 3
    out = tier.upload(data, "cpu")
    assert out.dtype == torch.uint8 and out.device.type == "cpu"
    assert bytes(out.numpy()) == data
    assert not out.is_pinned() and not tier.staging(8, "cpu").is_pinned()
    again = tier.upload(b"\x07" * 10, "cpu")        # the buffer is reused, not the result
    assert bytes(out.numpy()) == data and bytes(again.numpy()) == b"\x07" * 10
    big = tier.staging(5000, "cpu")                  # grows on demand
    assert big.numel() == 5000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_upload_goes_through_pinned_memory():
    tier = HostTier(1 << 20)
    data = bytes(range(256)) * 4
    assert tier.staging(len(data), "cuda").is_pinned()
    out = tier.upload(data, "cuda")
    assert out.device.type == "cuda"
    second = tier.upload(b"\x01" * len(data), "cuda")   # waits for the first copy
    assert bytes(out.cpu().numpy()) == data
    assert bytes(second.cpu().numpy()) == b"\x01" * len(data)
