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

    def all_global(self) -> "PlanModel":
        """The same model with every windowed layer (sliding, chunked) counted as a global
        one: what a calculator that ignores the windows says, and the layout the hybrid
        saving is measured against. Linear-attention and MLA layers are kept as they are
        (they have no window to drop)."""
        from dataclasses import replace

        from kvmap.kv.layer_kinds import GlobalAttention
        config = replace(self.config, sliding_window=None, sliding_layers=None)
        if self.layout is None:
            return replace(self, config=config)
        windowed = [k for k in self.layout.kinds if k.window_tokens() is not None]
        if not windowed:
            return self
        layers = tuple(sorted(i for k in self.layout.kinds for i in k.layers
                              if k.window_tokens() is not None or k.name == "global"))
        head = windowed[0]
        kinds = (GlobalAttention(layers, head.num_kv_heads, head.head_dim),) + tuple(
            k for k in self.layout.kinds if k.name != "global" and k.window_tokens() is None)
        return replace(self, config=config, layout=KVLayout(
            kinds, self.layout.num_layers, self.layout.state_bytes_per_value))
