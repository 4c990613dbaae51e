"""The configuration space ``kvmap tune`` searches, and its points.

A space names codecs (spec parts, granularity included: ``int8(granularity=token)``),
selection policies each with the budget fractions to try, tier layouts and
``max_num_seqs`` values. It is read from a small YAML file (``examples/tune-space.yaml``)::

    codecs: [bf16, int8, int4]
    policies:
      - {name: streaming_llm, budgets: [0.125, 0.25, 0.5, 0.75], sinks: 4}
    full_cache: true            # also each codec without a policy (default true)
    tiers: [null]               # null: no tier layout; or "tiers(host=64MiB)"
    max_num_seqs: [16, 64]      # default: the engine's

A *family* is a codec x tier layout x policy (or none); its points differ only by the
policy's budget, ascending, so accuracy is expected to rise and memory to grow along
them -- the search bisects on that order (``search``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvmap.kv.codecs import CODECS
from kvmap.kv.config import KVConfig
from kvmap.kv.grammar import parse
from kvmap.kv.policies import POLICIES
from kvmap.kv.spec import KVGeometry

SPACE_KEYS = {"codecs", "policies", "full_cache", "tiers", "max_num_seqs"}
DEFAULT_BUDGETS = (0.125, 0.25, 0.5, 0.75)
# a reference geometry: only the ratio of bytes per token between codecs is used
_GEOMETRY = KVGeometry(num_layers=1, num_kv_heads=1, head_dim=64)


@dataclass(frozen=True)
class PolicyAxis:
    """One policy and the budget fractions (of the prompt kept) to try, ascending."""

    name: str
    budgets: tuple[float, ...] = DEFAULT_BUDGETS
    params: dict = field(default_factory=dict)      # its other options (``sinks``...)

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"policy {self.name!r} is not registered; valid policies: "
                             f"{', '.join(sorted(POLICIES))}")
        if not self.budgets:
            raise ValueError(f"policy {self.name!r}: budgets is empty")
        for b in self.budgets:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < 1:
                raise ValueError(f"policy {self.name!r}: budget {b!r} must be a fraction "
                                 "in (0, 1)")
        if list(self.budgets) != sorted(set(self.budgets)):
            raise ValueError(f"policy {self.name!r}: budgets {list(self.budgets)} must "
                             "increase")

    def part(self, budget: float) -> str:
        args = ",".join(f"{k}={v}" for k, v in {"budget": budget, **self.params}.items())
        return f"{self.name}({args})"


@dataclass(frozen=True)
class Family:
    """A codec, a tier layout and a policy (None: the full cache) -- one line of points."""

    codec: str
    policy: PolicyAxis | None = None
    tiers: str | None = None

    @property
    def budgets(self) -> tuple[float | None, ...]:
        return self.policy.budgets if self.policy else (None,)

    def kv(self, index: int) -> str:
        """The spec string of the family's ``index``-th point (budget order)."""
        parts = [self.policy.part(self.budgets[index])] if self.policy else []
        return "+".join(parts + [self.codec] + ([self.tiers] if self.tiers else []))

    def points(self) -> list[str]:
        return [self.kv(i) for i in range(len(self.budgets))]

    def cost(self) -> float:
        """Relative bytes of the family's cheapest point (codec bytes x smallest budget):
        the order a memory search visits families in, so a good incumbent comes early."""
        codec = KVConfig.parse(self.codec).codec
        return codec.bytes_per_token(_GEOMETRY) * (self.budgets[0] or 1.0)


@dataclass(frozen=True)
class TuneSpace:
    codecs: tuple[str, ...]
    policies: tuple[PolicyAxis, ...] = ()
    full_cache: bool = True
    tiers: tuple[str | None, ...] = (None,)
    max_num_seqs: tuple[int, ...] = ()             # empty: the engine's

    def __post_init__(self) -> None:
        for c in self.codecs:
            name = parse(c)[0].name if isinstance(c, str) and c.strip() else c
            if name not in CODECS:
                raise ValueError(f"codec {c!r} is not registered; valid codecs: "
                                 f"{', '.join(sorted(CODECS))}")
            KVConfig.parse(c)                       # its options, named on error
        for t in self.tiers:
            if t is not None:
                KVConfig.parse(t)
        for n in self.max_num_seqs:
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"max_num_seqs {n!r} must be a positive integer")
        if not self.families():
            raise ValueError("the tune space is empty: give at least one codec and either "
                             "full_cache: true or at least one policy")

    def families(self) -> list[Family]:
        axes: list[PolicyAxis | None] = ([None] if self.full_cache else []) + list(self.policies)
        return [Family(c, p, t) for c in self.codecs for t in self.tiers for p in axes]

    def all_kv(self) -> list[str]:
        return [kv for f in self.families() for kv in f.points()]


def space_from_dict(data: dict, source: str = "<space>") -> TuneSpace:
    """A space from its YAML mapping; ValueError naming the source and the bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a tune space is a mapping of {sorted(SPACE_KEYS)}")
    unknown = sorted(set(data) - SPACE_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; valid keys: "
                         f"{', '.join(sorted(SPACE_KEYS))}")
    try:
        policies = []
        for p in data.get("policies") or []:
            p = dict(p) if isinstance(p, dict) else {"name": p}
            name = p.pop("name", None)
            budgets = tuple(p.pop("budgets", DEFAULT_BUDGETS))
            policies.append(PolicyAxis(name, budgets, p))
        return TuneSpace(codecs=tuple(data.get("codecs") or ()), policies=tuple(policies),
                         full_cache=bool(data.get("full_cache", True)),
                         tiers=tuple(data.get("tiers") or (None,)),
                         max_num_seqs=tuple(data.get("max_num_seqs") or ()))
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def load_space(path: str | Path) -> TuneSpace:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--space {str(path)!r} does not exist or is not a file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return space_from_dict(data, str(path))
