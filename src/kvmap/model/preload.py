"""Weights loaded once and kept in this process, for the processes forked from it.

A bench warm worker (``kvmap.bench.warm_worker``) calls ``loader.preload_model`` once
(which loads them and :func:`keep` keeps them), then forks a
child per cell; every ``load_model`` in a child with the same model, dtype and device gets
the kept weights (read copy-on-write: the fork shares the pages until someone writes) in a
fresh ``LoadedModel`` -- the engine takes the dict and sets ``loaded.weights = None``, and
never writes into a weight tensor, so the kept copy stays whole for the next fork.

Only the plain weights are kept (``load_model``'s ``_load``): the per-quantization extras
(int4 groups, calibration ids) are computed per call as before, so one warm worker serves
the dense model and each of its weight quantizations.
"""
from __future__ import annotations

from dataclasses import replace

_KEPT: dict[tuple[str, str, str], object] = {}       # (model, dtype, device) -> LoadedModel


def _key(model: str | None, dtype, device) -> tuple[str, str, str]:
    return (str(model or "").strip().lower(), str(dtype), str(device))


def keep(model: str | None, dtype, device, loaded) -> None:
    """Keep ``loaded`` (a ``LoadedModel`` of the default load options) for later
    ``load_model`` calls with these arguments (``kvmap.model.loader.preload_model``)."""
    _KEPT[_key(model, dtype, device)] = loaded


def kept(model: str | None, dtype, device) -> object | None:
    """A fresh ``LoadedModel`` over the kept weights of (model, dtype, device), or None.
    The dict is a new one (the engine empties its ``LoadedModel``), the tensors shared."""
    loaded = _KEPT.get(_key(model, dtype, device))
    if loaded is None:
        return None
    return replace(loaded, weights=dict(loaded.weights))


def forget() -> None:
    """Drop every kept model (tests)."""
    _KEPT.clear()
