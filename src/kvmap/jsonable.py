"""``jsonable``: a value as JSON can hold it, at the JSON edge of a typed record (a bench
cell's ``CellRecord``, a simulation's ``SimResult``). A floor module: imports nothing."""
from __future__ import annotations

import math


def jsonable(value, finite_only: bool = False):
    """Numbers, strings, lists and dicts only: tuples become lists, keys strings, tensors
    and numpy scalars their Python number (``.item()``), anything else its ``str``. With
    ``finite_only``, a NaN or infinite float becomes None (strict JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, finite_only) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, finite_only) for v in value]
    if isinstance(value, float) and finite_only and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        return jsonable(value.item(), finite_only)
    return str(value)
