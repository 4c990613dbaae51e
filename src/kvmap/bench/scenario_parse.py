"""Scenario mapping (as loaded from YAML) -> a validated ``Scenario``, every problem at once.

Each section has its parser; each records problems with the key they are about
(``workloads[1] (chat).prompt_len``) and carries on, so one run of ``kvmap bench``
lists everything wrong with a file before any cell runs.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from kvmap.bench.block_sweep import BLOCK_SIZE_KEY, parse_block_sizes
from kvmap.runs.search_settings import search_settings
from kvmap.bench.cellspec import (DEFAULT_CELL_TIMEOUT_S, ModelEntry, Scenario, TaskEntry,
                                  WorkloadEntry)
from kvmap.bench.endpoint_parse import (parse_endpoint_filter, parse_endpoints,
                                        reserved_names)
from kvmap.bench.scenario_checks import (check_models, check_searches, check_trace_arrivals,
                                         parse_memory_limit)
from kvmap.bench.scenario_fields import (Problems, as_tuple, is_int, parse_kv,
                                         parse_slo_section, unknown_keys)
from kvmap.bench.scenario_trust import refuse_code
from kvmap.config import DEFAULT_KV_MEMORY, EngineArgs, parse_kv_memory
from kvmap.hardware import resolve_dtype
from kvmap.model.wquant import QUANTIZATIONS
from kvmap.runs.names import sweep_name
from kvmap.workloads.options import WORKLOAD_KEYS, load_levels, workload_spec

TOP_KEYS = {"name", "description", "seed", "models", "engine", "kv", "workloads", "tasks",
            "slo", "cell_timeout_s", "cell_memory_limit", "skip_unavailable", "endpoints"}
MODEL_KEYS = {"name", "dtype", "quantization"}
ENGINE_KEYS = {"kv_memory", "block_size", "max_num_seqs", "max_num_batched_tokens",
               "enable_prefix_caching", "num_threads", "device"}
OPTIONAL_KEY = "optional"    # a budget whose minimum does not fit may leave the entry out
# the bench's own workload keys beside the workload's: its KV list, pool budget, models
BENCH_WORKLOAD_KEYS = WORKLOAD_KEYS | {"kv", "kv_memory", "models", "slo", "endpoints",
                                      BLOCK_SIZE_KEY, "search", OPTIONAL_KEY}
TASK_KEYS = {"name", "task", "params", "kv", "models", "endpoints", OPTIONAL_KEY}
TASK_PATH_PARAMS = ("data_path", "corpus")      # resolved against the scenario's folder


def parse_scenario(data: dict, source: str = "<scenario>", base_dir: Path | None = None,
                   *, code: bool = False) -> Scenario:
    """Validate a scenario mapping (as loaded from YAML); ``ScenarioError`` on problems.
    ``code``: whether it may run code of its own (``scenario_trust``)."""
    base_dir = base_dir or Path.cwd()
    problems, notes = Problems(source), []
    if not code:
        refuse_code(data, problems)
    unknown_keys(data, TOP_KEYS, "", problems)
    skip = data.get("skip_unavailable", False)
    if not isinstance(skip, bool):
        problems.add("skip_unavailable", f"{skip!r} must be true or false")
        skip = False
    seed = data.get("seed", 0)
    if not is_int(seed) or seed < 0:
        problems.add("seed", f"{seed!r} must be an integer >= 0")
        seed = 0
    timeout_s = data.get("cell_timeout_s", DEFAULT_CELL_TIMEOUT_S)
    if timeout_s is not None and (not isinstance(timeout_s, (int, float))
                                  or isinstance(timeout_s, bool) or timeout_s <= 0):
        problems.add("cell_timeout_s", f"{timeout_s!r} must be a number of seconds > 0")
        timeout_s = None
    memory_limit = parse_memory_limit(data.get("cell_memory_limit"), problems)
    engine = _parse_engine(data.get("engine") or {}, problems)
    models = _parse_models(data.get("models", ["smollm2"]), problems, base_dir, engine)
    kv = parse_kv(data.get("kv"), "kv", problems, notes, skip)
    endpoints = parse_endpoints(data.get("endpoints"), problems, base_dir,
                                reserved_names(data, kv))
    workloads = _parse_workloads(data.get("workloads") or [], problems, notes, skip,
                                 base_dir, seed, endpoints)
    workloads = _check_job_models(workloads, models, "workloads", problems)
    tasks = _check_job_models(_parse_tasks(data.get("tasks") or [], problems, notes, skip,
                                           base_dir, endpoints), models, "tasks", problems)
    slo = parse_slo_section(data.get("slo"), problems)
    check_searches(workloads, slo, problems)
    if not workloads and not tasks:
        problems.add("workloads", "the scenario has no workloads and no tasks")
    check_models(models, kv, engine, workloads, tasks, problems, seed)
    check_trace_arrivals(workloads, timeout_s, problems)
    name = data.get("name") or (Path(source).stem if not source.startswith("builtin:")
                                else source[8:])
    if re.search(r"[/\\\x00]|\.\.|^\.|^\s*$", str(name)):
        problems.add("name", f"{name!r} must be a plain name (no '/', '\\', '..', "
                             "leading '.'): it names the run directory")
    problems.raise_if_any()
    if any(t.is_accuracy_task for t in tasks):
        notes += [f"model {m.name!r} has random weights: its accuracy tasks are not run "
                  "(n/a)" for m in models if m.is_dummy]
    return Scenario(name=str(name), source=source, seed=seed, models=tuple(models),
                    kv=tuple(kv), workloads=tuple(workloads), tasks=tuple(tasks), slo=slo,
                    engine=engine, cell_timeout_s=timeout_s,
                    cell_memory_limit_bytes=memory_limit,
                    description=str(data.get("description") or ""), notes=tuple(notes),
                    endpoints=tuple(endpoints))




def _parse_models(raw: Any, problems: Problems, base_dir: Path, engine: EngineArgs
                  ) -> list[ModelEntry]:
    device = engine.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(raw, (str, dict)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        problems.add("models", f"{raw!r} must be a non-empty list of model names")
        return []
    models = []
    for i, item in enumerate(raw):
        where = f"models[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            problems.add(where, f"{item!r} must be a model name or {{name, dtype}}")
            continue
        unknown_keys(item, MODEL_KEYS, where, problems)
        try:       # "auto" (the default): this machine's fastest exact dtype
            dtype = resolve_dtype(item.get("dtype", "auto"), device)
        except ValueError as e:
            problems.add(f"{where}.dtype", str(e))
            continue
        name = item["name"]
        if not name.lower().startswith("dummy:") and name.lower() != "smollm2" \
                and not Path(name).is_absolute():
            candidate = (base_dir / name).expanduser()
            name = str(candidate) if candidate.exists() else name
        quantization = item.get("quantization")
        if quantization is not None and quantization not in QUANTIZATIONS:
            problems.add(f"{where}.quantization", f"{quantization!r} is not one of "
                         f"{', '.join(q for q in QUANTIZATIONS if q)} (or omitted)")
            continue
        models.append(ModelEntry(name, dtype, quantization))
    return models


def _parse_engine(raw: Any, problems: Problems) -> EngineArgs:
    if not isinstance(raw, dict):
        problems.add("engine", f"{raw!r} must be a mapping")
        return EngineArgs()
    unknown_keys(raw, ENGINE_KEYS, "engine", problems)
    fields = {k: v for k, v in raw.items() if k in ENGINE_KEYS}
    try:
        parse_kv_memory(fields.get("kv_memory", DEFAULT_KV_MEMORY))
    except ValueError as e:
        problems.add("engine.kv_memory", str(e))
        fields.pop("kv_memory")
    for key in ("block_size", "max_num_seqs", "max_num_batched_tokens", "num_threads"):
        value = fields.get(key, 1)           # num_threads may be null: torch's default
        if not (is_int(value) and value >= 1) and not (key == "num_threads" and value is None):
            problems.add(f"engine.{key}", f"{value!r} must be an integer >= 1")
            fields.pop(key)
    if not isinstance(fields.get("enable_prefix_caching", True), bool):
        problems.add("engine.enable_prefix_caching",
                     f"{fields.pop('enable_prefix_caching')!r} must be true or false")
    return EngineArgs(**fields)


def _named_entries(raw: Any, section: str, noun: str, short_form: str, keys: set[str],
                   problems: Problems):
    """Walk a list section of named entries (a bare name or a mapping with a 'name'),
    recording the problems shared by all such sections; yields (name, mapping, where)."""
    if not isinstance(raw, list):
        problems.add(section, f"{raw!r} must be a list of {section}")
        return
    names: dict[str, list] = {}         # name -> the models of each entry so named
    for i, item in enumerate(raw):
        where = f"{section}[{i}]"
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not item["name"].strip():
            problems.add(where, f"{item!r} must be {short_form} or a mapping with a 'name'")
            continue
        name = item["name"].strip()
        where = f"{section}[{i}] ({name})"
        unknown_keys(item, keys, where, problems)
        # one name twice only for disjoint models (the same job on another model entry,
        # e.g. quantized weights): the cells differ by model, the report draws them as one
        models = item.get("models")
        mine = set(models) if isinstance(models, list) else None
        if name in names and (mine is None or any(m is None or m & mine
                                                  for m in names[name])):
            problems.add(where, f"{noun} name {name!r} is used twice (allowed only for "
                                "entries whose 'models' lists do not overlap)")
            continue
        names.setdefault(name, []).append(mine)
        yield name, item, where


def _resolve_files(options: dict, where: str, base_dir: Path, problems: Problems) -> bool:
    """Make ``corpus`` / ``trace`` paths absolute and check they load; False on a problem."""
    from kvmap.workloads.corpus import load_text_file
    from kvmap.workloads.trace import load_trace
    ok = True
    for key, loader in (("corpus", load_text_file), ("trace", load_trace)):
        if key not in options:
            continue
        if not isinstance(options[key], str):
            problems.add(f"{where}.{key}", f"{options[key]!r} must be a file path")
            ok = False
            continue
        path = (base_dir / options[key]).expanduser()
        options[key] = str(path.resolve())
        try:
            loader(path)
        except ValueError as e:
            problems.add(f"{where}.{key}", str(e))
            ok = False
    return ok


def _parse_workloads(raw: Any, problems: Problems, notes: list[str], skip: bool,
                     base_dir: Path, seed: int, endpoints=()) -> list[WorkloadEntry]:
    entries = []
    for name, item, where in _named_entries(raw, "workloads", "workload", "a preset name",
                                            BENCH_WORKLOAD_KEYS, problems):
        options = {k: v for k, v in item.items() if k in WORKLOAD_KEYS and k != "name"}
        kv = tuple(parse_kv(item["kv"], f"{where}.kv", problems, notes, skip)) \
            if "kv" in item else None
        models = as_tuple(item.get("models"))
        kv_memory = item.get("kv_memory")
        if kv_memory is not None:
            try:
                parse_kv_memory(kv_memory)
            except ValueError as e:
                problems.add(f"{where}.kv_memory", str(e))
                continue
        slo = parse_slo_section(item.get("slo"), problems, f"{where}.slo")
        if not _resolve_files(options, where, base_dir, problems):
            continue
        try:                  # None unless arrival: auto (runs.search)
            search = search_settings(item, options)
        except ValueError as e:
            problems.add(f"{where}.search", str(e))
            continue
        try:
            levels = [(options, None)] if search else load_levels(options)
            for level, _ in levels:
                auto = {"arrival": "closed:1"} if search else {}
                workload_spec(name, {**level, **auto}, seed)
        except ValueError as e:
            problems.add(where, str(e))
            continue
        chosen = parse_endpoint_filter(item, where, list(endpoints), problems)
        sizes = parse_block_sizes(item.get(BLOCK_SIZE_KEY), where, problems)
        named = [(name, None)] if sizes is None else \
            [(sweep_name(name, b) if isinstance(item[BLOCK_SIZE_KEY], list) else name, b)
             for b in sizes]
        optional = _optional(item, where, problems)
        entries += [WorkloadEntry(label, level, load.to_dict() if load else None, kv,
                                  kv_memory, models, slo, chosen, block_size=size,
                                  search=search or None, optional=optional)
                    for label, size in named for level, load in levels]
    return entries



def _check_job_models(jobs: list, models: list[ModelEntry], section: str,
                      problems: Problems) -> list:
    """A workload's or task's ``models`` must be a list of the scenario's model labels
    (``name``, or ``name+quantization`` for an entry with quantized weights)."""
    names, kept = [m.label for m in models], []
    for job in jobs:
        if job.models is not None and (not isinstance(job.models, tuple) or not job.models
                                       or any(n not in names for n in job.models)):
            problems.add(f"{section} ({job.name}).models",
                         f"{list(job.models) if isinstance(job.models, tuple) else job.models!r}"
                         f" must be a non-empty list of the scenario's models {names}")
            continue
        kept.append(job)
    return kept


def _parse_tasks(raw: Any, problems: Problems, notes: list[str], skip: bool,
                 base_dir: Path, endpoints=()) -> list[TaskEntry]:
    from kvmap.bench.tasks import TaskUnavailable, check_task_params, resolve_task
    entries = []
    for name, item, where in _named_entries(raw, "tasks", "task", "a task name", TASK_KEYS,
                                            problems):
        task, params = item.get("task", name), item.get("params") or {}
        if not isinstance(params, dict):
            problems.add(f"{where}.params", f"{params!r} must be a mapping")
            continue
        params = {k: str((base_dir / v).expanduser().resolve())
                  if k in TASK_PATH_PARAMS and isinstance(v, str) else v
                  for k, v in params.items()}
        if isinstance(task, str) and ":" in task:
            module, _, attr = task.rpartition(":")
            if module.endswith(".py"):
                task = f"{(base_dir / module).expanduser().resolve()}:{attr}"
        try:
            fn = resolve_task(task)
            check_task_params(task, fn, params)
        except TaskUnavailable as e:
            if skip:
                notes.append(f"skipped task {name!r}: {e}")
            else:
                problems.add(where, str(e))
            continue
        except ValueError as e:
            problems.add(where, str(e))
            continue
        kv = tuple(parse_kv(item["kv"], f"{where}.kv", problems, notes, skip)) \
            if "kv" in item else None
        entries.append(TaskEntry(name, task, dict(params), kv, as_tuple(item.get("models")),
                                 parse_endpoint_filter(item, where, list(endpoints), problems),
                                 _optional(item, where, problems)))
    return entries


def _optional(item: dict, where: str, problems: Problems) -> bool:
    """An entry's ``optional`` (default false): true or false, nothing else."""
    value = item.get(OPTIONAL_KEY, False)
    if not isinstance(value, bool):
        problems.add(f"{where}.{OPTIONAL_KEY}", f"{value!r} must be true or false")
        return False
    return value
