"""Scenario files: YAML -> a frozen ``Scenario`` -> the list of ``CellSpec`` to run.

A scenario names models, KV configurations (spec strings), workloads, accuracy tasks and
an SLO; the bench runs every cell of ``models x kv x (workloads + tasks)``::

    name: my-sweep
    seed: 0
    models: [smollm2]                       # or {name: path/to/model.gguf, dtype: bf16}
    engine: {kv_memory: 256MiB, max_num_seqs: 64, max_num_batched_tokens: 512}
    kv: [bf16, int8, "streaming_llm(budget=0.25)+int8"]
    workloads:
      - {name: throughput, num_requests: 32, prompt_len: 200, output_len: 64}
      - {name: sweep, num_requests: [16, 64], arrival: [closed:4, closed:64],
         kv_memory: 3072 tokens, kv: [bf16, int8]}   # a load sweep, its own pool and KV
      - {name: chat, kind: synthetic, num_requests: 8, corpus: my_text.txt}
      - {name: replay, kind: trace, trace: my_trace.jsonl}
    tasks:
      - {name: passkey, params: {context_lengths: [1024], depths: [0.5], samples: 1}}
    slo: "ttft=5s,tpot=300ms,ttft_p99=10s"

Everything is checked before any cell runs, and every problem is reported at once, each
naming the file and the key (``workloads[1].prompt_len``): unknown keys, bad values, bad
spec strings, unknown tasks or task parameters, missing files, prompts or task contexts
longer than the model's context, a KV pool smaller than one request of a workload, load
levels that do not increase, an SLO naming an unknown metric. ``skip_unavailable: true`` (used by the built-in
scenarios) turns *unregistered* KV names and tasks whose module is missing into notes,
so the built-in sweep grows as families land; a bad option of a known name still fails.

``kv_memory`` is a byte size or a budget in the model's bf16 tokens (``3072 tokens``: the
same bytes for every configuration). A workload whose ``arrival`` lists load levels is one
cell per level (record ``load``). A dummy-weight model runs workloads only.

Parsing lives in ``scenario_parse`` (sections) and ``scenario_checks`` (against the
models); the parsed types in ``cellspec``. File paths are resolved against the scenario
file's folder. See ``docs/bench.md``.
"""
from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path

import yaml

from kvmap.bench.cellspec import CellSpec, ModelEntry, Scenario, TaskEntry, WorkloadEntry
from kvmap.bench.scenario_parse import TOP_KEYS, parse_scenario
from kvmap.cli_errors import ScenarioError
from kvmap.workloads.options import upper_tokens

BUILTIN_SCENARIOS = ("default", "quick")
QUICK_MAX_REQUESTS = 4
QUICK_MAX_OUTPUT_TOKENS = 16


def load_scenario(path: str | Path | None = None, *, quick: bool = False) -> Scenario:
    """Read, parse and fully validate a scenario file, or a built-in one.

    ``path=None`` is the built-in ``default`` scenario (``quick`` picks ``quick`` instead);
    ``"builtin:<name>"`` names a built-in one. With a user file, ``quick`` caps every
    workload at ``QUICK_MAX_REQUESTS`` requests and ``QUICK_MAX_OUTPUT_TOKENS`` output
    tokens (tasks are unchanged). Raises ``ScenarioError`` listing every problem.
    """
    if path is None or str(path).startswith("builtin:"):
        name = "quick" if path is None and quick else str(path or "builtin:default")[8:]
        if name not in BUILTIN_SCENARIOS:
            raise ScenarioError(f"no built-in scenario {name!r}; built-in: "
                                f"{', '.join(BUILTIN_SCENARIOS)}")
        text = resources.files("kvmap.bench.scenarios").joinpath(f"{name}.yaml").read_text()
        return parse_scenario(_load_yaml(text, f"builtin:{name}"), f"builtin:{name}",
                              Path.cwd())
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"scenario file {str(path)!r} does not exist or is not a file")
    data = _load_yaml(path.read_text(encoding="utf-8"), str(path))
    # the user named this file: it may launch servers and import task modules
    scenario = parse_scenario(data, str(path), path.resolve().parent, code=True)
    return shrink(scenario) if quick else scenario


def scenario_text(scenario: Scenario) -> str:
    """The YAML the scenario came from (a built-in one's package file)."""
    if scenario.source.startswith("builtin:"):
        name = scenario.source[len("builtin:"):]
        return resources.files("kvmap.bench.scenarios").joinpath(f"{name}.yaml").read_text()
    path = Path(scenario.source)
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _load_yaml(text: str, source: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{source}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a YAML mapping of keys "
                            f"({', '.join(sorted(TOP_KEYS))}), not {type(data).__name__}")
    return data


def shrink(scenario: Scenario) -> Scenario:
    """The ``--quick`` form of a user scenario: small workloads, same everything else."""
    workloads = []
    for w in scenario.workloads:
        spec = w.spec(scenario.seed)
        opts = dict(w.options)
        if spec.num_requests is None or spec.num_requests > QUICK_MAX_REQUESTS:
            opts["num_requests"] = QUICK_MAX_REQUESTS
        if spec.kind != "trace" and upper_tokens(spec.output_len) > QUICK_MAX_OUTPUT_TOKENS:
            opts["output_len"] = f"fixed:{QUICK_MAX_OUTPUT_TOKENS}"
        workloads.append(replace(w, options=opts))
    return replace(scenario, workloads=tuple(workloads),
                   notes=scenario.notes + ("--quick: workloads capped at "
                                           f"{QUICK_MAX_REQUESTS} requests of at most "
                                           f"{QUICK_MAX_OUTPUT_TOKENS} output tokens",))


__all__ = ["BUILTIN_SCENARIOS", "CellSpec", "ModelEntry", "Scenario", "ScenarioError",
           "TaskEntry", "WorkloadEntry", "load_scenario", "parse_scenario", "scenario_text",
           "shrink"]
