"""Endpoints on the map: a server measured over HTTP is one more configuration, named by
its ``name (kv_label)``, whose accuracy baseline is the one its scenario chose.

An endpoint's cells carry ``metrics.endpoint`` (``kvmap.bench.endpoint_http``:
``name``, ``label``, ``kv_label``, ``baseline`` ...) and its name as their ``kv``. Its
baseline for a task: the cell of that task of the endpoint named by ``baseline``, else
kvmap's own cell of the KV spec it names -- by default the model's dtype -- on dense
weights, preferring the same model name. Both figures use the same definition: an
endpoint runs ``prompt_ppl`` (``ppl_definition: prompt_logprobs``), never ``ppl``.
"""
from __future__ import annotations


def endpoint_of(cells: list[dict]) -> dict | None:
    """The ``metrics.endpoint`` of the first of ``cells`` that has one."""
    return next(((c.get("metrics") or {}).get("endpoint") for c in cells
                 if (c.get("metrics") or {}).get("endpoint")), None)


def endpoint_baseline(cell: dict, endpoint: dict, cells: list[dict]) -> dict | None:
    """The baseline cell of an endpoint's task cell (module docstring); None if none ran."""
    wanted = endpoint.get("baseline")
    same_task = [c for c in cells if c.get("task") == cell["task"] and c is not cell]
    names = {(endpoint_of([c]) or {}).get("name") for c in same_task}
    if wanted is not None and wanted in names:
        return next(c for c in same_task if (endpoint_of([c]) or {}).get("name") == wanted)
    own = [c for c in same_task if not endpoint_of([c]) and c.get("quantization") is None
           and c["kv"] == (wanted or c.get("dtype"))]
    own.sort(key=lambda c: c["model"] != cell["model"])
    return own[0] if own else None


def memory_note(cells: list[dict]) -> str | None:
    """Why an endpoint has no memory coordinate (its cells' ``kv_memory_note``)."""
    return next(((c.get("metrics") or {}).get("kv_memory_note") for c in cells
                 if (c.get("metrics") or {}).get("kv_memory_note")), None)
