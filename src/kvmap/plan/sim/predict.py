"""The simulator's prediction of a bench cell, stored beside its measurement.

``kvmap bench`` hands the runner a :class:`CellPredictor` (``run_scenario(predict=...)``;
the runner itself imports nothing of ``plan``). After each workload cell the predictor
simulates the cell's own configuration -- model, KV spec, pool (the engine's exact block
count), block size, token budget, sequence limit -- over the cell's own requests (prompt
and output token counts, arrival times or the closed loop's concurrency, conversations)
on the run's own hardware profile (``cpu-this-machine``: the profile's rates and the
calibration record of its class and dtype, the one the budget estimate uses,
:mod:`kvmap.plan.sim.machine`), and the record stores the result as ``prediction``:

    {"hardware": label, "calibration": its source, "kv_costs": source, "metrics": {output_tokens_per_s, ttft_p50_s,
     tbt_p50_s, e2e_mean_s, concurrency_max}, "time_s": {resource: s},
     "roofline": {weight_bytes, kv_capacity_bytes, kv_bytes_per_token, ridge_num_seqs},
     "gpu": {the same configuration and requests on a catalogued GPU, spec sheet}}

A cell that ran on another machine (another profile fingerprint) is not predicted: the
record says why (``{"skipped": ...}``). A failure of the simulation never fails the cell
(``{"error": ...}``).
"""
from __future__ import annotations

import math
from dataclasses import replace

from kvmap.plan.catalogue import PlanModel
from kvmap.plan.sim.config import EngineSettings, SimConfig
from kvmap.plan.sim.costmodel import model_cost
from kvmap.plan.sim.hardware import Hardware, gpu_hardware
from kvmap.plan.sim.kvcost import bytes_only
from kvmap.plan.sim.workload import SimRequest

DEFAULT_GPU = "h100-80gb"        # the planner's most common GPU (built-in scenarios)
MAX_RIDGE_SEQS = 4096


def requests_from_rows(rows: list[dict]) -> list[SimRequest]:
    """The cell's requests as the simulator takes them (failed ones without counts are
    left out): exact token counts, scheduled arrivals (None in a closed loop),
    conversations and turns."""
    out = []
    for row in rows:
        prompt, output = row.get("num_prompt_tokens"), row.get("num_output_tokens")
        if not prompt or not output:
            continue
        out.append(SimRequest(str(row["request_id"]), int(prompt), int(output),
                              row.get("scheduled_arrival_s"), row.get("conversation_id"),
                              int(row.get("turn") or 0)))
    return out


def ridge_num_seqs(mc, hw: Hardware) -> int | None:
    """The decode batch at which the step's matrix products, at the machine's peak rate,
    take as long as reading the weights once: past it a step is compute-bound (None:
    beyond ``MAX_RIDGE_SEQS``)."""
    read_s = mc.weight_bytes_per_device / hw.effective_bandwidth
    per_seq_s = (mc.dense_flops_per_token + mc.lm_head_flops) / hw.effective_flops
    n = math.ceil(read_s / per_seq_s)
    return n if n <= MAX_RIDGE_SEQS else None


def summarize(result) -> dict:
    m = result.metrics

    def stat(key: str, name: str):
        value = m.get(key)
        return value.get(name) if isinstance(value, dict) else None
    return {"output_tokens_per_s": m.get("output_tokens_per_s"),
            "ttft_p50_s": stat("ttft_s", "p50"), "tbt_p50_s": stat("tbt_s", "p50"),
            "e2e_mean_s": stat("e2e_s", "mean"), "concurrency_max": result.kv["max_running"],
            "concurrency_mean": result.kv["mean_running"],
            "num_preemptions": result.num_preemptions}


def sim_config(cell, record: dict, hw: Hardware, kv_costs, name: str,
               tiers: tuple = ()) -> SimConfig:
    """The cell's configuration on ``hw``: its pool to the block (``num_kv_blocks`` of
    the record), its engine settings and weights, the KV spec's ``tiers`` as given."""
    from kvmap.kv.config import KVConfig
    from kvmap.kv.spec import KVGeometry
    from kvmap.model.loader import model_config_of
    from kvmap.plan.capacity import COMPUTE_DTYPE
    config = model_config_of(cell.model.name, cell.model.dtype)
    kv = KVConfig.parse(cell.kv, dtype=cell.model.dtype)
    e, metrics = cell.engine, record.get("metrics") or {}
    block_size = metrics.get("kv_block_size") or e.block_size
    block_bytes = kv.codec.block_bytes(KVGeometry.of(config, block_size), COMPUTE_DTYPE)
    num_blocks = metrics.get("num_kv_blocks")
    engine = EngineSettings(block_size=block_size, max_num_seqs=e.max_num_seqs,
                            max_num_batched_tokens=e.max_num_batched_tokens,
                            enable_prefix_caching=e.enable_prefix_caching,
                            kv_memory_bytes=num_blocks * block_bytes if num_blocks else None)
    weights = cell.model.quantization or (cell.model.dtype if cell.model.dtype in
                                          ("fp32", "bf16") else "bf16")
    return SimConfig(name=name, model=PlanModel(config), hardware=hw, kv=kv,
                     workload=cell.workload.spec(cell.seed), weights=weights,
                     engine=engine, kv_costs=kv_costs, tiers=tiers)


def predict(cell, record: dict, rows: list[dict], hw: Hardware, kv_costs,
            gpu: str | None = DEFAULT_GPU, tiers: tuple = ()) -> dict:
    """The prediction of one cell on ``hw`` (see the module docstring); ``tiers``: the
    KV spec's tiers as this machine moves blocks (:func:`machine.tiers`)."""
    from kvmap.plan.sim import simulate
    requests = requests_from_rows(rows)
    if not requests:
        return {"skipped": "no request of the cell finished with token counts"}
    config = sim_config(cell, record, hw, kv_costs, cell.cell_id, tiers)
    result = simulate(config, requests)
    mc = model_cost(config.model, config.kv, hw, config.engine.block_size, config.weights,
                    kv_costs)
    out = {"hardware": hw.label,
           "calibration": None if hw.calibration is None else hw.calibration.source,
           "kv_costs": None if kv_costs is None else kv_costs.source,
           "metrics": summarize(result), "time_s": dict(result.time_s),
           "bound_share": dict(result.bound_share),
           "roofline": {"weight_bytes": mc.weight_bytes,
                        "kv_capacity_bytes": config.engine.kv_memory_bytes,
                        "kv_bytes_per_token": mc.kv_bytes_per_token,
                        "ridge_num_seqs": ridge_num_seqs(mc, hw)},
           "approximations": approximations(cell, config)}
    if cell.slo:                    # the SLA's evidence as the search reads a level's
        from kvmap.metrics.evidence import slo_attainment
        target = ((cell.workload.search if cell.workload else None) or {}).get("attainment")
        out["slo_attainment"] = slo_attainment(list(result.records), cell.slo,
                                               target or 0.99)
    if gpu:
        from kvmap.kv.config import KVConfig
        gpu_hw = gpu_hardware(gpu)
        # a GPU computes in bf16: a spec without a codec stores bf16 there
        gpu_config = replace(config, hardware=gpu_hw, name=f"{cell.cell_id}@{gpu}",
                             weights="bf16" if config.weights == "fp32" else config.weights,
                             kv=KVConfig.parse(cell.kv, dtype="bf16"),
                             kv_costs=bytes_only(cell.kv), tiers=gpu_tiers(config.tiers))
        gpu_result = simulate(gpu_config, requests)
        out["gpu"] = {"name": gpu_hw.name, "hardware": gpu_hw.label,
                      "metrics": summarize(gpu_result),
                      "bound_share": dict(gpu_result.bound_share)}
    return out


def gpu_tiers(tiers: tuple) -> tuple:
    """The same tiers below a GPU: host RAM over PCIe, a disk as an NVMe drive
    (``TIER_PRESETS``), their capacities kept."""
    from kvmap.plan.sim.hardware import TIER_PRESETS, TierHardware
    preset = {"host": "host", "disk": "nvme"}
    return tuple(TierHardware(name=t.name, capacity_bytes=t.capacity_bytes,
                      **TIER_PRESETS[preset.get(t.name, "network")]) for t in tiers)


def approximations(cell, config: SimConfig) -> list[str]:
    """What of the cell the simulator does not model, in words."""
    notes = []
    if cell.model.quantization:
        notes.append(f"{cell.model.quantization} weights: their bytes counted, their "
                     f"kernels timed at the dense compute curve")
    if config.kv.tiers is not None and not config.tiers:
        notes.append("tiers of the KV spec not simulated (the pool only)")
    if config.kv.tiers is not None and config.kv.tiers.fetch != "always":
        notes.append("the tiered store's fetch-or-recompute rule: every block found in a "
                     "tier is fetched")
    return notes


class CellPredictor:
    """``predict`` for the bench runner: this machine measured once (cached per machine),
    each KV configuration's costs once; ``gpu``: the GPU simulated beside (None: none)."""

    def __init__(self, gpu: str | None = DEFAULT_GPU):
        self.gpu = gpu
        self._hardware: dict = {}

    def local(self) -> CellPredictor:
        """The same machine without the GPU beside (the search's capacity prediction)."""
        other = CellPredictor(gpu=None)
        other._hardware = self._hardware
        return other

    def _machine(self, dtype: str, num_threads: int | None):
        from kvmap.hardware import detect
        from kvmap.plan.sim import machine
        key = (dtype, num_threads)
        if key not in self._hardware:
            self._hardware[key] = (detect(num_threads).fingerprint,
                                   machine.this_machine(dtype, num_threads))
        return self._hardware[key]

    def __call__(self, cell, record: dict, rows: list[dict]) -> dict:
        from kvmap.plan.sim import machine
        env = record.get("env") or {}
        threads = env.get("num_threads") or cell.engine.num_threads
        try:
            fingerprint, hw = self._machine(cell.model.dtype, threads)
            ran_on = (env.get("hardware") or {}).get("fingerprint")
            if ran_on and ran_on != fingerprint:
                return {"skipped": f"the cell ran on another machine (profile {ran_on}, "
                                   f"this one {fingerprint})"}
            from kvmap.model.loader import model_config_of
            config = model_config_of(cell.model.name, cell.model.dtype)
            tiers = machine.tiers(cell.kv, config, cell.model.dtype, threads)
            return predict(cell, record, rows, hw, None, self.gpu, tiers)
        except (ValueError, RuntimeError, OSError, KeyError) as e:
            return {"error": f"{type(e).__name__}: {e}"}



def bench_predictor(choice: str) -> CellPredictor:
    """``kvmap bench --predict``'s predictor: a catalogued GPU beside this machine, or
    'cpu' for none. ValueError for a GPU the catalogue does not know."""
    from kvmap.plan.catalogue import get_gpu
    return CellPredictor(gpu=None if choice.lower() == "cpu" else get_gpu(choice).name)
