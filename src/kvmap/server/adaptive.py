"""Adaptive KV policy: a policy file maps load signals to KV configurations, and a
controller with hysteresis picks the configuration new requests get.

Policy file (YAML; see docs/serving.md and examples/adaptive.yaml)::

    window_s: 10          # P99 TBT is taken over the inter-token latencies of this window
    min_dwell_s: 5        # no switch sooner than this after the previous one
    levels:               # lightest load first; level 0 is where the server starts
      - kv: bf16
      - kv: int8
        up:   {kv_usage: 0.70, num_waiting: 4, p99_tbt_ms: 150}
        down: {kv_usage: 0.40, num_waiting: 0, p99_tbt_ms: 80}
      - kv: int4
        up:   {kv_usage: 0.85, num_waiting: 16}
        down: {kv_usage: 0.50, num_waiting: 2}
        max_num_seqs: 16              # optional per level: cap the batch (admission control)
        max_num_batched_tokens: 128   # and the step's token budget (shorter prefill chunks)

Rules, at level i (evaluated every ``interval_s``):

- go **up** to i+1 when ANY signal named in ``levels[i+1].up`` is >= its threshold;
- else go **down** to i-1 when EVERY signal named in ``levels[i].down`` is <= its
  threshold;
- never within ``min_dwell_s`` of the last switch.

Hysteresis: a signal named in both ``up`` and ``down`` of a level must have
``down < up``, so a load between the two keeps the current level -- together with the
dwell time, the controller cannot flap on a signal that hovers near one threshold.

Signals: ``kv_usage`` (fraction 0..1 of the active engine's pool in use),
``num_waiting`` (requests accepted but not yet scheduled), ``p99_tbt_ms`` (P99 of the
inter-token latencies observed in the last ``window_s`` seconds; 0 when there were none).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kvmap.kv.config import KVConfig

SIGNALS = ("kv_usage", "num_waiting", "p99_tbt_ms")


@dataclass(frozen=True)
class Signals:
    kv_usage: float = 0.0
    num_waiting: float = 0.0
    p99_tbt_ms: float = 0.0

    def get(self, name: str) -> float:
        return getattr(self, name)


def _thresholds(value, where: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}={value!r} must be a mapping of signal -> threshold")
    out = {}
    for name, threshold in value.items():
        if name not in SIGNALS:
            raise ValueError(f"{where}: unknown signal {name!r}; valid: {', '.join(SIGNALS)}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not math.isfinite(threshold) or threshold < 0:
            raise ValueError(f"{where}.{name}={threshold!r} must be a finite number >= 0")
        out[name] = float(threshold)
    return out


SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens")


@dataclass(frozen=True)
class AdaptiveLevel:
    kv: str
    up: dict = field(default_factory=dict)      # signal -> threshold to enter this level
    down: dict = field(default_factory=dict)    # signal -> threshold to leave it downwards
    # the engine of this level may also cap its batch (admission control): a cheaper KV
    # configuration frees memory, and without a cap that memory becomes more concurrent
    # sequences, which lengthens every step (measured: docs/serving.md)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    def scheduler_overrides(self) -> dict[str, int]:
        """The scheduler limits this level sets (the server's own for the rest)."""
        return {k: getattr(self, k) for k in SCHEDULER_KEYS if getattr(self, k) is not None}


@dataclass(frozen=True)
class AdaptivePolicy:
    levels: tuple[AdaptiveLevel, ...]
    window_s: float = 10.0
    min_dwell_s: float = 5.0
    interval_s: float = 0.25

    def __post_init__(self) -> None:
        if len(self.levels) < 2:
            raise ValueError(f"an adaptive policy needs at least 2 levels, got {len(self.levels)}")
        for name in ("window_s", "min_dwell_s", "interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")
        if self.window_s <= 0:
            raise ValueError(f"window_s={self.window_s!r} must be > 0")
        for i, level in enumerate(self.levels[1:], start=1):
            where = f"levels[{i}] ({level.kv})"
            if not level.up:
                raise ValueError(f"{where} has no 'up' thresholds: it could never be entered")
            if not level.down:
                raise ValueError(f"{where} has no 'down' thresholds: it could never be left")
            for name in set(level.up) & set(level.down):
                if not level.down[name] < level.up[name]:
                    raise ValueError(
                        f"{where}: down.{name}={level.down[name]} must be below "
                        f"up.{name}={level.up[name]} (hysteresis)")
        if self.levels[0].up or self.levels[0].down:
            raise ValueError("levels[0] is the starting level; it takes no up/down thresholds")

    @classmethod
    def from_dict(cls, data) -> AdaptivePolicy:
        if not isinstance(data, dict):
            raise ValueError(f"adaptive policy must be a mapping, got {type(data).__name__}")
        unknown = set(data) - {"levels", "window_s", "min_dwell_s", "interval_s"}
        if unknown:
            raise ValueError(f"adaptive policy: unknown keys {sorted(unknown)}")
        raw_levels = data.get("levels")
        if not isinstance(raw_levels, list):
            raise ValueError("adaptive policy: 'levels' must be a list of {kv, up, down}")
        levels = []
        for i, raw in enumerate(raw_levels):
            if not isinstance(raw, dict) or not isinstance(raw.get("kv"), str):
                raise ValueError(f"levels[{i}]={raw!r} must be a mapping with a 'kv' spec string")
            extra = set(raw) - {"kv", "up", "down", *SCHEDULER_KEYS}
            if extra:
                raise ValueError(f"levels[{i}]: unknown keys {sorted(extra)}")
            for key in SCHEDULER_KEYS:
                value = raw.get(key)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                          or value < 1):
                    raise ValueError(f"levels[{i}].{key}={value!r} must be a positive integer")
            try:
                KVConfig.parse(raw["kv"])
            except ValueError as e:
                raise ValueError(f"levels[{i}].kv: {e}") from None
            levels.append(AdaptiveLevel(raw["kv"],
                                        _thresholds(raw.get("up"), f"levels[{i}].up"),
                                        _thresholds(raw.get("down"), f"levels[{i}].down"),
                                        **{k: raw[k] for k in SCHEDULER_KEYS if k in raw}))
        options = {k: data[k] for k in ("window_s", "min_dwell_s", "interval_s") if k in data}
        return cls(levels=tuple(levels), **options)

    @classmethod
    def load(cls, path: str | Path) -> AdaptivePolicy:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"adaptive policy file {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"adaptive policy file {str(path)!r} is not valid YAML: {e}") \
                from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


class AdaptiveController:
    """Which level new requests get. ``decide`` is pure arithmetic on the signals it is
    given and the clock it is told; the server calls it from the engine thread."""

    def __init__(self, policy: AdaptivePolicy, now_s: float = 0.0):
        self.policy = policy
        self.level = 0
        self.last_switch_s = now_s
        self.num_switches = 0

    @property
    def kv(self) -> str:
        return self.policy.levels[self.level].kv

    def decide(self, signals: Signals, now_s: float) -> int | None:
        """The new level if the controller switches now (its state moves), else None."""
        if now_s - self.last_switch_s < self.policy.min_dwell_s:
            return None
        levels, i = self.policy.levels, self.level
        target = None
        if i + 1 < len(levels) and any(signals.get(name) >= threshold
                                       for name, threshold in levels[i + 1].up.items()):
            target = i + 1
        elif i > 0 and all(signals.get(name) <= threshold
                           for name, threshold in levels[i].down.items()):
            target = i - 1
        if target is not None:
            self.level = target
            self.last_switch_s = now_s
            self.num_switches += 1
        return target
