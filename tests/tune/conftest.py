"""A stub cell runner with a known optimum: deterministic accuracy, memory and speed per
KV spec, so a search can be checked against the exhaustive grid without a model.

    drop %      = CODEC_DROP[codec] + 3 * (1 - budget)        (budget 1: full cache)
    peak KV     = CODEC_BYTES[codec] * budget * 1e6           (every cell of the config)
    tokens/s    = 1e8 / peak KV

With a 2% accuracy budget the memory optimum is ``streaming_llm(budget=0.5)+int8``
(1.9%, 0.5 MB); int4 on the full cache is accurate but holds 0.5625 MB.
"""
from __future__ import annotations

import pytest

from kvmap.bench.backends import LocalBackend
from kvmap.runs.record import CellRecord
from kvmap.kv.grammar import parse

CODEC_DROP = {"bf16": 0.0, "int8": 0.4, "int4": 1.6}


@pytest.fixture(autouse=True)
def bf16_machine(monkeypatch):
    """The stub's figures take bf16 as the full-precision cache: the tune's baseline is
    the machine's ``auto`` dtype, so these tests run with native bf16 forced (the
    choice itself is tested in tests/test_hardware.py)."""
    monkeypatch.setenv("KVMAP_NATIVE_BF16", "1")
CODEC_BYTES = {"bf16": 2.0, "int8": 1.0, "int4": 0.5625}
OPTIMUM = "streaming_llm(budget=0.5)+int8"


def figures(kv: str) -> tuple[float, float]:
    """``(drop %, peak KV bytes)`` of a spec."""
    codec, budget = "bf16", 1.0
    for part in parse(kv):
        if part.name in CODEC_DROP:
            codec = part.name
        if "budget" in part.args:
            budget = float(part.args["budget"])
    return CODEC_DROP[codec] + 3.0 * (1.0 - budget), CODEC_BYTES[codec] * budget * 1e6


class StubRunner:
    """``run_cell(cell, store, on_fraction) -> (record, rows)``; counts what it ran."""

    optimum = OPTIMUM
    figures = staticmethod(figures)

    def __init__(self, ttft_s: float = 0.1, screen_ci_pct: float | None = None):
        self.ran: list = []
        self.ttft_s, self.screen_ci_pct = ttft_s, screen_ci_pct

    def __call__(self, cell, store, on_fraction=lambda f: None):
        self.ran.append(cell)
        drop, peak = figures(cell.kv)
        if cell.task is not None:
            n = cell.task.params["num_samples"]
            metrics = {"ppl": 10.0 * (1 + drop / 100), "ppl_delta_rel": drop / 100,
                       "peak_kv_resident_bytes": peak, "num_samples": n}
            if self.screen_ci_pct and cell.task.name.endswith("-screen"):
                half = self.screen_ci_pct / 100
                metrics["ppl_delta_rel_ci95"] = [drop / 100 - half, drop / 100 + half]
            return CellRecord.of_cell(cell, metrics=metrics), []
        rate = 1e8 / peak
        rows = [{"cell_id": cell.cell_id, "model": cell.model.name, "kv": cell.kv,
                 "workload": cell.job, "request_id": f"r{i}", "arrival_s": 0.0,
                 "ttft_s": self.ttft_s, "tpot_s": 0.01, "e2e_s": 0.2, "tbt_max_s": 0.01,
                 "token_times_s": [self.ttft_s + 0.01 * j for j in range(10)],
                 "num_prompt_tokens": 16, "num_output_tokens": 10, "failed": False}
                for i in range(4)]
        metrics = {"num_requests": 4, "output_throughput_tok_s": rate,
                   "peak_kv_resident_bytes": peak, "duration_s": 40 / rate,
                   "output_throughput_windows_tok_s": [rate * (1 + 0.01 * (i % 2))
                                                       for i in range(10)],
                   "ttft_s": {"p50": self.ttft_s, "p99": self.ttft_s}}
        return CellRecord.of_cell(cell, metrics=metrics), rows

    def backend(self) -> LocalBackend:
        return LocalBackend(self)

    def jobs_of(self, kv: str) -> list[str]:
        return [c.job for c in self.ran if c.kv == kv]


@pytest.fixture
def stub() -> StubRunner:
    return StubRunner()
