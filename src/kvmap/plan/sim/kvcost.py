"""What a KV configuration costs a step beyond its bytes: the codec's write and read, a
selection policy's scoring, per layer.

The roofline (:mod:`kvmap.plan.sim.costmodel`) charges KV by its bytes alone, which is
what a GPU kernel that dequantizes inside attention costs (vLLM's fp8 KV, KIVI's
kernels). A CPU runs the codec's read as separate operators -- gather, convert, scale --
whose time per token depends on the codec, not on its bytes: a 4-bit cache reads fewer
bytes than an 8-bit one and takes longer to decode. ``KVCosts`` holds those times, per
layer, as a scenario gives them (``kv_costs:``; on ``cpu-this-machine`` the calibration
record's codec factor holds them instead, :mod:`kvmap.perf.roofline`)::

    codec_s    = layers x (read_s x decode KV tokens + prefill_read_s x prefill context
                 tokens + write_s x tokens written + stats_s x tokens a policy's
                 statistics cover + compress_s x tokens compressed)
    overhead  += layers x (step_s x [the step decodes] + seq_s x decoding rows
                            + activation_s x tokens computed + pair_s x prefill pairs)

``step_s`` and ``seq_s`` are the codec's fixed costs *beyond* those of the reference
codec the machine's per-operator overheads were measured with (``reference``), so they
are not counted twice. ``activation_s`` and ``pair_s`` are not the KV's: they are a
layer's elementwise work per token (norms, rotary, activations, residual adds) and per
causal (query, key) pair of a prefill chunk's attention (masks, softmax, copies) beyond
its matrix products at this geometry, the same for every configuration, kept here
because they are measured per model geometry as the rest is. ``source`` says where the figures come from; ``BYTES_ONLY`` (all
zero) is the assumption for a spec-sheet GPU.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

PER_TOKEN = ("read_s", "prefill_read_s", "write_s", "stats_s", "compress_s",
             "activation_s", "pair_s")
FIXED = ("step_s", "seq_s")


@dataclass(frozen=True)
class KVCosts:
    """Per-layer seconds of one KV configuration (see the module docstring)."""

    spec: str
    source: str = "given"            # "measured" | "given" | "assumed: bytes only"
    reference: str | None = None      # the codec the overheads already hold
    read_s: float = 0.0
    prefill_read_s: float = 0.0
    write_s: float = 0.0
    stats_s: float = 0.0
    compress_s: float = 0.0
    activation_s: float = 0.0
    pair_s: float = 0.0
    step_s: float = 0.0
    seq_s: float = 0.0

    def __post_init__(self) -> None:
        for name in (*PER_TOKEN, *FIXED):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"kv_costs[{self.spec!r}].{name}={value!r} must be a "
                                 "finite number of seconds >= 0")

    @property
    def charges(self) -> bool:
        return any(getattr(self, name) for name in (*PER_TOKEN, *FIXED))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "KVCosts":
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"kv_costs: unknown key(s) {', '.join(extra)}; known: "
                             f"{', '.join(sorted(known))}")
        return cls(**data)


def bytes_only(spec: str) -> KVCosts:
    """A GPU whose attention kernels read the codec's bytes and decode in registers."""
    return KVCosts(spec=spec, source="assumed: bytes only (fused kernels)")


