"""A KV configuration is one value: codec + selection policy + tier layout (+ a hybrid
model's window layout, ``all_global``: ``kvmap.kv.window_layout``).

``KVConfig.parse("snapkv(budget=0.25)+int8(granularity=token)+tiers(host=512MiB)")``
looks each part up in the codec, policy and tier registries. Each registry's classes
take the part's options as keyword arguments and validate them, raising ValueError
naming the bad option. At most one part of each kind.

The codec ``auto`` -- and a spec with no codec part -- is the compute dtype's own cache
(``fp32``, ``bf16`` or ``fp16``): ``parse(text, dtype=...)`` says which; without a dtype
it is ``bf16`` (the planner's GPU default).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmap.kv import grammar
from kvmap.kv.redact import has_password, redact_spec
from kvmap.kv.codecs import CODECS, Codec
from kvmap.kv.offload.prefill import check_spec as _check_prefill_offload
from kvmap.kv.policies import POLICIES
from kvmap.kv.policies.base import Policy
from kvmap.kv.tiers import TIER_PARTS
from kvmap.kv.tiers.backend import backends_top_down
from kvmap.kv.tiers.layout import Layout
from kvmap.kv.window_layout import WINDOW_LAYOUTS, WindowLayout

_KINDS = {"codec": CODECS, "policy": POLICIES, "tiers": TIER_PARTS,
          "window layout": WINDOW_LAYOUTS}


AUTO_CODEC = "auto"


def plain_codec(dtype: str | None) -> str:
    """The codec that stores K/V as ``dtype`` computes them (``bf16`` for None)."""
    from kvmap.hardware.dtype import canonical_dtype
    return "bf16" if dtype is None or dtype == AUTO_CODEC else canonical_dtype(dtype)


def valid_names() -> list[str]:
    """Every spec-part name (codecs, policies, tier layouts, and ``auto``), sorted."""
    return sorted([AUTO_CODEC] + [name for registry in _KINDS.values() for name in registry])


def spec_names() -> dict[str, tuple[str, ...]]:
    """Registered names by family, for listings (``kvmap specs``): the spec parts and the
    tier backends a ``tiers(...)`` part accepts."""
    return {"codec": tuple(sorted([*CODECS, AUTO_CODEC])), "policy": tuple(sorted(POLICIES)),
            "tiers": tuple(sorted(TIER_PARTS)),
            "window layout": tuple(sorted(WINDOW_LAYOUTS)),
            "tier backend": tuple(b.name for b in backends_top_down())}


@dataclass(frozen=True)
class KVConfig:
    spec: str
    codec: Codec
    policy: Policy | None = None    # a selection policy; None: the full cache
    tiers: Layout | None = None     # ``tiers(...)`` or ``recompute``; None: no layout part
    # ``all_global``: a hybrid model's sliding layers keep their whole history; None:
    # they hold their window (kvmap.kv.window_layout)
    window_layout: WindowLayout | None = None

    @classmethod
    def parse(cls, text: str | "KVConfig", dtype: str | None = None) -> "KVConfig":
        """``text`` as a configuration; ``dtype`` (a concrete compute dtype) is what the
        codec ``auto``, or a spec without a codec, stores."""
        if isinstance(text, KVConfig):
            return text
        try:
            return cls._parse(text, dtype)
        except ValueError as e:   # messages quote the spec: never with its password
            if isinstance(text, str) and has_password(text):
                # the grammar's message may quote a piece of the password: say only this
                raise ValueError(f"bad KV spec {redact_spec(text)!r}: a URL in it carries "
                                 f"a password, which is never written into a spec: give "
                                 f"it in $KVMAP_REDIS_PASSWORD, or the URL in an "
                                 f"environment variable (redis=env:NAME)") from None
            message = redact_spec(str(e))
            if message == str(e):
                raise
            raise ValueError(message) from None

    @classmethod
    def _parse(cls, text: str, dtype: str | None) -> "KVConfig":
        parts = grammar.parse(text)
        found: dict[str, Any] = {}
        for part in parts:
            if part.name == AUTO_CODEC:
                if part.args:
                    raise ValueError(f"KV spec part {str(part)!r}: {AUTO_CODEC} takes no "
                                     "options (it is the compute dtype's own cache)")
                if "codec" in found:
                    raise ValueError(f"KV spec {text!r} has two codec parts: "
                                     f"{found['codec'].name!r} and {AUTO_CODEC!r}")
                found["codec"] = CODECS[plain_codec(dtype)]()
                continue
            kind = next((k for k, reg in _KINDS.items() if part.name in reg), None)
            if kind is None:
                raise ValueError(
                    f"unknown KV spec part {part.name!r} in {text!r}; valid names: "
                    f"{', '.join(valid_names())}")
            if kind in found:
                raise ValueError(
                    f"KV spec {text!r} has two {kind} parts: {found[kind].name!r} and "
                    f"{part.name!r}; give at most one")
            try:
                found[kind] = _KINDS[kind][part.name](**part.args)
            except TypeError as e:   # a class with a plain signature got a bad keyword
                raise ValueError(f"bad options in KV spec part {str(part)!r}: {e}") from None
        codec = found.get("codec") or CODECS[plain_codec(dtype)]()
        policy = found.get("policy")
        if policy is not None and getattr(policy, "name", None) == "full":
            policy = None
        _check_evict_to(text, policy, found.get("tiers"))
        _check_prefill_offload(text, policy, found.get("tiers"))
        return cls(spec=text.strip(), codec=codec, policy=policy, tiers=found.get("tiers"),
                   window_layout=found.get("window layout"))

    def __str__(self) -> str:
        return self.spec


def _check_evict_to(text: str, policy: Policy | None, tiers: Layout | None) -> None:
    """A policy's ``evict_to`` (soft eviction) must name a level of the spec's tiers."""
    level = getattr(policy, "evict_to", None)
    if level is None:
        return
    levels = [lv.name for lv in tiers.levels] if tiers is not None else []
    if level not in levels:
        has = (f"its tiers are {', '.join(levels)}" if levels else
               "it has no tiers(...) part; add e.g. tiers(host=1GiB)")
        raise ValueError(f"KV spec {text!r}: {policy.name}(evict_to={level}) names no tier "
                         f"level of the spec ({has})")
