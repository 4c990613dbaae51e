"""Engine settings (and any frozen dataclass of settings: ``kvmap serve``'s ``ServerArgs``)
as command-line options, declared once.

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
    return dataclass_options(EngineArgs, "engine", *names, flags=flags)


def dataclass_options(cls, param: str, *names: str, flags: dict[str, str] | None = None):
    """Decorator: options for the fields ``names`` of the frozen dataclass ``cls`` (each
    field's ``metadata["help"]`` its help); the command's own ``param`` parameter
    receives the ``cls`` they make (``kvmap serve``: ``ServerArgs`` as ``server``). A
    tuple field is a repeatable option."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [n for n in names if n not in fields]
    if unknown:
        raise ValueError(f"{param}_options: {unknown} are not {cls.__name__} fields")
    hints = typing.get_type_hints(cls)
    flags = flags or {}

    def decorate(fn):
        own = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        if param not in sig.parameters:
            raise TypeError(f"{fn.__name__} takes no {param!r} parameter")
        params = [p.replace(annotation=own.get(p.name, p.annotation))
                  for p in sig.parameters.values() if p.name != param]
        for name in names:
            f, hint = fields[name], hints[name]
            flag = flags.get(name, "--" + name.replace("_", "-"))
            repeated = typing.get_origin(hint) is tuple
            option = typer.Option(list(f.default) if repeated else f.default, flag,
                                  help=f.metadata.get("help"))
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                            default=option, annotation=list[str] if repeated
                                            else _cli_type(hint)))

        @functools.wraps(fn)
        def command(*args, **kwargs):
            settings = {name: kwargs.pop(name) for name in names}
            try:
                made = cls(**settings)
            except ValueError as e:
                fail(str(e))
            return fn(*args, **{param: made}, **kwargs)

        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command
    return decorate
