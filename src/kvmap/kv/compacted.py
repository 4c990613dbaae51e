"""Compacted sequences as cache entries, keyed by what their blocks now hold.

A selection policy rewrites a sequence's blocks, so the chained prefix hashes
(``prefix.py``) no longer name them. What they hold is instead a function of the exact
tokens the sequence had computed (and of the KV spec, which the salt covers: policy,
budget, codec): a request that finishes after compaction leaves behind

    digest  = sha256(salt || "compacted" || token_ids[:N])       N = computed tokens
    key_j   = sha256(digest || j)                                 block j of its table

and a :class:`CompactedState` (slots, holes) filed under (N, digest). Its blocks are
registered in the pool under ``key_j`` and freed like any cached block: the pool keeps
them until it needs the room (and, with tiers, demotes them there), so an entry costs no
memory of its own. A later request whose tokens start with those N tokens -- the next
turn of a conversation -- takes the blocks back and continues from the compacted state
instead of recomputing the prefix (hard eviction's multi-turn behaviour: what the policy
dropped for turn 1 stays dropped for turn 2). Soft eviction (``evict_to``) does not use
these entries: it fetches the full prefix back from the tiers.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass

MAX_STATES = 1024        # entries kept; an entry is a few integers, its blocks are the pool's


@dataclass(frozen=True)
class CompactedState:
    """A finished request's compacted KV: ``num_kv_slots`` slots in ``num_blocks``
    blocks summarizing ``num_tokens`` tokens; ``kv_holes`` as in ``Request``."""

    num_tokens: int
    num_kv_slots: int
    num_blocks: int
    kv_holes: tuple = ()          # ((layer, (first, end)), ...)
    block_keys: tuple = ()        # the blocks' pool keys; () means ``block_keys(digest)``


def state_digest(salt: bytes, token_ids: list[int]) -> bytes:
    h = hashlib.sha256()
    h.update(salt)
    h.update(b"compacted")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def block_keys(digest: bytes, num_blocks: int) -> list[bytes]:
    """The pool keys of a compacted state's blocks, in table order."""
    return [hashlib.sha256(digest + struct.pack("<q", j)).digest() for j in range(num_blocks)]


class CompactedStates:
    """The index of compacted states, least recently used first out."""

    def __init__(self, salt: bytes, max_states: int = MAX_STATES) -> None:
        self.salt = salt
        self.max_states = max_states
        self._states: OrderedDict[tuple[int, bytes], CompactedState] = OrderedDict()
        self.num_registered = 0
        self.num_taken = 0

    def __len__(self) -> int:
        return len(self._states)

    def keys_for(self, token_ids: list[int], num_blocks: int) -> list[bytes]:
        """The keys a state filed for exactly ``token_ids`` gives its blocks."""
        return block_keys(state_digest(self.salt, token_ids), num_blocks)

    def register(self, token_ids: list[int], state: CompactedState) -> list[bytes]:
        """File ``state`` for exactly ``token_ids``; returns its block keys (its own
        ``block_keys`` when it names them: blocks it shares with an earlier state, or
        with a prefix, keep the key they already carry in the pool)."""
        digest = state_digest(self.salt, token_ids)
        self._states[(len(token_ids), digest)] = state
        self._states.move_to_end((len(token_ids), digest))
        while len(self._states) > self.max_states:
            self._states.popitem(last=False)
        self.num_registered += 1
        return list(state.block_keys) or block_keys(digest, state.num_blocks)

    def longest(self, token_ids: list[int], max_tokens: int):
        """The entry of the longest prefix of ``token_ids`` of at most ``max_tokens``
        tokens, as (state, block keys), or None."""
        for num in sorted({n for n, _ in self._states if n <= max_tokens}, reverse=True):
            digest = state_digest(self.salt, token_ids[:num])
            state = self._states.get((num, digest))
            if state is not None:
                self._states.move_to_end((num, digest))
                return state, list(state.block_keys) or block_keys(digest, state.num_blocks)
        return None

    def as_dict(self) -> dict:
        return {"num_states": len(self), "num_registered": self.num_registered,
                "num_taken": self.num_taken}
