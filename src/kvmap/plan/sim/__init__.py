"""At-scale serving simulator: ``kvmap simulate SCENARIO.yaml``.

    from kvmap.plan.sim import load_sim_scenario, simulate
    for config in load_sim_scenario("builtin:int8-batch").configs:
        print(simulate(config).metrics["output_tokens_per_s"])

A discrete-event simulation of continuous batching over a paged KV pool in HBM and tiers
below it (host RAM over PCIe, NVMe, a network pool), timed by a roofline cost model.
Files: ``scenario`` (YAML), ``config`` (one resolved simulation), ``hardware`` (devices,
tiers), ``machine`` (``cpu-this-machine`` on ``kvmap.perf``'s calibration record),
``tier_probe`` (a tier's block move), ``costmodel`` (step time), ``workload``
(lengths and arrival times), ``arrivals`` (open / closed loop, turn order), ``blocks``
(where KV blocks live), ``engine`` (the event loop), ``results``, ``command`` (the CLI).
See ``docs/planning.md``.
"""
from __future__ import annotations

from kvmap.plan.sim.config import EngineSettings, SimConfig
from kvmap.plan.sim.results import SimResult
from kvmap.plan.sim.scenario import ScenarioError, SimScenario, load_sim_scenario
from kvmap.plan.sim.workload import SimRequest, requests_from_spec


def simulate(config: SimConfig, requests: list[SimRequest] | None = None) -> SimResult:
    """Run one configuration over ``requests`` (default: drawn from its workload)."""
    from kvmap.plan.sim.engine import Simulator
    if requests is None:
        if config.workload is None:
            raise ValueError(f"simulation {config.name!r} has no workload and no requests")
        requests = requests_from_spec(config.workload)
    return Simulator(config, requests).run()


__all__ = ["EngineSettings", "ScenarioError", "SimConfig", "SimRequest", "SimResult",
           "SimScenario", "load_sim_scenario", "requests_from_spec", "simulate"]
