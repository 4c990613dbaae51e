"""Fetch or recompute: a cost model that decides, per request, whether the part of a
prefix that lives in the tiers is fetched or recomputed by prefill.

    fetch_s     = sum over the blocks to fetch of  latency_s[tier] + bytes / bandwidth[tier]
    recompute_s = prefill_flops(first_token, last_token) / compute_flops_per_s

Fetch when ``fetch_s < recompute_s``. Every decision is counted.

What is measured, and how:

- ``bandwidth[tier]``: effective bytes per second of fetching one block from that tier
  into the pool, end to end (the tier read, the frame check, a codec conversion if any,
  the copy into every layer). Each fetched block updates it with
  ``bytes / (seconds - latency_s)``, an exponential moving average; until the first
  fetch it is the backend's ``bandwidth_prior_bytes_per_s``.
- ``latency_s[tier]``: a per-kind prior, the backend's ``latency_prior_s`` (``backend.py``;
  host 20 us, disk 200 us, Redis 500 us). All
  blocks of one level have the same size, so one size cannot separate latency from
  bandwidth; the prior latency only shapes how the measured time is split.
- ``compute_flops_per_s``: FLOPs over seconds of every engine step that computed prompt
  tokens (its model run only), as a moving average; the prior is the machine's
  prefill-shaped product rate (``kvmap.hardware.profile.prefill_flops_prior``: the
  cached profile's, else the profile's own probe), which overestimates the model's rate
  until the first prefill step is observed.

FLOPs of a prefill follow the usual dense count: 2 x (weights a token multiplies) per
token, plus causal attention, 4 x layers x heads x head_dim per (query, key) pair.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kvmap.config import ModelConfig
from kvmap.kv.tiers.backend import TIER_BACKENDS

EMA_WEIGHT = 0.2   # weight of a new observation; the first one replaces the prior


def prefill_flops(config: ModelConfig, start_token: int, end_token: int) -> float:
    """FLOPs of computing tokens ``[start_token, end_token)`` of one sequence whose first
    ``start_token`` tokens are cached (the LM head, used once, is left out)::

        dense      2 * n * layers * (h * d * (2 * heads + 2 * kv_heads) + 3 * h * ffn)
        attention  4 * layers * heads * d * sum_{t=start}^{end-1} (t + 1)
    """
    if not 0 <= start_token <= end_token:
        raise ValueError(f"token span [{start_token}, {end_token}) is not a span")
    c = config
    n = end_token - start_token
    weights = (c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
               + 3 * c.hidden_size * c.intermediate_size)
    pairs = (end_token * (end_token + 1) - start_token * (start_token + 1)) // 2
    return 2.0 * n * c.num_layers * weights + 4.0 * c.num_layers * c.num_heads * c.head_dim * pairs


@dataclass
class LinkEstimate:
    """Cost of fetching from one tier: ``num_blocks * latency_s + bytes / bandwidth``."""

    latency_s: float
    bandwidth_bytes_per_s: float
    num_observations: int = 0

    def seconds(self, num_blocks: int, num_bytes: int) -> float:
        return num_blocks * self.latency_s + num_bytes / self.bandwidth_bytes_per_s

    def observe(self, num_bytes: int, seconds: float) -> None:
        """One block of ``num_bytes`` took ``seconds`` to fetch, end to end."""
        transfer_s = max(seconds - self.latency_s, 0.1 * seconds, 1e-9)
        measured = num_bytes / transfer_s
        w = 1.0 if self.num_observations == 0 else EMA_WEIGHT
        self.bandwidth_bytes_per_s += w * (measured - self.bandwidth_bytes_per_s)
        self.num_observations += 1


class CostModel:
    """Decides fetch or recompute; counts decisions in ``decisions`` ("fetch",
    "recompute") and sums the estimates it acted on. ``mode="always"`` fetches without
    asking the model (the decisions are still counted, as "fetch")."""

    def __init__(self, model_config: ModelConfig, tier_kinds: list[str],
                 compute_flops_per_s: float, mode: str = "cost") -> None:
        if mode not in ("cost", "always"):
            raise ValueError(f"mode={mode!r} is not one of cost, always")
        if not compute_flops_per_s > 0:
            raise ValueError(f"compute_flops_per_s={compute_flops_per_s!r} must be positive")
        self.model_config = model_config
        self.mode = mode
        self.links = {kind: LinkEstimate(TIER_BACKENDS[kind].latency_prior_s,
                                         TIER_BACKENDS[kind].bandwidth_prior_bytes_per_s)
                      for kind in tier_kinds}
        self.compute_flops_per_s = compute_flops_per_s
        self.num_compute_observations = 0
        self.decisions: Counter = Counter()
        self.estimated_fetch_s = 0.0       # summed over decisions to fetch
        self.estimated_recompute_s = 0.0   # summed over decisions to recompute

    def observe_run(self, token_spans: list[tuple[int, int]], seconds: float) -> None:
        """A model run computed ``[start, end)`` of each sequence in ``seconds``. Only
        runs with prompt work (some span longer than one token) teach the rate."""
        if seconds <= 0 or not any(end - start > 1 for start, end in token_spans):
            return
        rate = sum(prefill_flops(self.model_config, s, e) for s, e in token_spans) / seconds
        w = 1.0 if self.num_compute_observations == 0 else EMA_WEIGHT
        self.compute_flops_per_s += w * (rate - self.compute_flops_per_s)
        self.num_compute_observations += 1

    def fetch_s(self, blocks: list[tuple[str, int]]) -> float:
        """Predicted seconds to fetch ``blocks``, each (tier kind, bytes)."""
        return sum(self.links[kind].seconds(1, num_bytes) for kind, num_bytes in blocks)

    def recompute_s(self, start_token: int, end_token: int) -> float:
        return prefill_flops(self.model_config, start_token, end_token) / \
            self.compute_flops_per_s

    def decide(self, blocks: list[tuple[str, int]], start_token: int, end_token: int) -> bool:
        """True to fetch ``blocks`` (tier kind, bytes) that hold tokens
        ``[start_token, end_token)``; False to recompute them. Counted."""
        fetch_s = self.fetch_s(blocks)
        recompute_s = self.recompute_s(start_token, end_token)
        fetch = self.mode == "always" or fetch_s < recompute_s
        self.decisions["fetch" if fetch else "recompute"] += 1
        if fetch:
            self.estimated_fetch_s += fetch_s
        else:
            self.estimated_recompute_s += recompute_s
        return fetch

    def observe_fetch(self, kind: str, num_bytes: int, seconds: float) -> None:
        self.links[kind].observe(num_bytes, seconds)

    def as_dict(self) -> dict:
        return {"mode": self.mode, "decisions": dict(self.decisions),
                "compute_flops_per_s": self.compute_flops_per_s,
                "estimated_fetch_s": self.estimated_fetch_s,
                "estimated_recompute_s": self.estimated_recompute_s,
                "links": {kind: {"latency_s": link.latency_s,
                                 "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                                 "num_observations": link.num_observations}
                          for kind, link in self.links.items()}}
