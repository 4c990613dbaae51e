"""Simulator scenario files and the ``kvmap simulate`` command: parsing, errors, CLI."""
from __future__ import annotations

import json

import pytest
import typer
import yaml
from typer.testing import CliRunner

from kvmap.plan.sim.command import register
from kvmap.plan.sim.hardware import Hardware
from kvmap.plan.sim.scenario import (ScenarioError, builtin_names, load_sim_scenario,
                                     parse_bandwidth, parse_duration, parse_flops,
                                     parse_sim_scenario)

SMALL = """
name: small
model: llama-3-8b
hardware: {gpu: h100-80gb}
tiers:
  - {name: host, capacity: 64GiB}
  - {name: nvme, capacity: 1TiB, bandwidth: 5GB/s, latency: 100us}
engine: {max_num_seqs: 8, kv_memory: 2GiB}
workload: {preset: multi-turn, num_requests: 16, prompt_len: 200, output_len: 20}
variants:
  - {name: lru, eviction: lru}
  - {name: arc, eviction: arc, prefetch: queue, engine: {prefetch_depth: 2}}
"""


def parse(text: str):
    return parse_sim_scenario(yaml.safe_load(text), "test.yaml")


def test_parses_variants_and_merges_sections():
    scenario = parse(SMALL)
    lru, arc = scenario.configs
    assert (lru.name, lru.eviction, lru.prefetch) == ("lru", "lru", "none")
    assert (arc.eviction, arc.prefetch) == ("arc", "queue")
    # a variant's engine mapping is merged into the base one, key by key
    assert arc.engine.prefetch_depth == 2 and arc.engine.max_num_seqs == 8
    assert arc.engine.kv_memory_bytes == 2 * 2**30
    host, nvme = arc.tiers
    assert host.bandwidth == 50e9 and host.link == "pcie"          # preset
    assert nvme.bandwidth == 5e9 and nvme.latency_s == pytest.approx(1e-4)   # override
    assert arc.workload.num_requests == 16 and arc.workload.kind == "multi-turn"


@pytest.mark.parametrize("change, needle", [
    ({"engine": {"max_num_seqs": 0}}, "engine.max_num_seqs=0"),
    ({"hardware": {"gpu": "h300"}}, "hardware.gpu: unknown GPU 'h300'"),
    ({"hardware": {"gpu": "h100", "compute_efficiency": 1.5}}, "hardware.compute_efficiency"),
    ({"tiers": [{"name": "host"}]}, "tiers[0].capacity"),
    ({"tiers": [{"name": "cxl", "capacity": "1GiB"}]}, "give bandwidth and latency"),
    ({"tiers": [{"name": "host", "capacity": "1GiB", "latency": "fast"}]},
     "tiers[0].latency='fast'"),
    ({"kv": "int9"}, "kv: unknown KV spec part 'int9'"),
    ({"eviction": "mru"}, "eviction='mru'"),
    ({"prefetch": "oracle"}, "prefetch='oracle'"),
    ({"model": "llama-9"}, "model: unknown model 'llama-9'"),
    ({"workload": {"preset": "throughput", "prompt_len": "zipf:3"}}, "workload.prompt_len"),
    ({"workload": {"preset": "throughput", "colour": 1}}, "'colour'"),
    ({"weights": "int3"}, "weights='int3'"),
    ({"engine": {"hbm_window_tokens": 512}, "tiers": []}, "hbm_window_tokens=512"),
    ({"warp": 9}, "unknown key(s) 'warp'"),
])
def test_bad_values_are_named(change, needle):
    data = yaml.safe_load(SMALL)
    data.pop("variants")
    data.update(change)
    with pytest.raises(ScenarioError) as e:
        parse_sim_scenario(data, "test.yaml")
    assert needle in str(e.value) and "test.yaml" in str(e.value)


def test_every_problem_is_reported_at_once_with_the_variant():
    data = yaml.safe_load(SMALL)
    data["variants"][1]["eviction"] = "mru"
    data["engine"]["block_size"] = -1
    with pytest.raises(ScenarioError) as e:
        parse_sim_scenario(data, "test.yaml")
    message = str(e.value)
    assert "variants[1].eviction='mru'" in message
    assert "variants[0].engine.block_size=-1" in message


def test_units():
    assert parse_duration("80us", "x") == pytest.approx(80e-6)
    assert parse_duration("0.5ms", "x") == pytest.approx(5e-4)
    assert parse_duration(2, "x") == 2.0
    assert parse_bandwidth("7GB/s", "x") == 7e9
    assert parse_bandwidth("1 GiB/s", "x") == 2**30
    assert parse_flops("989T", "x") == 989e12
    assert parse_flops("1.5e12", "x") == 1.5e12
    for bad, fn in (("soon", parse_duration), ("-1GB/s", parse_bandwidth), ("lots", parse_flops)):
        with pytest.raises(ValueError, match="x="):
            fn(bad, "x")


def test_compute_curve_interpolates_in_log_tokens():
    hw = Hardware("h", 2**30, 1e12, 1e11, compute_curve=((1, 0.1), (16, 0.5), (256, 1.0)))
    assert hw.curve_efficiency(1) == 0.1
    assert hw.curve_efficiency(4) == pytest.approx(0.1 + 0.4 * 2 / 4)
    assert hw.curve_efficiency(10**6) == 1.0
    with pytest.raises(ValueError, match="compute_curve"):
        Hardware("h", 2**30, 1e12, 1e11, compute_curve=((16, 0.5), (1, 0.1)))


def test_builtin_scenarios_parse():
    names = builtin_names()
    assert {"int8-batch", "long-context-128k", "lru-thrash-prefetch"} <= set(names)
    for name in names:
        scenario = load_sim_scenario(f"builtin:{name}")
        assert scenario.configs and scenario.description


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    register(app)
    return app


def test_cli_json_and_table(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    runner = CliRunner()
    result = runner.invoke(_app(), ["simulate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["name"] for r in data["results"]] == ["lru", "arc"]
    for r in data["results"]:
        assert r["num_finished"] + r["num_rejected"] == 16
        assert set(r["tiers"]) == {"host", "nvme"}
        assert abs(sum(r["bound_share"].values()) - 1) < 1e-9
        assert "spec sheet x assumed efficiency" in r["config"]["hardware_label"]
    table = runner.invoke(_app(), ["simulate", str(path)])
    assert table.exit_code == 0 and "bottleneck over time" in table.output
    assert "spec sheet x assumed efficiency" in table.output


def test_cli_errors_exit_2(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(_app(), ["simulate", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "error:" in missing.output and "nope.yaml" in missing.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(SMALL.replace("max_num_seqs: 8", "max_num_seqs: zero"))
    result = runner.invoke(_app(), ["simulate", str(bad)])
    assert result.exit_code == 2 and "engine.max_num_seqs='zero'" in result.output


def test_cpu_this_machine_uses_the_measured_profile(monkeypatch):
    from kvmap.plan.sim import machine
    measured = Hardware("cpu-this-machine", 2**34, 1e11, 1e10, compute_efficiency=1.0,
                        bandwidth_efficiency=1.0, layer_overhead_s=1e-4,
                        gpu_memory_utilization=1.0, reserve_bytes=0, source="measured: test",
                        compute_dtype="fp32")
    calls = []
    monkeypatch.setattr(machine, "this_machine",
                        lambda dtype, threads: calls.append((dtype, threads)) or measured)
    data = yaml.safe_load(SMALL)
    data.pop("variants")
    data["hardware"] = {"gpu": "cpu-this-machine", "num_threads": 2, "step_overhead": "1ms"}
    (config,) = parse_sim_scenario(data, "test.yaml").configs
    assert calls == [("auto", 2)]
    assert config.hardware.compute_flops == 1e11 and config.hardware.step_overhead_s == 1e-3
    assert config.kv_costs is None and config.weights == "fp32"   # the calibration's


def test_scaled_profile_is_a_faster_machine():
    from kvmap.plan.sim.hardware import scaled
    hw = Hardware("cpu", 2**34, 1e11, 1e10, step_overhead_s=2e-3, layer_overhead_s=1e-4,
                  seq_overhead_s=1e-5)
    fast = scaled(hw, 2.0)
    assert (fast.compute_flops, fast.memory_bandwidth) == (2e11, 2e10)
    assert (fast.step_overhead_s, fast.layer_overhead_s, fast.seq_overhead_s) == \
        (1e-3, 5e-5, 5e-6)
