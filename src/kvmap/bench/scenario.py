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
      - {name: chat, kind: synthetic, num_requests: 8, corpus: my_text.txt}
      - {name: replay, kind: trace, trace: my_trace.jsonl}
    tasks:
      - {name: passkey, params: {context_lengths: [1024], depths: [0.5], samples: 1}}
    slo: "ttft=5s,tpot=300ms,ttft_p99=10s"

Everything is checked before any cell runs, and every problem is reported at once, each
naming the file and the key (``workloads[1].prompt_len``): unknown keys, bad values, bad
spec strings, unknown tasks or task parameters, missing files, prompts or task contexts
longer than the model's context. ``skip_unavailable: true`` (used by the built-in
scenarios) turns *unregistered* KV names and tasks whose module is missing into notes,
so the built-in sweep grows as families land; a bad option of a known name still fails.

File paths are resolved against the scenario file's folder. See ``docs/bench.md``.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kvmap.metrics import normalize_slo, parse_slo

BUILTIN_SCENARIOS = ("default", "quick")
TOP_KEYS = {"name", "description", "seed", "models", "engine", "kv", "workloads", "tasks",
            "slo", "cell_timeout_s", "cell_memory_limit", "skip_unavailable"}
DEFAULT_CELL_TIMEOUT_S = 1800.0     # a cell that hangs must not hang the run
MODEL_KEYS = {"name", "dtype"}
ENGINE_KEYS = {"kv_memory", "block_size", "max_num_seqs", "max_num_batched_tokens",
               "enable_prefix_caching", "num_threads", "device"}
WORKLOAD_KEYS = {"name", "preset", "kind", "num_requests", "prompt_len", "output_len",
                 "arrival", "num_turns", "ignore_eos", "corpus", "trace", "seed"}
TASK_KEYS = {"name", "task", "params"}
TASK_PATH_PARAMS = ("data_path", "corpus")      # resolved against the scenario's folder
QUICK_MAX_REQUESTS = 4
QUICK_MAX_OUTPUT_TOKENS = 16


class ScenarioError(ValueError):
    """A scenario that cannot run; the message lists every problem found."""


@dataclass(frozen=True)
class ModelEntry:
    name: str                       # "smollm2", a .gguf path, a HF directory, "dummy:<shape>"
    dtype: str = "bf16"


@dataclass(frozen=True)
class EngineSettings:
    """``kvmap.LLM`` keyword arguments shared by every cell."""

    kv_memory: str | int = "256MiB"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    num_threads: int | None = None
    device: str | None = None


@dataclass(frozen=True)
class WorkloadEntry:
    """A named workload: ``options`` are the validated YAML keys (paths made absolute).

    ``spec(seed)`` rebuilds the ``WorkloadSpec`` (in the cell's process too)."""

    name: str
    options: dict

    def spec(self, seed: int = 0):
        return workload_spec(self.name, self.options, seed)


@dataclass(frozen=True)
class TaskEntry:
    """An accuracy task: ``task`` is a registered name or ``module:function``."""

    name: str
    task: str
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CellSpec:
    """One cell: a model and a KV configuration on one workload or one task.

    ``cell_id`` is a readable slug plus a hash of everything that defines the cell, so a
    resumed run recognises finished cells and never reuses a result of a changed cell.
    """

    cell_id: str
    model: ModelEntry
    kv: str
    engine: EngineSettings
    seed: int
    workload: WorkloadEntry | None = None
    task: TaskEntry | None = None
    slo: dict | None = None
    timeout_s: float | None = None
    memory_limit_bytes: int | None = None   # RLIMIT_AS of the cell process (None: none)

    @property
    def job(self) -> str:
        return self.workload.name if self.workload is not None else self.task.name

    @property
    def kind(self) -> str:
        return "workload" if self.workload is not None else "task"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CellSpec:
        data = dict(data)
        data["model"] = ModelEntry(**data["model"])
        data["engine"] = EngineSettings(**data["engine"])
        if data.get("workload") is not None:
            data["workload"] = WorkloadEntry(**data["workload"])
        if data.get("task") is not None:
            data["task"] = TaskEntry(**data["task"])
        return cls(**data)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str                     # the file it came from, or "builtin:<name>"
    seed: int
    models: tuple[ModelEntry, ...]
    kv: tuple[str, ...]
    workloads: tuple[WorkloadEntry, ...]
    tasks: tuple[TaskEntry, ...] = ()
    slo: dict | None = None
    engine: EngineSettings = EngineSettings()
    cell_timeout_s: float | None = DEFAULT_CELL_TIMEOUT_S
    cell_memory_limit_bytes: int | None = None
    description: str = ""
    notes: tuple[str, ...] = ()     # what was skipped (skip_unavailable) and why

    def cells(self) -> list[CellSpec]:
        """Every cell, model by model, then KV config by KV config, workloads first."""
        cells = []
        for model in self.models:
            for kv in self.kv:
                for job in (*self.workloads, *self.tasks):
                    is_workload = isinstance(job, WorkloadEntry)
                    cell = CellSpec("", model, kv, self.engine, self.seed,
                                    workload=job if is_workload else None,
                                    task=None if is_workload else job,
                                    slo=self.slo if is_workload else None,
                                    timeout_s=self.cell_timeout_s,
                                    memory_limit_bytes=self.cell_memory_limit_bytes)
                    cells.append(replace(cell, cell_id=_cell_id(cell)))
        return cells

    def to_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """A hash of what the run computes (not the file's name, notes, description or
        cell timeout), so a resumed run may change those."""
        data = {k: v for k, v in self.to_dict().items()
                if k not in ("source", "notes", "description", "cell_timeout_s",
                             "cell_memory_limit_bytes")}
        return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _cell_id(cell: CellSpec) -> str:
    """A slug and a hash of the secrets-free fields (``redact_obj``): a password in a
    KV spec's URL never reaches a file name."""
    from kvmap.kv.redact import redact_obj, redact_spec
    data = redact_obj({k: v for k, v in cell.to_dict().items()
                       if k not in ("cell_id", "timeout_s", "memory_limit_bytes")})
    digest = hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
    model = Path(cell.model.name).stem if "/" in cell.model.name else cell.model.name
    slug = re.sub(r"[^A-Za-z0-9.=_-]+", "-",
                  redact_spec(f"{model}_{cell.job}_{cell.kv}")).strip("-")
    return f"{slug[:80]}_{digest}"


# ---- loading -----------------------------------------------------------------------

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
    scenario = parse_scenario(data, str(path), path.resolve().parent)
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
        workloads.append(WorkloadEntry(w.name, opts))
    return replace(scenario, workloads=tuple(workloads),
                   notes=scenario.notes + ("--quick: workloads capped at "
                                           f"{QUICK_MAX_REQUESTS} requests of at most "
                                           f"{QUICK_MAX_OUTPUT_TOKENS} output tokens",))


class _Problems:
    """Collects every problem with the key it is about, then raises them together."""

    def __init__(self, source: str):
        self.source, self.items = source, []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            lines = "\n".join(f"  - {item}" for item in self.items)
            raise ScenarioError(f"scenario {self.source}: {len(self.items)} problem(s), "
                                f"nothing was run:\n{lines}")


def parse_scenario(data: dict, source: str = "<scenario>", base_dir: Path | None = None
                   ) -> Scenario:
    """Validate a scenario mapping (as loaded from YAML); ``ScenarioError`` on problems."""
    base_dir = base_dir or Path.cwd()
    problems, notes = _Problems(source), []
    _unknown_keys(data, TOP_KEYS, "", problems)
    skip = data.get("skip_unavailable", False)
    if not isinstance(skip, bool):
        problems.add("skip_unavailable", f"{skip!r} must be true or false")
        skip = False
    seed = data.get("seed", 0)
    if not _is_int(seed) or seed < 0:
        problems.add("seed", f"{seed!r} must be an integer >= 0")
        seed = 0
    timeout_s = data.get("cell_timeout_s", DEFAULT_CELL_TIMEOUT_S)
    if timeout_s is not None and (not isinstance(timeout_s, (int, float))
                                  or isinstance(timeout_s, bool) or timeout_s <= 0):
        problems.add("cell_timeout_s", f"{timeout_s!r} must be a number of seconds > 0")
        timeout_s = None
    memory_limit = _parse_memory_limit(data.get("cell_memory_limit"), problems)
    models = _parse_models(data.get("models", ["smollm2"]), problems, base_dir)
    engine = _parse_engine(data.get("engine") or {}, problems)
    kv = _parse_kv(data.get("kv"), problems, notes, skip)
    workloads = _parse_workloads(data.get("workloads") or [], problems, base_dir, seed)
    tasks = _parse_tasks(data.get("tasks") or [], problems, notes, skip, base_dir)
    slo = _parse_slo(data.get("slo"), problems)
    if not workloads and not tasks:
        problems.add("workloads", "the scenario has no workloads and no tasks")
    _check_models(models, kv, engine, workloads, tasks, problems, seed)
    _check_trace_arrivals(workloads, timeout_s, problems)
    name = data.get("name") or (Path(source).stem if not source.startswith("builtin:")
                                else source[8:])
    if re.search(r"[/\\\x00]|\.\.|^\.|^\s*$", str(name)):
        problems.add("name", f"{name!r} must be a plain name (no '/', '\\', '..', "
                             "leading '.'): it names the run directory")
    problems.raise_if_any()
    return Scenario(name=str(name), source=source, seed=seed, models=tuple(models),
                    kv=tuple(kv), workloads=tuple(workloads), tasks=tuple(tasks), slo=slo,
                    engine=engine, cell_timeout_s=timeout_s,
                    cell_memory_limit_bytes=memory_limit,
                    description=str(data.get("description") or ""), notes=tuple(notes))


def _parse_memory_limit(raw: Any, problems: _Problems) -> int | None:
    """``cell_memory_limit: 8GiB`` -> bytes (None: no limit)."""
    from kvmap.config import parse_size
    if raw is None:
        return None
    try:
        limit = parse_size(raw, "cell_memory_limit")
    except ValueError as e:
        problems.add("cell_memory_limit", str(e))
        return None
    if limit < 256 << 20:
        problems.add("cell_memory_limit", f"{raw!r} is below 256MiB, too small to load "
                                          "torch")
        return None
    return limit


def _check_trace_arrivals(workloads, timeout_s: float | None, problems: _Problems) -> None:
    """A trace arrival past the cell timeout can only end in a timeout: refuse it now
    (``arrival_s: 1e7`` would otherwise hang the cell until then)."""
    from kvmap.workloads.trace import load_trace
    if timeout_s is None:
        return
    for w in workloads:
        if "trace" in w.options and "arrival" not in w.options:
            last_s = max((e.arrival_s for e in load_trace(w.options["trace"])), default=0.0)
            if last_s > timeout_s:
                problems.add(f"workloads.{w.name}.trace", f"an arrival at {last_s:g} s is "
                             f"past cell_timeout_s={timeout_s:g}; the cell could only time "
                             "out")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unknown_keys(mapping: dict, allowed: set[str], where: str, problems: _Problems) -> None:
    for key in mapping:
        if key not in allowed:
            problems.add(f"{where}{key}" if not where else f"{where}.{key}",
                         f"unknown key {key!r}; valid keys: {', '.join(sorted(allowed))}")


def _parse_models(raw: Any, problems: _Problems, base_dir: Path) -> list[ModelEntry]:
    from kvmap.config import DTYPES
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
        _unknown_keys(item, MODEL_KEYS, where, problems)
        dtype = item.get("dtype", "bf16")
        if dtype not in DTYPES:
            problems.add(f"{where}.dtype", f"{dtype!r} is not one of {sorted(DTYPES)}")
            continue
        name = item["name"]
        if not name.lower().startswith("dummy:") and name.lower() != "smollm2" \
                and not Path(name).is_absolute():
            candidate = (base_dir / name).expanduser()
            name = str(candidate) if candidate.exists() else name
        models.append(ModelEntry(name, dtype))
    return models


def _parse_engine(raw: Any, problems: _Problems) -> EngineSettings:
    from kvmap.config import parse_size
    if not isinstance(raw, dict):
        problems.add("engine", f"{raw!r} must be a mapping")
        return EngineSettings()
    _unknown_keys(raw, ENGINE_KEYS, "engine", problems)
    settings = EngineSettings(**{k: v for k, v in raw.items() if k in ENGINE_KEYS})
    try:
        parse_size(settings.kv_memory, "kv_memory")
    except ValueError as e:
        problems.add("engine.kv_memory", str(e))
    for key in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(settings, key)
        if not _is_int(value) or value < 1:
            problems.add(f"engine.{key}", f"{value!r} must be an integer >= 1")
    if settings.num_threads is not None and (not _is_int(settings.num_threads)
                                             or settings.num_threads < 1):
        problems.add("engine.num_threads", f"{settings.num_threads!r} must be an integer >= 1")
    if not isinstance(settings.enable_prefix_caching, bool):
        problems.add("engine.enable_prefix_caching",
                     f"{settings.enable_prefix_caching!r} must be true or false")
    return settings


def _parse_kv(raw: Any, problems: _Problems, notes: list[str], skip: bool) -> list[str]:
    from kvmap.kv import grammar
    from kvmap.kv.config import KVConfig, valid_names
    if raw is None:
        raw = ["bf16"]
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        problems.add("kv", f"{raw!r} must be a non-empty list of KV spec strings")
        return []
    specs, known = [], set(valid_names())
    for i, spec in enumerate(raw):
        where = f"kv[{i}]"
        if not isinstance(spec, str):
            problems.add(where, f"{spec!r} must be a KV spec string such as 'int8'")
            continue
        try:
            missing = [p.name for p in grammar.parse(spec) if p.name not in known]
            if missing and skip:
                notes.append(f"skipped KV spec {spec!r}: {', '.join(missing)} not "
                             "registered yet")
                continue
            KVConfig.parse(spec)
        except ValueError as e:
            problems.add(where, str(e))
            continue
        if spec.strip() in specs:
            problems.add(where, f"KV spec {spec!r} is listed twice")
            continue
        specs.append(spec.strip())
    if not specs and not problems.items:
        problems.add("kv", "no KV spec is available")
    return specs


def _length(value: Any, preset_dist):
    """A YAML length: an int moves the preset's mean (keeping its shape); a string is
    parsed by ``kvmap.workloads.lengths.parse_length``."""
    from kvmap.workloads.lengths import parse_length
    if _is_int(value):
        if value < 1:
            raise ValueError(f"{value!r} must be >= 1")
        return preset_dist.with_mean(value)
    if isinstance(value, str):
        return parse_length(value)
    raise ValueError(f"{value!r} must be a token count or a distribution like "
                     "'uniform:128:384'")


def workload_spec(name: str, options: dict, seed: int = 0):
    """The ``WorkloadSpec`` of one scenario workload (raises ValueError naming the key).

    ``preset`` (default: ``name`` when it is a preset and no ``kind`` is given) is the
    starting point; without one, ``kind`` is required and the ``WorkloadSpec`` defaults
    apply. A ``trace`` replays the file's own arrival times unless ``arrival`` is given.
    """
    from kvmap.workloads.arrivals import parse_arrival
    from kvmap.workloads.presets import PRESETS, get_preset
    from kvmap.workloads.spec import WorkloadSpec

    preset = options.get("preset")
    if preset is None and "kind" not in options and name in PRESETS:
        preset = name
    if preset is not None:
        spec = replace(get_preset(preset), name=name)
        if "kind" in options and options["kind"] != spec.kind:
            raise ValueError(f"kind: {options['kind']!r} contradicts preset {preset!r} "
                             f"(kind {spec.kind!r}); drop one")
    elif "kind" not in options:
        raise ValueError(f"kind: needed when the workload is not a preset "
                         f"({', '.join(sorted(PRESETS))})")
    elif options["kind"] == "trace":
        if "trace" not in options:
            raise ValueError("trace: a workload of kind 'trace' needs a trace file")
        spec = WorkloadSpec(name, "trace", None, arrival=None, trace_path=options["trace"])
    else:
        spec = WorkloadSpec(name, options["kind"], 8)
    changes: dict[str, Any] = {"seed": options.get("seed", seed)}
    for key in ("prompt_len", "output_len"):
        if key in options:
            try:
                changes[key] = _length(options[key], getattr(spec, key))
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
    if "arrival" in options:
        try:
            changes["arrival"] = parse_arrival(options["arrival"])
        except ValueError as e:
            raise ValueError(f"arrival: {e}") from None
    if "ignore_eos" in options and not isinstance(options["ignore_eos"], bool):
        raise ValueError(f"ignore_eos: {options['ignore_eos']!r} must be true or false")
    for key in ("num_requests", "num_turns", "ignore_eos"):
        if key in options:
            changes[key] = options[key]
    if "corpus" in options:
        changes["corpus_path"] = options["corpus"]
    if "trace" in options:
        changes["trace_path"] = options["trace"]
    return replace(spec, **changes)


def _named_entries(raw: Any, section: str, noun: str, short_form: str, keys: set[str],
                   problems: _Problems):
    """Walk a list section of named entries (a bare name or a mapping with a 'name'),
    recording the problems shared by all such sections; yields (name, mapping, where)."""
    if not isinstance(raw, list):
        problems.add(section, f"{raw!r} must be a list of {section}")
        return
    names: set[str] = set()
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
        _unknown_keys(item, keys, where, problems)
        if name in names:
            problems.add(where, f"{noun} name {name!r} is used twice")
            continue
        names.add(name)
        yield name, item, where


def _parse_workloads(raw: Any, problems: _Problems, base_dir: Path, seed: int
                     ) -> list[WorkloadEntry]:
    from kvmap.workloads.corpus import load_text_file
    from kvmap.workloads.trace import load_trace
    entries = []
    for name, item, where in _named_entries(raw, "workloads", "workload", "a preset name",
                                            WORKLOAD_KEYS, problems):
        options = {k: v for k, v in item.items() if k in WORKLOAD_KEYS and k != "name"}
        bad_file = False
        for key, loader in (("corpus", load_text_file), ("trace", load_trace)):
            if key in options:
                if not isinstance(options[key], str):
                    problems.add(f"{where}.{key}", f"{options[key]!r} must be a file path")
                    bad_file = True
                    continue
                path = (base_dir / options[key]).expanduser()
                options[key] = str(path.resolve())
                try:
                    loader(path)
                except ValueError as e:
                    problems.add(f"{where}.{key}", str(e))
                    bad_file = True
        if bad_file:
            continue
        try:
            workload_spec(name, options, seed)
        except ValueError as e:
            problems.add(where, str(e))
            continue
        entries.append(WorkloadEntry(name, options))
    return entries


def _parse_tasks(raw: Any, problems: _Problems, notes: list[str], skip: bool,
                 base_dir: Path) -> list[TaskEntry]:
    from kvmap.bench.cell import TaskUnavailable, check_task_params, resolve_task
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
        entries.append(TaskEntry(name, task, dict(params)))
    return entries


def _parse_slo(raw: Any, problems: _Problems) -> dict | None:
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            return parse_slo(raw)
        if isinstance(raw, dict):
            # {ttft_p99: 2s} or {ttft_p99_s: 2.0}: strings need a unit, numbers are seconds
            text_items = [f"{k}={v}" for k, v in raw.items() if isinstance(v, str)]
            slo = parse_slo(",".join(text_items)) if text_items else {}
            numbers = {k: v for k, v in raw.items() if not isinstance(v, str)}
            for key, value in normalize_slo(numbers).items():
                if key in slo:
                    raise ValueError(f"SLO key {key!r} is given twice")
                slo[key] = value
            return slo
        raise ValueError(f"{raw!r} must be a string like 'ttft_p99=2s,tbt_p99=150ms' or a "
                         "mapping")
    except ValueError as e:
        problems.add("slo", str(e))
        return None


# ---- context limits ----------------------------------------------------------------

def upper_tokens(dist) -> int:
    """The largest length ``dist`` can draw."""
    for attr in ("hi_tokens", "num_tokens"):
        if hasattr(dist, attr):
            return int(getattr(dist, attr))
    return int(dist.max_tokens)


def model_config_of(name: str, dtype: str = "bf16"):
    """The ``ModelConfig`` of a scenario model, read without loading its weights (from the
    weights cache, the GGUF header or ``config.json``). ValueError for a missing model."""
    from kvmap.config import ModelConfig
    from kvmap.model.dummy import DUMMY_PREFIX, parse_dummy_spec
    if name.lower().startswith(DUMMY_PREFIX):
        return parse_dummy_spec(name)
    if name.lower() == "smollm2":
        from kvmap.model.loader import embedded_model_path
        path = embedded_model_path()
    else:
        path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        from kvmap.model.hf_loader import config_from_hf
        return config_from_hf(json.loads((path / "config.json").read_text()), path.name)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(f"model directory {name!r} has no config.json and "
                             f"{len(ggufs)} .gguf files (need exactly one)")
        path = ggufs[0]
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        raise ValueError(f"model {name!r} is not an existing .gguf file or model "
                         "directory, 'smollm2' or 'dummy:<shape>'")
    from kvmap.model import weights_cache
    from kvmap.model.loader import resolve_dtype
    cached = weights_cache.cache_entry(path, resolve_dtype(dtype)) / "config.json"
    if cached.is_file():
        fields = json.loads(cached.read_text())
        fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
        return ModelConfig(**fields)
    from kvmap.model.gguf_loader import config_from_metadata, open_gguf, read_metadata
    reader = open_gguf(path)
    shapes = {t.name: tuple(int(s) for s in reversed(t.shape)) for t in reader.tensors}
    return config_from_metadata(read_metadata(reader), shapes, path.stem)


def _check_models(models: list[ModelEntry], kv: list[str], engine: EngineSettings,
                  workloads: list[WorkloadEntry], tasks: list[TaskEntry],
                  problems: _Problems, seed: int) -> None:
    """Every KV spec must fit every model's geometry, and prompts and task sequences its
    context (a prompt needs fewer tokens than the context)."""
    from kvmap.bench.cell import task_tokens_needed
    from kvmap.kv.config import KVConfig
    from kvmap.kv.spec import KVGeometry
    from kvmap.workloads.trace import load_trace
    for i, model in enumerate(models):
        try:
            config = model_config_of(model.name, model.dtype)
        except (ValueError, OSError, KeyError) as e:
            problems.add(f"models[{i}]", str(e))
            continue
        context = config.max_position_embeddings
        if _is_int(engine.block_size) and engine.block_size > 0:
            geom = KVGeometry.of(config, engine.block_size)
            for j, spec in enumerate(kv):
                try:
                    KVConfig.parse(spec).codec.validate_geometry(geom)
                except ValueError as e:
                    problems.add(f"kv[{j}]", f"{e} (model {model.name!r})")
        for w in workloads:
            spec = w.spec(seed)
            if spec.kind == "trace":
                lengths = [e.prompt_tokens or 0 for e in load_trace(spec.trace_path)]
                longest = max(lengths, default=0)
            else:
                longest = upper_tokens(spec.prompt_len)
            if longest >= context:
                problems.add(f"workloads ({w.name})",
                             f"prompts of up to {longest} tokens do not fit the context of "
                             f"model {model.name!r} ({context} tokens)")
        for t in tasks:
            try:
                need = task_tokens_needed(t.task, t.params, seed)
            except ValueError:
                need = None                      # already reported by _parse_tasks
            if need is not None and need > context:
                problems.add(f"tasks ({t.name})",
                             f"needs sequences of {need} tokens; the context of model "
                             f"{model.name!r} is {context} tokens")
