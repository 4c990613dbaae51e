"""Selection policies: which cached tokens to keep when a sequence exceeds its budget.

A policy only scores tokens; the base class does the rest (budget arithmetic, forced
keeps, top-k per KV head). The engine (``kvmap.engine.policy_runner``) calls it during
prefill (after each prefill chunk that leaves the sequence over its budget, when
``chunked``; otherwise once, after the chunk that completes the prompt) and during
decoding (every ``decode_every`` decode steps, see below), layer by layer,
then compacts the kept tokens into the sequence's first blocks and returns the freed
blocks to the pool (``kvmap.kv.compaction``).

``chunked`` bounds the peak: with prefill chunks of C tokens a sequence never holds more
than ``budget + C`` slots, instead of its whole prompt before the first compression. A
budget given as a fraction of the prompt is known at admission (the prompt length is),
so the first chunks already compress to the final budget.

Selection is per layer and per KV head: head h of layer l may keep different tokens,
but every head keeps the same number. With ``layer_budgets``
(``kvmap.kv.policies.layer_budgets``: ``pyramid`` or one budget per layer) layers keep
different numbers: a smaller layer's unused slots are masked out of attention, and with
per-layer block tables (``layer_tables``, ``kvmap.kv.layer_pool``) their blocks are
returned to the pool.

Decoding-time compression (``decode_every``, an option of every budgeted policy): a long
generation grows the cache one slot a step past the budget; once it has grown
``decode_every`` slots past it, the sequence is compressed back to the budget and the
emptied tail blocks go back to the pool, so during decode a sequence holds at most
``budget + decode_every - 1`` slots (rounded up to whole blocks). Unset, it is the
engine's block size (compress whenever a whole block is spent); ``0`` never compresses
during decode (only the prompt is compressed, as kvpress does: the cache then grows by
one token a step). Larger values compress less often (less scoring work) for a higher
peak. The budget is the target in both phases: a token count (a cap, however long the
generation), or a fraction of the prompt.

Slots are in time order (compaction preserves order), so "recent" means the last slots
and "sinks" the first ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvmap.kv.options import Options
from kvmap.kv.policies.layer_budgets import parse_layer_budgets, split_budget
from kvmap.registry import Registry


@dataclass
class ScoreInputs:
    """What a policy may look at for one layer of one sequence. L = cached slots."""

    layer_idx: int
    keys: torch.Tensor               # (L, H, D) as read back from the cache, compute dtype
    values: torch.Tensor             # (L, H, D)
    window_attention: torch.Tensor | None  # (H, W, L) fp32: attention of the last W queries
                                            # (summed over the query heads of each KV head)
    accumulated_attention: torch.Tensor | None  # (H, L) fp32: attention each key received
                                                # from every query so far (H2O)
    num_prompt_tokens: int
    generator: torch.Generator | None = None


class Policy(Options):
    """Base selection policy. Subclasses override ``score`` (and may set the flags)."""

    kind: ClassVar[str] = "policy"
    defaults: ClassVar[dict] = {"budget": 0.25, "sinks": 0, "recent": 0}
    # which attention statistics the engine must collect for this policy
    needs_window_attention: ClassVar[bool] = False
    needs_accumulated_attention: ClassVar[bool] = False

    def __init__(self, **options) -> None:
        super().__init__(**options)          # validate() first: some policies own theirs
        evict_to = self.options.get("evict_to")
        if evict_to is not None and not isinstance(evict_to, str):
            raise ValueError(f"{self.name}(evict_to={evict_to!r}) must name a tier level "
                             f"(host, disk, redis)")
        if evict_to is not None and self.chunked:
            default = "" if "chunked" in options else f" (the default of {self.name})"
            raise ValueError(f"{self.name}(evict_to={evict_to}): chunked=true{default} "
                             f"rewrites the prompt's blocks chunk by chunk, before soft "
                             f"eviction could keep them whole; give chunked=false")

    def __init_subclass__(cls, **kwargs) -> None:
        # every policy takes ``evict_to`` (soft eviction, see ``evict_to`` below)
        super().__init_subclass__(**kwargs)
        if "evict_to" not in cls.defaults:
            cls.defaults = {**cls.defaults, "evict_to": None}

    @property
    def observation_window(self) -> int:
        return 1

    @property
    def evict_to(self) -> str | None:
        """Soft eviction: the tier level (``host``, ``disk``, ``redis``) that keeps the
        prompt blocks compaction drops, so that a later request or turn sharing the
        prefix fetches them back; None: dropped (hard eviction). Which levels exist is
        the KV spec's ``tiers(...)`` part, checked by ``KVConfig.parse``."""
        return self.options.get("evict_to")

    @property
    def chunked(self) -> bool:
        """Compress after every prefill chunk (True) or only once the prompt is done."""
        return bool(self.options.get("chunked", False))

    def validate(self) -> None:
        chunked = self.options.get("chunked", False)
        if not isinstance(chunked, bool):
            raise ValueError(f"{self.name}(chunked={chunked!r}) must be true or false")
        b = self.options.get("budget")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b <= 0 or \
                (isinstance(b, float) and b > 1):
            raise ValueError(f"{self.name}(budget={b!r}): a budget is a token count >= 1 "
                             f"or a fraction of the prompt in (0, 1]")
        if "layer_budgets" in self.options:
            parse_layer_budgets(self.options["layer_budgets"])
        tables = self.options.get("layer_tables")
        if tables not in (None, "shared", "per-layer"):
            raise ValueError(f"{self.name}(layer_tables={tables!r}) must be shared or "
                             f"per-layer (unset: per-layer when the codec allows it)")
        self.validate_decode_every()
        for key in ("sinks", "recent", "window"):
            v = self.options.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{self.name}({key}={v!r}) must be an integer >= 0")

    def validate_decode_every(self) -> None:
        every = self.options.get("decode_every")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                                  or every < 0):
            raise ValueError(f"{self.name}(decode_every={every!r}) must be an integer >= 0: "
                             f"decode steps between compressions (0 = never during decode; "
                             f"unset = one block)")

    def decode_every_steps(self, block_size: int) -> int:
        """Decode steps between two compressions of a sequence (module docstring): the
        ``decode_every`` option, by default ``block_size``; 0 = none during decode."""
        every = self.options.get("decode_every")
        return block_size if every is None else every

    # ---- budget --------------------------------------------------------------------
    def budget_tokens(self, num_prompt_tokens: int) -> int:
        """Tokens to keep per layer: a count, or a fraction of the prompt (at least the
        forced keeps, at least 1)."""
        b = self.options["budget"]
        n = b if isinstance(b, int) else math.ceil(b * num_prompt_tokens)
        return max(1, n, self.num_sinks + self.num_recent)

    def layer_budget_tokens(self, num_prompt_tokens: int, num_layers: int) -> list[int]:
        """Tokens to keep in each layer (``kvmap.kv.policies.layer_budgets``): the budget
        everywhere unless the policy has ``layer_budgets``."""
        spec = parse_layer_budgets(self.options.get("layer_budgets"))
        return split_budget(spec, self.budget_tokens(num_prompt_tokens), num_layers,
                            num_prompt_tokens, floor=self.num_sinks + self.num_recent)

    def layer_resident_tokens(self, context_tokens: int, num_layers: int,
                              num_prompt_tokens: int | None = None) -> list[int]:
        """Tokens each layer keeps of a ``context_tokens`` sequence once compressed: its
        layer budget, or the whole context when that is shorter. A fractional budget is a
        fraction of ``num_prompt_tokens`` (the engine fixes budgets at admission, so at
        decode time the context outgrows the prompt), by default the context itself."""
        _check_tokens(context_tokens)
        prompt = context_tokens if num_prompt_tokens is None else num_prompt_tokens
        budgets = self.layer_budget_tokens(prompt, num_layers)
        if self.options.get("decode_every") == 0 and context_tokens > prompt:
            # only the prompt was compressed: every generated token stays
            return [min(prompt, b) + context_tokens - prompt for b in budgets]
        return [min(context_tokens, b) for b in budgets]

    def resident_tokens(self, context_tokens: int, *, num_layers: int | None = None,
                        num_prompt_tokens: int | None = None) -> int:
        """Tokens of a ``context_tokens`` sequence the cache holds once the policy has
        compressed it: the slots of its block table, i.e. the largest layer's share
        (an upper bound with per-layer block tables, where each layer holds its own)
        (``layer_resident_tokens``). Block rounding and the prefill chunk in flight are the
        caller's (``kvmap.plan.capacity.resident_blocks``). ``num_layers`` is needed only
        with ``layer_budgets=pyramid``; an explicit list gives its own length."""
        spec = parse_layer_budgets(self.options.get("layer_budgets"))
        if num_layers is None:
            if spec == "pyramid":
                raise ValueError(f"{self.name}(layer_budgets=pyramid): resident_tokens needs "
                                 f"num_layers to split the budget")
            num_layers = 1 if spec is None else len(spec)
        return max(self.layer_resident_tokens(context_tokens, num_layers, num_prompt_tokens))

    @property
    def num_sinks(self) -> int:
        return self.options.get("sinks", 0) or 0

    @property
    def num_recent(self) -> int:
        return self.options.get("recent", 0) or 0

    def num_recent_kept(self, num_keep: int) -> int:
        """Most recent slots always kept when ``num_keep`` are kept. Default: the
        ``recent`` option; a policy whose recent span depends on the budget overrides it."""
        return self.num_recent

    # ---- selection -------------------------------------------------------------------
    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(H, L) scores, higher = keep. Override."""
        raise NotImplementedError

    def select(self, inputs: ScoreInputs, num_keep: int) -> torch.Tensor:
        """Kept slot indices (H, num_keep), ascending per head. Sinks and the most recent
        tokens are always kept; the rest by descending score."""
        L, H = inputs.keys.shape[0], inputs.keys.shape[1]
        if num_keep >= L:
            return torch.arange(L).expand(H, L).clone()
        scores = self.score(inputs).float().clone()                      # (H, L)
        forced = torch.zeros(L, dtype=torch.bool)
        forced[: min(self.num_sinks, L)] = True
        num_recent = self.num_recent_kept(num_keep)
        if num_recent:
            forced[max(0, L - num_recent):] = True
        scores[:, forced] = float("inf")
        kept = torch.topk(scores, num_keep, dim=-1).indices
        return kept.sort(dim=-1).values


# spec-string name -> policy class; each policy file registers its class here
POLICIES: Registry[type[Policy]] = Registry("policy")


def _check_tokens(context_tokens: int) -> None:
    if isinstance(context_tokens, bool) or not isinstance(context_tokens, int) \
            or context_tokens < 0:
        raise ValueError(f"context_tokens={context_tokens!r} must be an integer >= 0")
