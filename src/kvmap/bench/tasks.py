"""The accuracy tasks a scenario names, checked before any cell runs.

A task is a name from ``kvmap.evals.TASKS`` (``ppl``, ``passkey``, ``needle``, ...), run
through the evals ``Task`` API, or ``module:function`` with the contract
``function(llm, **params) -> dict`` of JSON-able metrics (``module`` may be a ``.py``
file, resolved against the scenario's folder).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

EVAL_PARAMS = ("context_tokens", "num_samples", "continuation_tokens", "depths",
               "num_needles", "data_path", "corpus", "num_top_logprobs")


class TaskUnavailable(ValueError):
    """A known task whose implementation cannot be imported (yet)."""


def is_eval_task(task: str) -> bool:
    return ":" not in task


def _import(module: str):
    """A module by dotted name, or a ``.py`` file by path."""
    if not module.endswith(".py"):
        return importlib.import_module(module)
    path = Path(module)
    if not path.is_file():
        raise ImportError(f"no file {module!r}")
    name = f"kvmap_user_task_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def resolve_task(task: str) -> Callable | str:
    """A ``module:function`` callable, or the name of an evals task (checked importable).

    ``ValueError`` for an unknown name or a reference that does not import;
    ``TaskUnavailable`` for a known evals task whose module is missing.
    """
    if not isinstance(task, str) or not task:
        raise ValueError(f"task {task!r} must be a task name or 'module:function'")
    if not is_eval_task(task):
        module_name, _, attr = task.rpartition(":")
        try:
            fn = getattr(_import(module_name), attr)
        except (ImportError, AttributeError, OSError) as e:
            raise ValueError(f"task {task!r} does not import: {e}") from None
        if not callable(fn):
            raise ValueError(f"task {task!r} is not callable")
        return fn
    try:
        from kvmap.evals import TASKS
    except ImportError as e:
        raise TaskUnavailable(f"the accuracy tasks (kvmap.evals) do not import: {e}") from None
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}, or "
                         "'module:function'")
    return task


def eval_options(params: dict, seed: int):
    """``EvalOptions`` from scenario task params (lists become tuples, ``corpus`` -> text)."""
    from kvmap.evals import EvalOptions
    from kvmap.workloads.corpus import load_text_file
    unknown = sorted(set(params) - set(EVAL_PARAMS))
    if unknown:
        raise ValueError(f"params: unknown parameter {unknown[0]!r}; valid: "
                         f"{', '.join(EVAL_PARAMS)}")
    kwargs = dict(params)
    for key in ("context_tokens", "depths"):
        if key in kwargs:
            value = kwargs[key]
            kwargs[key] = tuple(value) if isinstance(value, list) else (value,)
    if "data_path" in kwargs and not Path(kwargs["data_path"]).is_file():
        raise ValueError(f"params.data_path: data file {kwargs['data_path']!r} does not exist")
    if "corpus" in kwargs:
        kwargs["text"] = load_text_file(kwargs.pop("corpus"))
    return EvalOptions(**kwargs, seed=seed)


def check_task_params(task: str, fn: Callable | str, params: dict, seed: int = 0) -> None:
    """Refuse parameters the task does not take, before any cell runs."""
    if isinstance(fn, str):
        from kvmap.evals import get_task
        get_task(fn, eval_options(params, seed))
        return
    try:
        inspect.signature(fn).bind(None, **params)
    except TypeError as e:
        raise ValueError(f"params: task {task!r} does not take {sorted(params)}: {e}") from None


def task_tokens_needed(task: str, params: dict, seed: int = 0) -> int | None:
    """The longest sequence an evals task needs (None when not known in advance)."""
    if not is_eval_task(task):
        return None
    from kvmap.evals import get_task
    return get_task(task, eval_options(params, seed)).max_tokens_needed() or None


def task_kind(task: str, metrics: dict, details: dict) -> str:
    """How a task cell is judged, for its record (``CellRecord.task_kind``): an evals
    task's own ``kind``; a ``module:function`` task's ``kind`` attribute when the
    function sets one, else what its headline metric says (``record.headline_kind``:
    ``ppl``, ``accuracy``, a natural-stopping generation, or ``other``)."""
    from kvmap.runs.record import headline_kind
    fn = resolve_task(task)
    if isinstance(fn, str):
        from kvmap.evals import TASKS
        return TASKS[fn].kind
    declared = getattr(fn, "kind", None)
    return declared if isinstance(declared, str) else \
        headline_kind(metrics, details.get("per_sample"))
