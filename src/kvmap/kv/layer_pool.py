"""Per-layer block tables: a pool whose unit is one layer's block, so that a layer that
keeps fewer tokens (per-layer budgets, ``kvmap.kv.policies.layer_budgets``) returns its
blocks to the pool instead of masking them.

The scheduler still thinks in *groups*: what it allocates, frees and keeps in
``req.block_ids`` is a group id, one entry per ``block_size`` slots of the sequence, as
with the shared pool. A group is a row of layer blocks, one per layer, drawn from one
store that every layer shares (``num_layers * num_blocks`` layer blocks, the same bytes
as the shared pool). A policy that leaves a hole in layer l (its slots
``first..end-1`` empty) releases the layer blocks that lie wholly inside it; the
group keeps its place in the table and the layer reads it as masked:

    groups (req.block_ids):        g0     g1     g2     g3
    layer 0 (b=16, no hole):      [17]   [40]   [ 3]   [52]       bs = 4, B = 16
    layer 1 (b=6,  hole (6, 16)): [18]   [41]   [ -]   [ -]       2 blocks back to the pool

    slot i of layer l lives at  members[block_ids[i // bs], l] * bs + i % bs

A layer holds ``ceil(b_l / bs)`` blocks for its kept tokens, plus the block that holds
slot ``B`` when ``B`` (the largest layer budget) is not a multiple of ``bs`` (new tokens
land there), plus one block per group of tokens decoded since. Resident bytes are
``layer blocks used x bytes of one layer's block``, exactly.

The same mechanism holds a hybrid model's sliding-window layers (``KVGeometry.
layer_windows``): once a sequence's next query can no longer see a group's slots, the
group's blocks of every sliding layer go back to the pool (``PagedKVCache.
release_slid_out``), while its global layers keep theirs.

Prefix caching works on groups as the shared pool's does on blocks: a full group is
named by its content hash, a freed named group stays cached (its layer blocks count as
free) until an allocation evicts it, and a later sequence with the same prefix takes it
back. A sliding layer may have given a named group's block back, so a hit is usable only
up to the longest prefix whose last window is still held in every sliding layer
(``usable_hit``, vLLM v1's sliding-window rule); a shared group's sliding blocks stay
until one holder is left (``PagedKVCache.release_slid_out``). The engine turns it on
for a hybrid model without a selection policy (a policy's compaction rewrites groups in
place). Codecs that keep per-layer state (static scales, KIVI's staging rows) cannot
share one store: ``shareable`` says which.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

from kvmap.kv.pool import table_uses
from kvmap.kv.spec import first_live_slot

RELEASED = -1      # a layer's entry in a group once its block went back to the pool


def shareable(codec, geom, compute_dtype) -> bool:
    """Whether one store can serve every layer: no per-layer state (static scale ranges)
    and no staging rows beside the blocks (KIVI's residual window)."""
    return getattr(codec, "ranges", None) is None and \
        codec.staging_bytes(geom, 1, compute_dtype) == 0


def wants_per_layer_tables(policy, codec, geom, compute_dtype, has_tiers: bool,
                           window_layout=None) -> bool:
    """Whether a cache for this configuration gets per-layer tables: for a model with
    sliding-window layers (their blocks slide out), and for a policy with
    ``layer_budgets`` (the default path keeps the shared table). The policy's
    ``layer_tables`` option decides; unset, per-layer where the codec is ``shareable``,
    there are no tiers (they index blocks by prefix hash) and the ``window_layout``
    (``all_global``) does not keep the sliding layers whole; shared (masked) otherwise
    (``per_layer_tables_blocker`` says why). ``layer_tables=per-layer`` that cannot be
    honoured raises a ValueError naming why. ``layer_budgets`` on a model with sliding
    layers is a ValueError (a sliding layer keeps its window, not a budget)."""
    budgets = policy is not None and policy.options.get("layer_budgets") is not None
    if budgets and geom.sliding_layers:
        raise ValueError(f"{policy!r}: layer_budgets on a model with sliding-window layers "
                         f"is not supported (they keep their window); drop layer_budgets")
    if not budgets and not geom.sliding_layers:
        return False
    asked = policy.options.get("layer_tables") if policy is not None else None
    if asked == "shared":
        return False
    why = per_layer_tables_blocker(codec, geom, compute_dtype, has_tiers, window_layout)
    if why is not None and asked == "per-layer":
        raise ValueError(f"{policy!r}: layer_tables=per-layer needs one store shared by "
                         f"every layer, but {why}; use layer_tables=shared")
    return why is None


def per_layer_tables_blocker(codec, geom, compute_dtype, has_tiers: bool,
                             window_layout=None) -> str | None:
    """Why this codec, tier layout and window layout (``kvmap.kv.window_layout``; it
    binds only a model with sliding layers) cannot have per-layer tables, or None."""
    why = window_layout.per_layer_tables_blocker() \
        if window_layout is not None and geom.sliding_layers else None
    if why is not None:
        return why
    if not shareable(codec, geom, compute_dtype):
        return f"codec {codec!r} keeps per-layer state (static scales or staging rows)"
    if has_tiers:
        return "tiers(...) keep blocks by prefix hash, which per-layer tables do not have"
    return None


class LayerBlockPool:
    """Layer blocks 0..num_layers*num_blocks-1 of one shared store, handed out in groups
    of one per layer. Has the scheduler-facing interface of ``BlockPool`` in group units
    (``num_blocks``, ``num_free``, ``allocate``, ``free``, ``lookup``, ...).
    ``windows``: per layer, its sliding window or None (global); a prefix hit needs the
    blocks of each sliding layer's window (``usable_hit``). Not thread-safe."""

    def __init__(self, num_blocks: int, block_size: int, num_layers: int,
                 windows: tuple[int | None, ...] | None = None):
        if num_blocks <= 0 or num_layers <= 0:
            raise ValueError(f"num_blocks={num_blocks!r} and num_layers={num_layers!r} must "
                             f"be positive")
        self.num_blocks = num_blocks              # groups the pool holds when all are whole
        self.block_size = block_size
        self.num_layers = num_layers
        self.windows = tuple(windows) if windows is not None else (None,) * num_layers
        if len(self.windows) != num_layers:
            raise ValueError(f"windows has {len(self.windows)} entries for {num_layers} "
                             f"layers")
        self.num_layer_blocks = num_blocks * num_layers
        self.free_layer_blocks: OrderedDict[int, None] = OrderedDict(
            (b, None) for b in range(self.num_layer_blocks))
        # group id -> its layer blocks (num_layers,), RELEASED where given back. A group
        # holds at least one layer block, so there are never more groups than blocks.
        self.members = torch.full((self.num_layer_blocks, num_layers), RELEASED,
                                  dtype=torch.long)
        self.free_groups: list[int] = list(range(self.num_layer_blocks - 1, -1, -1))
        self.ref_counts = [0] * self.num_layer_blocks     # per group id
        # prefix cache: a freed group with a hash keeps its layer blocks (least recently
        # freed first) until an allocation needs them; they count as free
        self.block_hash: list[bytes | None] = [None] * self.num_layer_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.cached_groups: OrderedDict[int, None] = OrderedDict()
        self.num_cached_layer_blocks = 0
        self.num_prefix_queries = self.num_prefix_hits = self.num_evicted_hashes = 0
        self.peak_num_used_blocks = 0
        self.peak_num_used_layer_blocks = 0
        self.on_evict: Callable | None = None
        self.on_used: list[Callable[[], object]] = []

    # ---- queries (group units, as BlockPool) ---------------------------------------
    @property
    def num_used_layer_blocks(self) -> int:
        """Layer blocks of live groups (a cached free group's count as free)."""
        return self.num_layer_blocks - len(self.free_layer_blocks) - \
            self.num_cached_layer_blocks

    @property
    def num_free(self) -> int:
        """Whole groups that can still be allocated."""
        return (len(self.free_layer_blocks) + self.num_cached_layer_blocks) // self.num_layers

    @property
    def num_used(self) -> int:
        """Groups' worth of layer blocks in use, rounded up (exact bytes: ``usage``)."""
        return self.num_blocks - self.num_free

    def usage(self) -> float:
        return self.num_used_layer_blocks / self.num_layer_blocks

    def reset_peak(self) -> None:
        self.peak_num_used_blocks = self.num_used
        self.peak_num_used_layer_blocks = self.num_used_layer_blocks

    def _note_used(self) -> None:
        self.peak_num_used_blocks = max(self.peak_num_used_blocks, self.num_used)
        self.peak_num_used_layer_blocks = max(self.peak_num_used_layer_blocks,
                                              self.num_used_layer_blocks)
        for observe in self.on_used:
            observe()

    def _held(self, group: int) -> int:
        return int((self.members[group] >= 0).sum())

    # ---- allocation ----------------------------------------------------------------
    def _take_layer_block(self) -> int:
        """A free layer block, evicting the least recently freed cached group if none."""
        if not self.free_layer_blocks:
            self._evict_cached()
        block_id = next(iter(self.free_layer_blocks))
        del self.free_layer_blocks[block_id]
        return block_id

    def allocate(self, num_blocks: int) -> list[int]:
        """``num_blocks`` new groups, each with a fresh block in every layer."""
        if num_blocks > self.num_free:
            raise MemoryError(f"asked for {num_blocks} blocks, {self.num_free} free")
        out = []
        for _ in range(num_blocks):
            if not self.free_groups:          # every id is a live or cached group
                self._evict_cached()
            group = self.free_groups.pop()
            for layer in range(self.num_layers):
                self.members[group, layer] = self._take_layer_block()
            self.ref_counts[group] = 1
            out.append(group)
        self._note_used()
        return out

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each group (in reverse, so a sequence's prefix stays
        cached longest). A group reaching 0 keeps its layer blocks while it has a hash
        (a later prefix hit takes it back), else gives them back."""
        for group in reversed(block_ids):
            rc = self.ref_counts[group]
            if rc <= 0:
                raise ValueError(f"free of group {group} whose refcount is {rc}")
            self.ref_counts[group] = rc - 1
            if rc > 1:
                continue
            held = self._held(group)
            if self.block_hash[group] is not None and held:
                self.cached_groups[group] = None
                self.num_cached_layer_blocks += held
            else:
                self._drop(group)

    def _drop(self, group: int) -> None:
        """A group of refcount 0 leaves: its hash, its layer blocks, its id."""
        self._forget_hash(group)
        for layer in range(self.num_layers):
            self.release(group, layer)
        self.free_groups.append(group)

    def _evict_cached(self) -> None:
        group = next(iter(self.cached_groups))
        del self.cached_groups[group]
        self.num_cached_layer_blocks -= self._held(group)
        self._drop(group)

    def release(self, group: int, layer: int) -> bool:
        """Give layer ``layer``'s block of ``group`` back (the group stays allocated).
        Returns whether a block was released (False if it already was)."""
        block_id = int(self.members[group, layer])
        if block_id == RELEASED:
            return False
        self.members[group, layer] = RELEASED
        self.free_layer_blocks[block_id] = None
        return True

    def acquire(self, group: int, layer: int) -> bool:
        """Give layer ``layer`` of ``group`` a block again where it was released (a
        compaction writes a sliding layer's window back into the first groups). Returns
        False, changing nothing, when no layer block is free."""
        if int(self.members[group, layer]) != RELEASED:
            return True
        if not self.free_layer_blocks and not self.cached_groups:
            return False
        self.members[group, layer] = self._take_layer_block()
        self._note_used()
        return True

    def layer_blocks_in_use(self) -> list[int]:
        """Blocks each layer's live groups hold now (num_layers,)."""
        live = torch.tensor(self.ref_counts) > 0
        return (self.members[live] >= 0).sum(0).tolist()

    def release_holes(self, block_ids: list[int], holes: dict[int, tuple[int, int]]) -> int:
        """For each layer -> (first, end) hole, release the layer's blocks lying wholly
        inside slots first..end-1. Returns how many layer blocks were released."""
        bs, n = self.block_size, 0
        for layer, (first, end) in holes.items():
            for j in range(-(-first // bs), end // bs):
                n += self.release(block_ids[j], layer)
        return n

    def incref(self, block_id: int) -> None:
        """One more holder of group ``block_id``; a cached free group comes back live."""
        if self.ref_counts[block_id] == 0:
            del self.cached_groups[block_id]
            self.num_cached_layer_blocks -= self._held(block_id)
            self.ref_counts[block_id] = 1
            self._note_used()
            return
        self.ref_counts[block_id] += 1

    # ---- tables ----------------------------------------------------------------------
    def layer_table(self, layer: int, block_ids: list[int]) -> list[int]:
        """Layer ``layer``'s block ids for a group table; a released entry reads block 0
        (only ever masked slots, never written)."""
        return self.members[block_ids, layer].clamp(min=0).tolist()

    def layer_blocks(self, group_ids: torch.Tensor) -> torch.Tensor:
        """(..., num_layers) layer block ids of a tensor of group ids (...), released
        entries as block 0."""
        return self.members[group_ids.cpu()].clamp(min=0).to(group_ids.device)

    # ---- prefix cache ----------------------------------------------------------------
    def lookup(self, block_hashes: list[bytes]) -> list[int]:
        """The longest usable run of leading hashes (``usable_hit``); takes a reference
        on each group found. Returns their group ids."""
        found = []
        for h in block_hashes:
            self.num_prefix_queries += 1
            group = self.hash_to_block.get(h)
            if group is None:
                break
            found.append(group)
        found = found[:self.usable_hit(found)]
        self.num_prefix_hits += len(found)
        for group in found:
            self.incref(group)
        return found

    def usable_hit(self, groups: list[int]) -> int:
        """How many of the leading cached ``groups`` a new sequence can take: the most
        ``n`` for which every sliding layer still holds the groups its window needs
        from slot ``n * block_size`` on (``first_live_slot``), as vLLM's sliding-window
        manager decides a hit. A global layer holds every group it is in, whole.

            window 8, bs 4, groups g0 g1 g2 g3 (g0, g1 slid out of the sliding layer):
            n = 4: the query at slot 16 sees slots 9..16 -> needs g2, g3: usable
        """
        if not groups:
            return 0
        held = self.members[groups] >= 0                     # (n, num_layers)
        sliding = [(layer, w) for layer, w in enumerate(self.windows) if w is not None]
        for n in range(len(groups), 0, -1):
            if all(bool(held[first_live_slot(n * self.block_size, w) // self.block_size:n,
                             layer].all()) for layer, w in sliding):
                return n
        return 0

    def register_hash(self, block_id: int, block_hash: bytes) -> None:
        """Name group ``block_id``'s full block by ``block_hash`` (first name wins)."""
        if self.block_hash[block_id] is not None or block_hash in self.hash_to_block:
            return
        self.block_hash[block_id] = block_hash
        self.hash_to_block[block_hash] = block_id

    def _forget_hash(self, group: int) -> None:
        h = self.block_hash[group]
        if h is not None:
            self.block_hash[group] = None
            if self.hash_to_block.get(h) == group:
                del self.hash_to_block[h]
            self.num_evicted_hashes += 1

    def forget_hash(self, block_id: int) -> None:
        """Called before a group's content is modified in place (compaction)."""
        self._forget_hash(block_id)

    # ---- invariants ------------------------------------------------------------------
    def check_integrity(self, block_tables: list[list[int]] | None = None) -> None:
        """Raise AssertionError if layer blocks are lost, doubly owned, a free group
        holds blocks without being cached, or refcounts differ from the live tables."""
        owned = self.members[self.members >= 0].tolist()
        assert len(owned) == len(set(owned)), "a layer block belongs to two groups"
        assert not set(owned) & set(self.free_layer_blocks), "a free layer block is owned"
        assert len(owned) + len(self.free_layer_blocks) == self.num_layer_blocks, \
            "layer blocks lost"
        for g, rc in enumerate(self.ref_counts):
            assert rc >= 0, f"group {g} has refcount {rc}"
            cached = g in self.cached_groups
            assert not cached or (rc == 0 and self.block_hash[g] is not None), \
                f"cached group {g} has refcount {rc} or no hash"
            assert rc or cached or bool((self.members[g] == RELEASED).all()), \
                f"free group {g} still holds layer blocks"
        assert len(self.free_groups) == self.ref_counts.count(0) - len(self.cached_groups), \
            "group ids lost"
        assert self.num_cached_layer_blocks == sum(self._held(g) for g in self.cached_groups)
        for h, g in self.hash_to_block.items():
            assert self.block_hash[g] == h, f"hash index points at group {g} of another hash"
        if block_tables is not None:
            assert table_uses(block_tables, self.num_layer_blocks) == self.ref_counts, \
                "refcounts differ from the live block tables"
