"""What one tune is asked -- model, workload, accuracy task, SLA, budgets -- and the
bench ``Scenario`` it becomes.

The scenario holds every point of the space as a KV configuration, the one workload and
the accuracy task twice: ``<task>-screen`` on ``screen_samples`` samples (the early
rejection; run into a run of its own, ``split_screens``) and ``<task>`` on
``num_samples``. Its samples are the first ones of the full
task's (the evals tasks draw samples in order from the seed), so a screen is a subset.
``kvmap bench`` on the scenario without its screens is the exhaustive grid; the tuner runs a few of
its cells at a time into the same kind of run directory (``executor``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from kvmap.bench.cellspec import CellSpec, Scenario
from kvmap.bench.scenario_parse import parse_scenario
from kvmap.tune.space import TuneSpace

DEFAULT_WORKLOAD = {"name": "throughput", "num_requests": 16, "prompt_len": 128,
                    "output_len": 16, "arrival": "closed:16"}
DEFAULT_TASK_PARAMS = {"context_tokens": 512, "continuation_tokens": 16}


def parse_workload(text: str) -> dict:
    """``"throughput,num_requests=16,arrival=closed:16"`` -> the scenario's workload
    mapping: a name (a preset, or any name with ``kind=...``) then ``key=value`` items."""
    name, *items = [t.strip() for t in str(text).split(",") if t.strip()] or [""]
    if not name or "=" in name:
        raise ValueError(f"--workload {text!r} must start with a workload name (a preset "
                         "such as 'throughput', or a name followed by kind=...)")
    out: dict = {"name": name}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--workload item {item!r} is not key=value")
        out[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return out


@dataclass(frozen=True)
class TuneSetup:
    """A tune's fixed inputs (everything but the space)."""

    model: str = "smollm2"
    workload: dict = field(default_factory=lambda: dict(DEFAULT_WORKLOAD))
    task: str = "ppl"
    task_params: dict = field(default_factory=lambda: dict(DEFAULT_TASK_PARAMS))
    screen_samples: int = 2
    num_samples: int = 8
    engine: dict = field(default_factory=lambda: {"kv_memory": "128MiB"})
    slo: str | None = None
    seed: int = 0
    cell_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for key in ("screen_samples", "num_samples"):
            n = getattr(self, key)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{key}={n!r} must be a positive integer")
        if self.screen_samples >= self.num_samples:
            raise ValueError(f"screen_samples={self.screen_samples} must be fewer than "
                             f"num_samples={self.num_samples}: the screen is the small sample")

    @property
    def screen_task(self) -> str:
        return f"{self.task}-screen"


def build_scenario(setup: TuneSetup, space: TuneSpace, name: str,
                   source: str = "kvmap tune") -> Scenario:
    """The scenario of every point of ``space`` (the baseline first); ``ScenarioError``
    (a ValueError) naming every bad value -- KV specs, workload keys, task parameters,
    SLA metrics -- before any cell runs."""
    from kvmap.hardware import resolve_dtype
    dtype = resolve_dtype("auto", "cpu")      # the baseline: this machine's exact dtype
    kv = list(dict.fromkeys([dtype, *space.all_kv()]))
    engine = dict(setup.engine)
    if space.max_num_seqs:
        engine.setdefault("max_num_seqs", space.max_num_seqs[0])
    params = dict(setup.task_params)
    data = {"name": name, "seed": setup.seed, "models": [setup.model], "engine": engine,
            "kv": kv, "workloads": [dict(setup.workload)],
            "tasks": [{"name": setup.screen_task, "task": setup.task,
                       "params": {**params, "num_samples": setup.screen_samples}},
                      {"name": setup.task, "task": setup.task,
                       "params": {**params, "num_samples": setup.num_samples}}],
            "cell_timeout_s": setup.cell_timeout_s}
    if setup.slo:
        data["slo"] = setup.slo
    scenario = parse_scenario(data, source, Path.cwd(), code=True)   # the user's --task
    if len(scenario.workloads) != 1 or scenario.workloads[0].load is not None:
        raise ValueError(f"--workload {setup.workload!r}: tune takes one workload at one "
                         "load level (no arrival list)")
    return scenario


def split_screens(scenario: Scenario, screen_task: str) -> tuple[Scenario, Scenario]:
    """``(main, screens)``: the scenario without its screen task -- the exhaustive grid,
    whose run is the one ``kvmap report`` reads -- and the screen task alone. Screens
    live in a run of their own (``<run>/screens``) because the report judges a
    configuration by its worst task: a noisy 2-sample screen beside the full task would
    overrule the full task's verdict."""
    main = replace(scenario, tasks=tuple(t for t in scenario.tasks if t.name != screen_task))
    screens = replace(scenario, name=f"{scenario.name}-screens", workloads=(),
                      tasks=tuple(t for t in scenario.tasks if t.name == screen_task))
    return main, screens


class CellBook:
    """The scenario's cells by (KV spec, job), and a workload cell at another
    ``max_num_seqs`` (a scenario of its own engine, so its cell id is its own)."""

    def __init__(self, scenario: Scenario, *others: Scenario):
        self.scenario = scenario
        self.by_key = {(c.kv, c.job): c for s in (scenario, *others) for c in s.cells()}

    @property
    def workload(self) -> str:
        return self.scenario.workloads[0].name

    def cell(self, kv: str, job: str, max_num_seqs: int | None = None) -> CellSpec:
        if max_num_seqs is None or max_num_seqs == self.scenario.engine.max_num_seqs:
            return self.by_key[(kv, job)]
        engine = replace(self.scenario.engine, max_num_seqs=max_num_seqs)
        other = replace(self.scenario, engine=engine, kv=(kv,), tasks=())
        return next(c for c in other.cells() if c.job == job)
