"""Engine settings as command-line options, declared once.

Each ``EngineArgs`` field (``kvmap.config``) carries its default and its help; a command
that takes engine settings names the fields it offers::

    @engine_options("model", "dtype", "kv", "kv_memory", "quantization")
    def generate(prompt: str = typer.Argument(...), ..., engine: EngineArgs = None): ...

and gets one ``--model``, ``--dtype``, ... option per field (``--kv-memory`` for
``kv_memory``; ``flags`` renames one, e.g. ``{"num_threads": "--threads"}``) with the
field's default and help, and is called with ``engine``: the ``EngineArgs`` they make.
A bad value exits with code 2 naming it (``cli_errors.fail``), before the command runs.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from typing import Any, Optional, Union

import typer

from kvmap.cli_errors import fail
from kvmap.config import EngineArgs


def _cli_type(hint: Any) -> Any:
    """The option type of a field: ``X | None`` -> ``Optional[X]``; a union of several
    types (``str | int``) -> ``str`` (the field parses the text)."""
    if typing.get_origin(hint) not in (Union, types.UnionType):
        return hint
    args = typing.get_args(hint)
    kinds = [a for a in args if a is not type(None)]
    kind = kinds[0] if len(kinds) == 1 else str
    return Optional[kind] if type(None) in args else kind


def engine_options(*names: str, flags: dict[str, str] | None = None):
    """Decorator: options for the ``EngineArgs`` fields ``names``; the command's own
    ``engine`` parameter receives the ``EngineArgs`` (see the module docstring)."""
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise ValueError(f"engine_options: {unknown} are not EngineArgs fields")
    hints = typing.get_type_hints(EngineArgs)
    flags = flags or {}

    def decorate(fn):
        own = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        if "engine" not in sig.parameters:
            raise TypeError(f"{fn.__name__} takes no 'engine' parameter")
        params = [p.replace(annotation=own.get(p.name, p.annotation))
                  for p in sig.parameters.values() if p.name != "engine"]
        for name in names:
            f = fields[name]
            flag = flags.get(name, "--" + name.replace("_", "-"))
            option = typer.Option(f.default, flag, help=f.metadata.get("help"))
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                            default=option,
                                            annotation=_cli_type(hints[name])))

        @functools.wraps(fn)
        def command(*args, **kwargs):
            settings = {name: kwargs.pop(name) for name in names}
            try:
                engine = EngineArgs(**settings)
            except ValueError as e:
                fail(str(e))
            return fn(*args, engine=engine, **kwargs)

        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command
    return decorate
