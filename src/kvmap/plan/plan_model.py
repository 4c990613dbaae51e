"""The planner's model: a shape (``ModelConfig``), its experts, and -- for a family whose
KV is not Llama-shaped (:mod:`kvmap.plan.hf_families`) -- its layer kinds and parameter
counts."""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.config import ModelConfig
from kvmap.kv.layer_kinds import KVLayout


@dataclass(frozen=True)
class PlanModel:
    """A model shape plus what ``ModelConfig`` does not say: experts per MoE layer.

    ``num_experts == 1`` is a dense model. The attention (and KV) is ``config``'s either way;
    ``config.intermediate_size`` is the size of one expert's MLP.
    """

    config: ModelConfig
    num_experts: int = 1
    num_experts_per_tok: int = 1
    # a family whose KV is not Llama-shaped (kvmap.plan.hf_families): its layer kinds,
    # and its parameters counted from its own config (``config`` is then the KV pool's
    # equivalent shape: the paged layers as K+V heads), linear layers apart
    layout: KVLayout | None = None
    linear_params: int | None = None           # quantizable matrices, all experts
    other_params: int | None = None            # embeddings, head, norms, routers (bf16)

    @property
    def name(self) -> str:
        return self.config.name
