"""Plumbing shared by the quantizing codecs (int8/int4/int2, fp8, KIVI).

:class:`QuantCodec` runs one quantizer for K and one for V
(:mod:`kvmap.kv.codecs.quantizers`); :class:`ScaledCodec` turns the int/fp8 options into
those quantizers. A concrete codec overrides only ``grid()``: which values a code holds.

Options of the int and fp8 codecs:

    granularity = tensor | head | channel | token | group   (see quantizers.py's table);
                  default per token (int8) / group (int4, int2) / tensor (fp8) with
                  scale=max, tensor with scale=ema, channel with scale=static
    group_size  = values per group along head_dim (granularity=group only); default 32,
                  or gcd(32, head_dim) when 32 does not divide head_dim
    symmetric   = true (absmax) | false (min/max with a zero point)
    scale       = max                 the current call's range (per slot, or per block
                                      for channel: block_quant.py)
                | ema                 moving-average range, per layer (tensor, head)
                | static(path=FILE)   calibrated ranges (tensor, head, channel), per layer
    momentum    = 0.9                 for scale=ema
"""
from __future__ import annotations

import re
from typing import Any, ClassVar

import torch

from kvmap.kv.codecs.base import Codec, LayerStore, ScaledRead
from kvmap.kv.codecs.block_quant import BlockQuant
from kvmap.kv.codecs.calibrate import load_ranges
from kvmap.kv.codecs.quant import Grid
from kvmap.kv.codecs.paired import allocate_pair, pairs, read_rows_pair, write_pair
from kvmap.kv.codecs.quantizers import EmaQuant, SlotQuant, StaticQuant, TensorQuant
from kvmap.kv.codecs.rows import HeadRows
from kvmap.kv.spec import KVGeometry

GRANULARITIES = {  # scale rule -> granularities it supports; the first is its default
    "max": ("token", "group", "channel", "head", "tensor"),   # default: the codec's own
    "ema": ("tensor", "head"),               # a range shared by the tokens of many calls
    "static": ("channel", "head", "tensor"),  # what a calibration file can hold
}


class QuantCodec(Codec):
    """K and V each through a :class:`TensorQuant`, built by ``quantizers()``."""

    def quantizers(self) -> dict[str, TensorQuant]:
        raise NotImplementedError

    def validate(self) -> None:
        """Subclasses check their own options first, then call this to build the
        quantizers. An optional ``group_size`` option is checked here for all."""
        gs = self.options.get("group_size")
        if gs is not None and (not isinstance(gs, int) or isinstance(gs, bool) or gs <= 0):
            raise ValueError(f"codec {self.name!r}: group_size={gs!r} must be a positive "
                             "integer")
        self.quant = self.quantizers()

    def validate_geometry(self, geom: KVGeometry) -> None:
        gs = self.options.get("group_size")
        if gs is not None and geom.head_dim % gs:
            raise ValueError(f"codec {self!r}: group_size={gs} does not divide "
                             f"head_dim={geom.head_dim}")
        for q in self.quant.values():
            if geom.head_dim * q.grid.bits % 8:
                raise ValueError(f"codec {self!r}: head_dim={geom.head_dim} does not pack "
                                 f"into bytes at {q.grid.bits} bits")

    def allocate(self, num_blocks: int, geom: KVGeometry, device, compute_dtype,
                 layer_id: int | None = None) -> LayerStore:
        """Zeroed storage of one layer. ``layer_id`` picks the layer's static ranges
        (None: layer 0, as for a one-block meta allocation that only counts bytes)."""
        self.validate_geometry(geom)
        store = LayerStore({}, state={"compute_dtype": compute_dtype, "layer_id": layer_id or 0})
        if pairs(self.quant["k"], self.quant["v"]):   # K and V stacked: paired.py
            allocate_pair(store, self.quant["k"], self.quant["v"], num_blocks, geom, device)
            return store
        for q in self.quant.values():
            q.allocate(num_blocks, geom, device, compute_dtype, store)
        return store

    def write(self, store: LayerStore, slot_ids: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        if write_pair(store, slot_ids, k, v, self.quant["k"]):
            return
        self.quant["k"].write(store, slot_ids, k)
        self.quant["v"].write(store, slot_ids, v)

    def read(self, store: LayerStore, block_ids: torch.Tensor):
        dtype = store.state["compute_dtype"]
        return (self.quant["k"].read(store, block_ids, dtype),
                self.quant["v"].read(store, block_ids, dtype))

    def read_scaled(self, store: LayerStore, block_ids: torch.Tensor
                    ) -> tuple[ScaledRead, ScaledRead] | None:
        return self._both("read_scaled", store, block_ids)

    def read_rows_scaled(self, store: LayerStore, rows: HeadRows
                         ) -> tuple[ScaledRead, ScaledRead] | None:
        """``read_scaled`` of a decode batch's slots heads first (``TensorQuant``)."""
        return self._rows(store, rows, True) or self._both("read_rows_scaled", store, rows)

    def _rows(self, store: LayerStore, rows: HeadRows, scaled: bool):
        """K and V of ``rows`` read together from stacked buffers (paired.py), or None."""
        if not pairs(self.quant["k"], self.quant["v"]):
            return None
        return read_rows_pair(store, rows, self.quant["k"], store.state["compute_dtype"],
                              scaled)

    def _both(self, method: str, store: LayerStore, where):
        """K's quantizer's ``method(store, where, compute dtype)``, then V's: the pair, or
        None when either has no such form (V is not read when K has none)."""
        dtype = store.state["compute_dtype"]
        k = getattr(self.quant["k"], method)(store, where, dtype)
        v = None if k is None else getattr(self.quant["v"], method)(store, where, dtype)
        return None if v is None else (k, v)


class ScaledCodec(QuantCodec):
    """An int or fp8 codec with the options above; subclasses override ``grid()``."""

    defaults: ClassVar[dict[str, Any]] = {
        "granularity": None, "group_size": None, "symmetric": True, "scale": "max",
        "momentum": 0.9}
    default_granularity: ClassVar[str] = "token"     # with scale=max

    def grid(self) -> Grid:
        raise NotImplementedError

    def validate(self) -> None:
        o = self.options
        rule, path = _scale_rule(o["scale"], self.name)
        allowed = GRANULARITIES[rule]
        self.granularity = o["granularity"] or (
            self.default_granularity if rule == "max" else allowed[0])
        if self.granularity not in allowed:
            raise ValueError(f"codec {self.name!r}: granularity={self.granularity!r} is not "
                             f"valid with scale={rule}; choose one of {', '.join(allowed)}")
        if self.granularity != "group" and o["group_size"] is not None:
            raise ValueError(f"codec {self.name!r}: group_size={o['group_size']!r} applies "
                             "only to granularity=group")
        if not isinstance(o["symmetric"], bool):
            raise ValueError(f"codec {self.name!r}: symmetric={o['symmetric']!r} must be "
                             "true or false")
        if not isinstance(o["momentum"], (int, float)) or not 0 < o["momentum"] < 1:
            raise ValueError(f"codec {self.name!r}: momentum={o['momentum']!r} must be "
                             "in (0, 1)")
        self.rule = rule
        self.ranges = load_ranges(path) if rule == "static" else None
        super().validate()

    def read_rows(self, store: LayerStore, rows: HeadRows):
        return self._rows(store, rows, False) or self._both("read_rows", store, rows)

    def quantizers(self) -> dict[str, TensorQuant]:
        o, grid = self.options, self.grid()
        args = (grid, o["symmetric"], self.granularity, o["group_size"])
        if self.rule == "static":
            return {p: StaticQuant(p, *args) for p in ("k", "v")}
        if self.rule == "ema":
            return {p: EmaQuant(p, *args, momentum=o["momentum"]) for p in ("k", "v")}
        if self.granularity == "channel":
            return {p: BlockQuant(p, grid, o["symmetric"]) for p in ("k", "v")}
        return {p: SlotQuant(p, *args) for p in ("k", "v")}

    def validate_geometry(self, geom: KVGeometry) -> None:
        super().validate_geometry(geom)
        if self.ranges is not None:
            shape = (geom.num_kv_heads, geom.head_dim)
            found = (len(self.ranges), tuple(self.ranges[0]["k.lo"].shape))
            if found != (geom.num_layers, shape):
                raise ValueError(f"codec {self!r}: static scale file has {found[0]} layers "
                                 f"of shape {found[1]}, the model {geom.num_layers} of {shape}")

    def allocate(self, num_blocks, geom, device, compute_dtype, layer_id=None) -> LayerStore:
        store = super().allocate(num_blocks, geom, device, compute_dtype, layer_id)
        if self.ranges is not None:
            layer = self.ranges[store.state["layer_id"]]
            for p, q in self.quant.items():
                q.set_range(store, layer[f"{p}.lo"], layer[f"{p}.hi"])
        return store


def _scale_rule(value, codec_name: str) -> tuple[str, str | None]:
    """'max' | 'ema' | static(path=FILE) -> (rule, path). The spec grammar gives static
    as a ``Part`` (name, args); Python callers may pass the text."""
    text = re.fullmatch(r"static\(path=(.+)\)", value.strip()) if isinstance(value, str) else None
    if text:
        return "static", text.group(1).strip()
    if getattr(value, "name", None) == "static":
        if set(value.args) != {"path"}:
            raise ValueError(f"codec {codec_name!r}: scale={value} takes exactly one "
                             "option, path=FILE")
        return "static", str(value.args["path"])
    if value in ("max", "ema"):
        return value, None
    raise ValueError(f"codec {codec_name!r}: scale={value!s} is not one of max, ema, "
                     "static(path=FILE)")

