"""Per-layer budgets: how a policy's budget is split across the model's layers.

``layer_budgets`` (an option of the scoring policies) is one of

- unset: every layer keeps ``budget`` tokens;
- ``pyramid``: PyramidKV's schedule (Cai et al., "PyramidKV: Dynamic KV Cache
  Compression based on Pyramidal Information Funneling", 2024). Lower layers spread
  their attention broadly and upper layers focus on a few tokens, so the budget
  decreases linearly with depth, from ``(2 - 1/beta) * B`` at layer 0 to ``B / beta`` at
  the last layer (``beta = 20``), with the same total ``num_layers * B``;
- an explicit list, one entry per layer, each a count or a prompt fraction like
  ``budget``: ``layer_budgets=0.5/0.4/0.3/...`` in a spec string (``/`` separates them,
  since ``,`` separates options), or a Python list.

Every layer keeps at least ``floor`` tokens (the policy's forced keeps). A sequence's
slot layout follows the largest layer budget B: a layer with a smaller budget b_l keeps
its tokens in slots 0..b_l-1 and leaves slots b_l..B-1 empty (masked out of attention).
With per-layer block tables (the policy's ``layer_tables``, per-layer by default where
the codec allows: ``kvmap.kv.layer_pool``) the blocks of that hole go back to the pool,
so memory follows the sum of the layer budgets; with ``layer_tables=shared`` (one table
for all layers) the hole stays resident and the pool's peak follows B.
"""
from __future__ import annotations

import math

PYRAMID_BETA = 20


def parse_layer_budgets(value) -> str | tuple | None:
    """Validate the option: None, "pyramid", a "/"-separated string or a list of budgets.
    Returns None, "pyramid" or a tuple of counts (int) / fractions (float)."""
    if value is None or value == "pyramid":
        return value
    items = value.split("/") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"layer_budgets={value!r} must be pyramid or a list of budgets "
                         f"(a/b/c...)")
    out = []
    for item in items:
        b = _number(item)
        if b is None or isinstance(b, bool) or b <= 0 or (isinstance(b, float) and b > 1):
            raise ValueError(f"layer_budgets={value!r}: {item!r} is not a budget (a token "
                             f"count >= 1 or a fraction of the prompt in (0, 1])")
        out.append(b)
    return tuple(out)


def _number(item):
    if isinstance(item, (int, float)):
        return item
    try:
        return int(item)
    except (TypeError, ValueError):
        pass
    try:
        return float(item)
    except (TypeError, ValueError):
        return None


def pyramid(budget_tokens: int, num_layers: int, beta: int = PYRAMID_BETA) -> list[int]:
    """Linearly decreasing budgets with sum ``num_layers * budget_tokens`` (largest
    remainders take the rounding): layer 0 ``(2 - 1/beta) B``, the last ``B / beta``."""
    if num_layers == 1:
        return [budget_tokens]
    top, bottom = (2 - 1 / beta) * budget_tokens, budget_tokens / beta
    exact = [top - (top - bottom) * i / (num_layers - 1) for i in range(num_layers)]
    out = [math.floor(x) for x in exact]
    short = num_layers * budget_tokens - sum(out)
    for i in sorted(range(num_layers), key=lambda i: out[i] - exact[i])[:short]:
        out[i] += 1
    return out


def split_budget(spec, budget_tokens: int, num_layers: int, num_prompt_tokens: int,
                 floor: int = 1) -> list[int]:
    """Per-layer token budgets for a sequence. ``spec`` as returned by
    ``parse_layer_budgets``; raises ValueError if a list has the wrong length."""
    if spec is None:
        out = [budget_tokens] * num_layers
    elif spec == "pyramid":
        out = pyramid(budget_tokens, num_layers)
    else:
        if len(spec) != num_layers:
            raise ValueError(f"layer_budgets has {len(spec)} entries; the model has "
                             f"{num_layers} layers")
        out = [b if isinstance(b, int) else math.ceil(b * num_prompt_tokens) for b in spec]
    return [max(floor, 1, b) for b in out]
