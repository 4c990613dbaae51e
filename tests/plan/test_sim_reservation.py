"""The simulator's ``reservation`` option: contiguous max-length reservation vs paged."""
from __future__ import annotations

import pytest

from kvmap.kv.config import KVConfig
from kvmap.plan.catalogue import get_model
from kvmap.plan.sim import EngineSettings, SimConfig, SimRequest, simulate
from kvmap.plan.sim.costmodel import model_cost
from kvmap.plan.sim.scenario import parse_engine

from tests.plan.test_sim import ideal_hardware

MODEL = get_model("llama-3-8b")
POOL_BLOCKS = 64


def config(reservation: str, reservation_tokens: int | None = 256) -> SimConfig:
    hw = ideal_hardware()
    kv = KVConfig.parse("bf16")
    block_bytes = model_cost(MODEL, kv, hw, 16, "bf16").kv_block_bytes_per_device
    return SimConfig(name=reservation, model=MODEL, hardware=hw, kv=kv, workload=None,
                     engine=EngineSettings(max_num_seqs=32, max_num_batched_tokens=4096,
                                           kv_memory_bytes=POOL_BLOCKS * block_bytes,
                                           reservation=reservation,
                                           reservation_tokens=reservation_tokens))


def requests(n: int = 20) -> list[SimRequest]:
    # 96-token prompts (6 blocks of 16), one output token: done after prefill
    return [SimRequest(f"r{i}", 96, 1, arrival_s=0.0) for i in range(n)]


def test_contiguous_admits_fewer_sessions_exact():
    paged = simulate(config("paged"), requests())
    contiguous = simulate(config("contiguous"), requests())
    assert paged.kv["max_running"] == POOL_BLOCKS // 6           # 10
    assert contiguous.kv["max_running"] == POOL_BLOCKS // 16     # 256-token reservations
    assert paged.num_finished == contiguous.num_finished == 20


def test_contiguous_reservation_larger_than_pool_is_rejected():
    result = simulate(config("contiguous", reservation_tokens=POOL_BLOCKS * 16 + 1),
                      requests(2))
    assert result.num_finished == 0 and result.num_rejected == 2


def test_reservation_bad_value_names_choices():
    with pytest.raises(ValueError, match="reservation='static'.*paged, contiguous"):
        EngineSettings(reservation="static")
    assert parse_engine({"reservation": "contiguous"}).reservation == "contiguous"
