"""Every member of every registered family has a test row (DESIGN.md: adding a member is
one file, one registration and one test row). ``ROWS`` maps each family's members to
the test that exercises them -- a parametrized matrix, or the member's own test -- and
fails when a member is registered without one, or a row names a test that is gone."""
from __future__ import annotations

import importlib

import pytest

from kvmap.bench.backends import BENCH_BACKENDS
from kvmap.evals import TASKS
from kvmap.kv.codecs import CODECS
from kvmap.kv.policies import POLICIES
from kvmap.kv.tiers import TIER_BACKENDS
from kvmap.kv.tiers.eviction import EVICTION_ORDERS
from kvmap.kv.tiers.prefetch import PREFETCH_ORDERS
from kvmap.kv.window_layout import WINDOW_LAYOUTS
from kvmap.model.linear import LINEARS
from kvmap.model.wquant import QUANTIZATIONS, WEIGHT_FORMATS
from kvmap.plan.sim.workload import SIM_DRAFTS
from kvmap.workloads.spec import WORKLOAD_KINDS


def _matrix(module: str, name: str, member_of=lambda row: row) -> set[str]:
    """The members a test module's row list covers."""
    rows = getattr(importlib.import_module(module), name)
    return {member_of(getattr(row, "values", [row])[0]) for row in rows}


MATRICES = {   # family -> (registry, members its test matrix covers)
    "codec": (CODECS, lambda: _matrix("tests.kv.test_codecs", "CASES",
                                       lambda c: c.family.partition("-")[0])),
    "policy": (POLICIES, lambda: _matrix("tests.kv.test_policies", "SELECTIVE") | {"full"}),
    "tier backend": (TIER_BACKENDS, lambda: _matrix("tests.kv.tiers.test_tiers", "TIER_NAMES")),
    "eviction order": (EVICTION_ORDERS,
                       lambda: _matrix("tests.kv.tiers.test_tiers", "EVICTION_ROWS")),
    "prefetch order": (PREFETCH_ORDERS,
                       lambda: _matrix("tests.kv.tiers.test_paging", "PREFETCH_ROWS")),
    "weight format": (WEIGHT_FORMATS,
                      lambda: _matrix("tests.model.test_wquant", "FORMAT_ROWS")),
}

OWN_TESTS = {  # family -> member -> "module::test" that exercises it
    "eval task": (TASKS, {
        "ppl": "tests.evals.test_evals::test_ppl_task_identity_quantization_and_policy",
        "generation": "tests.evals.test_evals::test_generation_task",
        "needle": "tests.evals.test_evals::test_needle_task_grid",
        "mc": "tests.evals.test_evals::test_mc_task_on_hellaswag_and_arc",
        "passkey": "tests.evals.test_evals::test_passkey_task_when_available",
        "prompt_ppl": "tests.evals.test_prompt_ppl_topk::"
                      "test_prompt_ppl_keeps_the_top_k_and_compares_it_with_the_baseline",
        "qa": "tests.evals.test_qa::test_qa_task_end_to_end_on_a_file_and_built_in",
        "chat_generation":
            "tests.evals.test_records_and_rates::test_chat_generation_records_on_the_tiny_model",
    }),
    "workload kind": (WORKLOAD_KINDS, {
        "synthetic": "tests.workloads.test_workloads::"
                     "test_throughput_preset_prompts_have_their_lengths_and_no_shared_prefix",
        "long-context": "tests.workloads.test_workloads::test_long_context_preset",
        "multi-turn": "tests.workloads.test_workloads::test_multi_turn_preset_shares_history",
        "mixed": "tests.workloads.test_workloads::"
                 "test_mixed_preset_has_every_kind_and_ordered_arrivals",
        "trace": "tests.workloads.test_workloads::test_trace_is_parsed_sorted_and_replayed",
    }),
    "window layout": (WINDOW_LAYOUTS, {
        "all_global": "tests.kv.test_window_layout::"
                      "test_sliding_layers_keep_everything_and_the_saving_is_measured",
    }),
    "bench backend": (BENCH_BACKENDS, {
        "local": "tests.bench.test_runner::test_run_store_and_summary",
        "ray": "tests.bench.test_ray_backend::test_ray_backend_finds_the_local_results",
    }),
}


@pytest.mark.parametrize("family", MATRICES)
def test_every_member_is_in_its_familys_test_matrix(family):
    registry, covered = MATRICES[family]
    missing = set(registry) - covered()
    assert not missing, f"{family}: no test row for {sorted(missing)}"


@pytest.mark.parametrize("family", OWN_TESTS)
def test_every_member_has_its_own_test(family):
    registry, rows = OWN_TESTS[family]
    assert set(rows) == set(registry), f"{family}: rows {sorted(rows)} for {list(registry)}"
    for member, ref in rows.items():
        module, _, test = ref.partition("::")
        assert callable(getattr(importlib.import_module(module), test, None)), \
            f"{family} {member!r}: {ref} does not exist"


def test_the_simulator_draws_every_workload_kind():
    assert list(SIM_DRAFTS) == list(WORKLOAD_KINDS)


def test_every_weight_format_has_a_layer():
    assert set(LINEARS) == set(QUANTIZATIONS)
