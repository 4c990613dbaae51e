"""Typed views of a record's JSON payloads: ``view(cls, data, where)`` reads a JSON object
into a frozen dataclass whose fields all default (a record written by an older kvmap lacks
keys a newer one writes), keeps the keys the class does not name in its ``extra`` (a newer
writer's), renames a legacy key to its current name, and refuses a value of the wrong
kind with a ``ValueError`` naming the payload, the key and the value. A JSON null on a
field that is never None (a nested view, a list) keeps the field's default.

The checked kinds are read from the field's annotation: ``int | None`` and ``float |
None`` take any JSON number (a count is not refused for a fraction), ``bool | None``,
``str | None``, ``dict[...] | None``, ``list[...] | None``; a nested payload is read by
the converter its class names in ``nested``. The record keeps its payloads as JSON (its
``to_dict`` writes them back untouched); these views are how a reader takes them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")
Converter = Callable[[Any], Any]


def _kind_problem(kind: str, value: Any) -> str | None:
    """Why ``value`` is not of annotation ``kind`` (None when it is, or unchecked)."""
    if value is None:
        return None
    if kind.startswith("bool"):
        return None if isinstance(value, bool) else "is not true or false"
    if kind.startswith(("int", "float")):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "is not a number"
    elif kind.startswith("str") and not isinstance(value, str):
        return "is not a string"
    elif kind.startswith(("dict", "Mapping")) and not isinstance(value, Mapping):
        return "is not a JSON object"
    elif kind.startswith(("list", "tuple")) and not isinstance(value, (list, tuple)):
        return "is not a list"
    return None


_FIELDS: dict[type[Any], tuple[dict[str, str], frozenset[str]]] = {}


def _fields_of(cls: type[Any]) -> tuple[dict[str, str], frozenset[str]]:
    """``cls``'s fields -> their annotations, and the fields that are never None (a nested
    view, a list: a JSON null there keeps the default); read once per class."""
    if cls not in _FIELDS:
        found = fields(cls)
        _FIELDS[cls] = ({f.name: str(f.type) for f in found},
                        frozenset(f.name for f in found if not str(f.type).endswith("None")
                                  and str(f.type) != "Any"))
    return _FIELDS[cls]


def view(cls: type[T], data: Mapping[str, Any] | None, where: str,
         nested: Mapping[str, Converter] | None = None,
         renamed: Mapping[str, str] | None = None) -> T:
    """``data`` read into ``cls`` (see the module docstring); ``where`` names the payload
    in an error (``"metrics of cell abc"``; "" for a nested one, named by its key);
    ``renamed``: legacy key -> current field, used only where the current key is absent."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} is not a JSON object (a {type(data).__name__}: "
                         f"{data!r:.80})".lstrip())
    nested = nested or {}
    known, never_none = _fields_of(cls)
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in known else (renamed or {}).get(key)
        if name is None or name == "extra" or (name != key and name in data):
            extra[key] = value
            continue
        if value is None and name in never_none:
            continue
        if name in nested and value is not None:
            try:
                values[name] = nested[name](value)
            except ValueError as e:
                raise ValueError(f"{where}, {key}: {e}") from None
            continue
        problem = _kind_problem(known[name], value)
        if problem:
            raise ValueError((f"{where}: " if where else "") + f"{key}={value!r:.80} {problem}")
        values[name] = value
    if "extra" in known:
        values["extra"] = extra
    return cls(**values)
