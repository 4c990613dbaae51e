"""One request in flight in the simulator: what it has computed and the blocks it holds."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvmap.plan.sim.workload import SimRequest


@dataclass(eq=False)
class SimState:
    """One request in flight (mutable; compared by identity)."""

    req: SimRequest
    arrival_s: float
    num_computed: int = 0              # tokens whose KV is computed (prompt, then output)
    num_output: int = 0                # output tokens sampled
    keys: list = field(default_factory=list)     # keyed HBM blocks held, block order
    num_private: int = 0               # private HBM blocks held
    num_offloaded: int = 0             # blocks pinned in the first tier
    ready_s: float = 0.0               # when its promoted prefix blocks land
    ready_link: str | None = None
    first_scheduled_s: float | None = None
    finished_s: float | None = None
    token_times_s: list = field(default_factory=list)
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    peak_hbm_blocks: int = 0
    peak_total_blocks: int = 0
    peak_layer_blocks: int = 0         # a hybrid model: layer blocks, exact (one layer's each)
    final_hbm_blocks: int = 0          # held when the last token was computed
    prefetched: bool = False           # its prefix was staged ahead
    # a selection policy compacted it, or it continues a compacted state (then it holds
    # base_slots slots for its first base_tokens tokens): its new blocks are private
    compacted: bool = False
    base_tokens: int = 0
    base_slots: int = 0

    def slots_at(self, num_tokens: int) -> int:
        """Slots a compacted sequence holds at ``num_tokens`` tokens."""
        return self.base_slots + max(0, num_tokens - self.base_tokens)

    def hold_layer_blocks(self, num_layer_blocks: int, num_layers: int) -> int:
        """A hybrid model's layer blocks for its tokens (kept as the exact peak); returns
        them in whole groups of one block per layer, the pool's unit."""
        self.peak_layer_blocks = max(self.peak_layer_blocks, num_layer_blocks)
        return -(-num_layer_blocks // num_layers)

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_tokens + self.num_output

    @property
    def owner(self) -> str:
        return self.req.conversation_id or self.req.request_id

    @property
    def num_hbm_blocks(self) -> int:
        return len(self.keys) + self.num_private

    def record(self) -> dict:
        """The request as a ``kvmap.metrics`` record."""
        return {"request_id": self.req.request_id, "arrival_s": self.arrival_s,
                "first_scheduled_s": self.first_scheduled_s,
                "token_times_s": self.token_times_s, "finished_s": self.finished_s,
                "num_prompt_tokens": self.req.prompt_tokens,
                "num_cached_prompt_tokens": self.num_cached_prompt_tokens,
                "num_preemptions": self.num_preemptions}
