"""Paged block pool: allocate / free / reference counts / prefix-cache index.

Blocks are fixed-size groups of ``block_size`` token slots. A sequence owns an ordered
block table; token i of the sequence's KV lives at

    slot = block_table[i // block_size] * block_size + i % block_size

Full blocks may carry a content hash (``kvmap.kv.prefix``). A freed block whose hash is
known stays in the free queue with its content intact: a later request with the same
prefix can take it back (a prefix-cache hit) until it is reallocated for something else
(least recently freed first), which evicts its hash. That moment -- ``allocate`` taking
a cached block -- is when its content leaves the pool: if ``on_evict`` is set it is
called as ``on_evict(block_id, block_hash)`` first, while the content is still intact,
so that a tiered store (``kvmap.kv.offload.store``) can keep a copy below the pool.
``on_register(block_id, block_hash)``, if set, is called when a block is first named by
its hash (a shared tier publishes it then, for other processes).

    free queue (LRU order):  [b7 (hash h3)] [b2] [b9 (hash h1)] ...  <- allocate pops left
    hash index:              h1 -> b9, h3 -> b7, h5 -> b4 (b4 in use, refcount 2)
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable


class BlockPool:
    """Owns block ids 0..num_blocks-1. Not thread-safe; the engine loop owns it."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks={num_blocks!r} must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.hash_to_block: dict[bytes, int] = {}
        self.num_prefix_queries = 0       # blocks looked up
        self.num_prefix_hits = 0          # blocks found
        self.num_evicted_hashes = 0
        self.peak_num_used_blocks = 0     # most blocks in use at once since reset_peak()
        # called with (block_id, hash) just before a cached block is reused for new content
        self.on_evict: Callable[[int, bytes], object] | None = None
        self.on_register: Callable[[int, bytes], object] | None = None  # after naming
        # called after blocks become used (allocate, a cached block's incref): readers of
        # a peak that is not only blocks (KIVI's staging rows) sample there
        self.on_used: list[Callable[[], object]] = []

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def reset_peak(self) -> None:
        """Start a new peak window at the blocks in use now."""
        self.peak_num_used_blocks = self.num_used

    # ---- allocation ----------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` free blocks (refcount 1 each). Raises if not enough."""
        if num_blocks > len(self.free_queue):
            raise MemoryError(f"asked for {num_blocks} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(num_blocks):
            block_id = next(iter(self.free_queue))
            if self.on_evict is not None and self.block_hash[block_id] is not None:
                self.on_evict(block_id, self.block_hash[block_id])   # pool still consistent
            del self.free_queue[block_id]
            self._forget_hash(block_id)
            self.ref_counts[block_id] = 1
            out.append(block_id)
        self.peak_num_used_blocks = max(self.peak_num_used_blocks, self.num_used)
        for observe in self.on_used:
            observe()
        return out

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each block; blocks reaching 0 go to the free queue tail.
        Freed in reverse so that a sequence's tail blocks are reallocated first and its
        prefix stays cached longest."""
        for block_id in reversed(block_ids):
            rc = self.ref_counts[block_id]
            if rc <= 0:
                raise ValueError(f"free of block {block_id} whose refcount is {rc}")
            self.ref_counts[block_id] = rc - 1
            if rc == 1:
                self.free_queue[block_id] = None

    def incref(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:       # a cached free block comes back: a peak
            del self.free_queue[block_id]
            self.peak_num_used_blocks = max(self.peak_num_used_blocks, self.num_used)
            self.ref_counts[block_id] += 1
            for observe in self.on_used:
                observe()
            return
        self.ref_counts[block_id] += 1

    # ---- prefix cache ----------------------------------------------------------------
    def lookup(self, block_hashes: list[bytes]) -> list[int]:
        """Longest run of leading hashes that are cached; takes a reference on each block
        found. Returns their block ids."""
        found = []
        for h in block_hashes:
            self.num_prefix_queries += 1
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            self.num_prefix_hits += 1
            self.incref(block_id)
            found.append(block_id)
        return found

    def register_hash(self, block_id: int, block_hash: bytes) -> None:
        """Mark a full, written block as holding the content named by ``block_hash``."""
        if self.block_hash[block_id] is not None:
            return
        if block_hash in self.hash_to_block:   # same content already cached elsewhere
            return
        self.block_hash[block_id] = block_hash
        self.hash_to_block[block_hash] = block_id
        if self.on_register is not None:
            self.on_register(block_id, block_hash)

    def _forget_hash(self, block_id: int) -> None:
        h = self.block_hash[block_id]
        if h is not None:
            self.block_hash[block_id] = None
            if self.hash_to_block.get(h) == block_id:
                del self.hash_to_block[h]
            self.num_evicted_hashes += 1

    def forget_hash(self, block_id: int) -> None:
        """Called before a block's content is modified in place (eviction compaction)."""
        self._forget_hash(block_id)

    # ---- invariants ----------------------------------------------------------------
    def check_integrity(self, block_tables: list[list[int]] | None = None) -> None:
        """Raise AssertionError if the pool's bookkeeping is inconsistent. With the block
        tables of all live sequences, also check that refcounts equal their uses."""
        for b in range(self.num_blocks):
            rc = self.ref_counts[b]
            assert rc >= 0, f"block {b} has negative refcount {rc}"
            assert (rc == 0) == (b in self.free_queue), \
                f"block {b}: refcount {rc} but in free queue={b in self.free_queue}"
        for h, b in self.hash_to_block.items():
            assert self.block_hash[b] == h, f"hash index points at block {b} holding another hash"
        if block_tables is not None:
            assert table_uses(block_tables, self.num_blocks) == self.ref_counts, \
                "refcounts differ from the live block tables"


def table_uses(block_tables: list[list[int]], num_ids: int) -> list[int]:
    """How many times each id 0..num_ids-1 appears in the block tables."""
    uses = [0] * num_ids
    for table in block_tables:
        for b in table:
            uses[b] += 1
    return uses
