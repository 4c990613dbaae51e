"""Bad input is a ValueError naming the value, before any cell runs; the space file and
the CLI's workload form parse into what they say."""
from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvmap.report.constraints import Constraints
from kvmap.tune.run import run_tune
from kvmap.tune.setup import TuneSetup, parse_workload
from kvmap.tune.space import PolicyAxis, TuneSpace, load_space, space_from_dict

SPACE = TuneSpace(codecs=("bf16", "int8"))
BUDGET = Constraints(max_accuracy_drop_pct=2.0)


def _tune(tmp_path, stub, space=SPACE, objective="memory", max_cells=12,
          constraints=BUDGET, setup=None):
    return run_tune(setup or TuneSetup(), space, constraints, objective, tmp_path / "t",
                    max_cells=max_cells, backend=stub.backend(), console=Console(quiet=True))


@pytest.mark.parametrize("kwargs, match", [
    ({"max_cells": 0}, "--max-cells 0"),
    ({"max_cells": 5}, "--max-cells 5 is too small"),
    ({"objective": "cheapest"}, "'cheapest' is not one of throughput, memory, latency"),
    ({"space": TuneSpace(codecs=("bf16",))}, "only the baseline 'bf16'"),
    ({"setup": TuneSetup(slo="bogus_p99=2s")}, "bogus"),
    ({"setup": TuneSetup(workload={"name": "throughput", "num_requets": 4})}, "num_requets"),
])
def test_bad_input_fails_before_any_cell(tmp_path, stub, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _tune(tmp_path, stub, **kwargs)
    assert stub.ran == [] and not (tmp_path / "t").exists()


@pytest.mark.parametrize("data, match", [
    ({"codecs": ["int9"]}, "codec 'int9' is not registered; valid codecs: .*int8"),
    ({"codecs": ["int8"], "policies": [{"name": "h3o"}]},
     "policy 'h3o' is not registered; valid policies: .*h2o"),
    ({"codecs": [], "policies": []}, "the tune space is empty"),
    ({"codecs": ["int8"], "full_cache": False}, "the tune space is empty"),
    ({"codecs": ["int8"], "policies": [{"name": "snapkv", "budgets": [0.5, 0.25]}]},
     r"budgets \[0.5, 0.25\] must increase"),
    ({"codecs": ["int8"], "policies": [{"name": "snapkv", "budgets": [1.5]}]},
     "budget 1.5 must be a fraction"),
    ({"codecs": ["int8"], "max_num_seqs": [0]}, "max_num_seqs 0"),
    ({"codecs": ["int8"], "tier": [None]}, r"unknown key\(s\) \['tier'\]"),
    ({"codecs": ["int8(granularity=bogus)"]}, "bogus"),
])
def test_a_bad_space_names_the_value(data, match):
    with pytest.raises(ValueError, match=match):
        space_from_dict(data, "space.yaml")


def test_the_example_space_file_parses(tmp_path):
    from pathlib import Path
    example = Path(__file__).resolve().parents[2] / "examples" / "tune-space.yaml"
    space = load_space(example)
    assert space.codecs and space.families()
    assert all(kv for kv in space.all_kv())
    with pytest.raises(ValueError, match="does not exist"):
        load_space(tmp_path / "missing.yaml")


def test_a_family_names_its_points_in_budget_order():
    space = TuneSpace(codecs=("int8",), policies=(PolicyAxis("snapkv", (0.25, 0.5),
                                                             {"window": 8}),),
                      full_cache=False, tiers=(None, "tiers(host=64MiB)"))
    assert space.all_kv() == ["snapkv(budget=0.25,window=8)+int8",
                              "snapkv(budget=0.5,window=8)+int8",
                              "snapkv(budget=0.25,window=8)+int8+tiers(host=64MiB)",
                              "snapkv(budget=0.5,window=8)+int8+tiers(host=64MiB)"]


def test_workload_form():
    assert parse_workload("chat,num_requests=8,arrival=closed:4") == {
        "name": "chat", "num_requests": 8, "arrival": "closed:4"}
    with pytest.raises(ValueError, match="must start with a workload name"):
        parse_workload("num_requests=8")
    with pytest.raises(ValueError, match="'oops' is not key=value"):
        parse_workload("chat,oops")


def test_cli_reports_a_bad_value_with_exit_code_2(tmp_path):
    from kvmap.cli import app
    result = CliRunner().invoke(app, ["tune", "--out", str(tmp_path / "t"),
                                      "--objective", "cheapest", "--max-cells", "12"])
    assert result.exit_code == 2
    assert "cheapest" in result.output and not (tmp_path / "t").exists()
    result = CliRunner().invoke(app, ["tune", "--out", str(tmp_path / "t"),
                                      "--max-cells", "0"])
    assert result.exit_code == 2 and "--max-cells 0" in result.output
