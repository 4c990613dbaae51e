"""Checks of a scenario against its models, before any cell runs: every KV spec fits
every model's geometry, prompts and task sequences fit its context, and the KV pool
holds at least one request of each workload at each configuration's bytes per token.

``problems`` is the parser's collector (anything with ``add(where, message)``).
"""
from __future__ import annotations

from dataclasses import replace

from kvmap.bench.block_sweep import check_block_size
from kvmap.bench.cellspec import ModelEntry, TaskEntry, WorkloadEntry
from kvmap.config import EngineArgs, ModelConfig, parse_kv_memory


def check_models(models: list[ModelEntry], kv: list[str], engine: EngineArgs,
                 workloads: list[WorkloadEntry], tasks: list[TaskEntry], problems,
                 seed: int) -> None:
    from kvmap.bench.tasks import task_tokens_needed
    from kvmap.model.loader import model_config_of
    from kvmap.workloads.options import longest_prompt_tokens
    block_ok = isinstance(engine.block_size, int) and engine.block_size > 0
    for i, model in enumerate(models):
        try:
            config = model_config_of(model.name, model.dtype)
        except (ValueError, OSError, KeyError) as e:
            problems.add(f"models[{i}]", str(e))
            continue
        context = config.max_position_embeddings
        if block_ok:
            _check_geometry(model, config, kv, workloads, engine, problems)
        budget_checked: set[str] = set()          # one report per workload, not per level
        for w in workloads:
            if w.models is not None and model.label not in w.models:
                continue
            longest = longest_prompt_tokens(w.spec(seed))
            if longest >= context:
                problems.add(f"workloads ({w.name})",
                             f"prompts of up to {longest} tokens do not fit the context of "
                             f"model {model.name!r} ({context} tokens)")
            elif w.name not in budget_checked:
                budget_checked.add(w.name)
                if w.block_size is not None and not _block_size_ok(model, config, w, kv,
                                                                   engine, problems):
                    continue
                w_engine = engine if w.block_size is None else \
                    replace(engine, block_size=w.block_size)
                if block_ok:
                    _check_budget(model, config, w, w.kv or kv, w_engine, problems, seed)
        for t in tasks:
            if model.is_dummy and t.is_accuracy_task:
                continue                              # not run: n/a
            try:
                need = task_tokens_needed(t.task, t.params, seed)
            except ValueError:
                need = None                      # already reported by the task parser
            if need is not None and need > context:
                problems.add(f"tasks ({t.name})",
                             f"needs sequences of {need} tokens; the context of model "
                             f"{model.name!r} is {context} tokens")


def _check_geometry(model: ModelEntry, config: ModelConfig, kv: list[str],
                    workloads: list[WorkloadEntry], engine: EngineArgs, problems) -> None:
    from kvmap.kv.config import KVConfig
    from kvmap.kv.spec import KVGeometry
    geom = KVGeometry.of(config, engine.block_size)
    specs = list(kv) + [s for w in workloads for s in (w.kv or ()) if s not in kv]
    for j, spec in enumerate(dict.fromkeys(specs)):
        try:
            KVConfig.parse(spec).codec.validate_geometry(geom)
        except ValueError as e:
            problems.add(f"kv[{j}]", f"{e} (model {model.name!r})")


def _block_size_ok(model: ModelEntry, config: ModelConfig, w: WorkloadEntry, kv: list[str],
                   engine: EngineArgs, problems) -> bool:
    """The block size of one entry of a block-size sweep against the model and pool."""
    kv_memory = w.kv_memory if w.kv_memory is not None else engine.kv_memory
    return all(check_block_size(w.block_size, config.max_position_embeddings,
                                pool_tokens(config, spec, kv_memory, w.block_size, model.dtype),
                                f"workloads ({w.name}).block_size", model.name, spec, problems)
               for spec in (w.kv or kv))


def pool_tokens(config: ModelConfig, spec: str, kv_memory, block_size: int,
                dtype: str) -> int:
    """Tokens the pool of ``kv_memory`` (bytes, or the model's bf16 tokens) holds with
    KV spec ``spec``: whole blocks, as the engine sizes it."""
    from kvmap.engine.engine import bf16_bytes_per_token
    from kvmap.kv.config import KVConfig
    from kvmap.kv.spec import KVGeometry
    from kvmap.model.loader import resolve_dtype
    num_bytes, num_tokens = parse_kv_memory(kv_memory)
    if num_tokens is not None:
        num_bytes = num_tokens * bf16_bytes_per_token(config)
    per_block = KVConfig.parse(spec).codec.block_bytes(KVGeometry.of(config, block_size),
                                                       resolve_dtype(dtype))
    return (num_bytes // per_block) * block_size


def sequences_at_once(config: ModelConfig, spec: str, kv_memory, block_size: int,
                      dtype: str, prompt_tokens: int, output_tokens: int) -> tuple[int, int]:
    """``(prompts, requests)`` the pool of ``kv_memory`` holds at once with KV spec
    ``spec`` at compute dtype ``dtype``: distinct prompts admitted side by side (their
    blocks), and whole requests (prompt + output) kept side by side. What a built-in
    scenario's binding properties are computed from, per baseline dtype, without the
    engine (``tests/bench/test_scenario_properties.py``)."""
    blocks = pool_tokens(config, spec, kv_memory, block_size, dtype) // block_size
    prompt_blocks = -(-prompt_tokens // block_size)
    request_blocks = -(-(prompt_tokens + output_tokens) // block_size)
    return blocks // prompt_blocks, blocks // request_blocks


def _check_budget(model: ModelEntry, config: ModelConfig, w: WorkloadEntry,
                  kv: list[str] | tuple[str, ...], engine: EngineArgs, problems,
                  seed: int) -> None:
    """A pool smaller than one request of the workload runs nothing: refuse it. With
    tiers a prompt is paged through them; with a selection policy only the prompt must
    fit (the policy keeps the rest within its budget; it is not paged, tiers or not)."""
    from kvmap.kv.config import KVConfig
    from kvmap.workloads.options import longest_prompt_tokens, longest_request_tokens
    kv_memory = w.kv_memory if w.kv_memory is not None else engine.kv_memory
    spec_of_w = w.spec(seed)
    for spec in kv:
        parsed = KVConfig.parse(spec)
        if parsed.tiers is not None and parsed.tiers.levels and parsed.policy is None:
            continue
        need = longest_prompt_tokens(spec_of_w) if parsed.policy is not None \
            else longest_request_tokens(spec_of_w)
        have = pool_tokens(config, spec, kv_memory, engine.block_size, model.dtype)
        if have < need:
            problems.add(f"workloads ({w.name}).kv_memory",
                         f"kv_memory={kv_memory!r} holds {have} tokens with KV spec "
                         f"{spec!r} on model {model.name!r}, fewer than one request of "
                         f"the workload ({need} tokens)")



def check_trace_arrivals(workloads, timeout_s: float | None, problems) -> None:
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


def check_searches(workloads: list[WorkloadEntry], slo: dict | None, problems) -> None:
    """An ``arrival: auto`` workload searches for the SLA capacity: it needs an SLA."""
    for w in workloads:
        if w.search is not None and not (w.slo or slo):
            problems.add(f"workloads ({w.name}).arrival", "auto finds the SLA capacity: the "
                         "workload or the scenario needs an slo")


def parse_memory_limit(raw, problems) -> int | None:
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
