"""``device_peak_bytes`` in a cell's metrics: None on a CPU process, the CUDA
allocator's peak once CUDA is in use."""
from __future__ import annotations

import pytest
import torch

from kvmap.bench.cell import device_peak_bytes


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_initialized(),
                    reason="CUDA already in use in this process")
def test_none_without_cuda_in_use():
    assert device_peak_bytes() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_counts_the_allocators_peak():
    x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    assert device_peak_bytes() >= x.numel()
