"""Prefix caching beside a selection policy, as kvmap's engine does it (``kvmap.kv.compaction``,
``kvmap.engine.policy_runner``, ``kvmap.kv.compacted``), on the simulator's keyed blocks.

Before its first compaction a sequence's blocks are keyed like any other (shareable; a
later request of the same owner takes them). Compaction is copy on write: the compacted
sequence is written into blocks it alone holds -- its sole-held keyed blocks in table
order (their keys are forgotten: the content changed), then fresh ones -- and every other
block only loses this sequence's reference:

    keys   [A* B* C  D  E]   (* held by another request too)   keep 2 blocks
    kept   [C  D] -> private blocks, keys forgotten
    A, B   unclaimed (still held / cached for the other holder)
    E      unclaimed and cached under its key (its content is intact)

With a hard-evicting policy a finished compacted sequence is filed as a *state* under the
tokens it summarizes; the next turn of its conversation (whose prompt starts with them)
continues from it when all its blocks are still held somewhere (HBM or a tier). Soft
eviction (``evict_to``) is not modelled: its requests file no state.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvmap.plan.sim.blocks import BlockStore


@dataclass(frozen=True)
class CompactedState:
    """A finished compacted sequence of ``owner``: ``num_tokens`` summarized, in
    ``num_blocks`` blocks keyed ``(owner, "compacted", num_tokens, j)``."""

    owner: str
    num_tokens: int
    num_blocks: int
    num_kv_tokens: int       # slots it holds (what the policy kept)
    partial: bool            # the last block is not full (copied for the next request)

    def keys(self) -> list:
        return [(self.owner, "compacted", self.num_tokens, j) for j in range(self.num_blocks)]


def compaction_due(num_slots: int, num_kept: int, decoding: bool, decode_every: int) -> bool:
    """The engine's rule (``PolicyRunner.after_step``): the step that completes the
    prompt compresses a sequence holding more slots than the policy keeps; a decode step
    once it is ``decode_every`` slots over (0: never)."""
    over = num_slots - num_kept
    if decoding:
        return decode_every > 0 and over >= decode_every
    return over > 0


def compact(store: BlockStore, st, num_keep_blocks: int, block_size: int,
            now_s: float) -> bool:
    """Compact ``st`` (a ``SimState`` holding keyed blocks) into ``num_keep_blocks``
    private blocks. False, changing nothing, when the pool lacks the fresh blocks (the
    engine then retries after the next step)."""
    sole = [key for key in st.keys if store.refs[key] == 1][:num_keep_blocks]
    need = num_keep_blocks - len(sole)
    if need > 0 and not store.allocate(need, now_s):
        return False
    kept = set(sole)
    num_full = st.num_computed // block_size
    for j, key in enumerate(st.keys):
        if key in kept:
            del store.refs[key]          # still held (num_used), now private
        else:
            store.unclaim(key, cache=j < num_full)
    st.keys = []
    st.num_private += num_keep_blocks
    st.compacted = True
    return True


def file_state(store: BlockStore, st, num_kv_tokens: int, block_size: int) -> CompactedState:
    """``st`` (compacted) finishes: name its blocks by the state they hold and cache them.
    Keyed blocks it still holds (a state it continued and never compacted again) are
    renamed too when it alone holds them. Returns the state."""
    for key in st.keys:
        if store.refs[key] == 1:
            del store.refs[key]
            st.num_private += 1
        else:
            store.unclaim(key, cache=True)
    st.keys = []
    state = CompactedState(st.owner, st.num_computed, st.num_private,
                           num_kv_tokens, num_kv_tokens % block_size != 0)
    for key in state.keys():
        store.refs[key] = 1
        store.unclaim(key, cache=True)
    st.num_private = 0
    return state


def take_state(store: BlockStore, st, state: CompactedState, now_s: float) -> bool:
    """Continue ``st`` from ``state``: hold its blocks (promoted from a tier if need be);
    its partial last block is copied into a fresh private block. False, holding nothing,
    when a block is gone or there is no room."""
    keys = state.keys()
    found = store.lookup(keys)
    if len(found) < len(keys):
        return False
    num_taken, ready_s, link = store.take(found, now_s)
    taken = keys[:num_taken]
    if num_taken < len(keys) or (state.partial and not store.allocate(1, now_s)):
        for key in taken:
            store.unclaim(key, cache=True)
        return False
    if state.partial:
        store.unclaim(taken.pop(), cache=True)
        st.num_private += 1
    st.keys = taken
    st.num_computed = state.num_tokens
    st.base_tokens, st.base_slots = state.num_tokens, state.num_kv_tokens
    st.num_cached_prompt_tokens = min(state.num_tokens, st.req.prompt_tokens)
    st.ready_s, st.ready_link = ready_s, link
    st.compacted = True
    return True
