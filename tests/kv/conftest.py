"""Every test under tests/kv runs torch on one thread. Their tensors are tiny: with 2
OpenMP threads on a loaded 2-core machine each step waits on thread wake-ups (measured:
3.6 s against 0.05 s for the tier store's conversations, ~30x for the policy tests)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
