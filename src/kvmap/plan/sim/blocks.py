"""Where the simulated KV blocks live: the HBM pool and the tiers below it, with traffic.

Blocks are counted, not stored. In the HBM pool a block is

- *used*: held by a running request (private, or keyed and reference-counted),
- *cached*: a keyed full block no request holds, kept for prefix reuse in an eviction
  order, or
- free.

Below HBM, a keyed block may have a copy in several tiers. Reading it into HBM
(*promotion*) copies it from the highest tier that holds it and leaves that copy in
place (a hit, ``touch`` in the tier's eviction order), so a block written once can be
read many times, and the eviction orders see real reuse (LFU counts, ARC's second list).
When the pool needs room it evicts cached blocks in the scenario's order (LRU, LFU or
ARC from :mod:`kvmap.kv.tiers.eviction`); a victim with no copy below is *demoted*
(written) to the first tier; a full tier evicts its own victim, which is written one
level down unless a copy is already there (a clean drop), and the last level drops it. Offloaded KV of running requests (``hbm_window_tokens``) is *pinned* in the
first tier: not evictable, streamed over the link at every step that reads it.

Prefetch stages a queued request's prefix one level up ahead of use: blocks only in a
lower tier are copied to the first tier, and blocks in the first tier are copied into free HBM
blocks (never evicting anything for it). A block whose prefetch has not landed delays
the read that needs it.

Every link is a FIFO resource (``busy_until_s``): a transfer starts when the link is free
and its data is ready at the end. Per tier, ``bytes_in - bytes_out`` equals the bytes
resident (``check_integrity``), which the tests hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from kvmap.kv.tiers.eviction import EvictionOrder, make_eviction_order
from kvmap.plan.sim.hardware import TierHardware

Key = Hashable


class SimulationError(ValueError):
    """The simulated system cannot run the scenario (e.g. offloaded KV overflows a tier)."""


@dataclass
class TierState:
    """One tier's contents and counters (bytes are whole blocks of ``block_bytes``)."""

    spec: TierHardware
    order: EvictionOrder
    capacity_blocks: int
    num_cached: int = 0                # evictable blocks
    num_pinned: int = 0                # offloaded KV of running requests
    bytes_in: int = 0                  # written into the tier (demotions, staging, offload)
    bytes_out: int = 0                 # left the tier (evicted, staged up, unpinned)
    bytes_read: int = 0                # copied up into HBM (promotions)
    bytes_streamed: int = 0            # offloaded KV read in place, every step
    num_hits: int = 0                  # prefix blocks found here
    num_misses: int = 0                # prefix blocks looked up here and not found
    num_evicted: int = 0
    busy_until_s: float = 0.0
    busy_s: float = 0.0                # link time spent on transfers (not streaming)
    stall_s: float = 0.0               # step time spent waiting on this tier's transfers

    def transfer(self, now_s: float, num_blocks: int, block_bytes: int,
                 not_before_s: float = 0.0) -> float:
        """Queue a transfer on the link; returns when its data is ready."""
        duration_s = self.spec.transfer_s(num_blocks, block_bytes)
        start_s = max(now_s, self.busy_until_s, not_before_s)
        self.busy_until_s = start_s + duration_s
        self.busy_s += duration_s
        return self.busy_until_s


@dataclass
class BlockStore:
    """The HBM pool of ``num_hbm_blocks`` blocks over ``tiers`` (see the module docstring)."""

    num_hbm_blocks: int
    block_bytes: int                   # one block, all devices (what a tier holds)
    tiers: list[TierHardware]
    eviction: str = "lru"
    num_used: int = 0                  # HBM blocks held by running requests
    refs: dict = field(default_factory=dict)          # keyed used block -> holders
    ready_s: dict = field(default_factory=dict)       # key -> when its staged copy lands
    prefetched: set = field(default_factory=set)      # staged ahead, not used yet
    link_of_key: dict = field(default_factory=dict)   # staged key -> link it came over
    num_hbm_hits: int = 0
    num_hbm_misses: int = 0
    num_dropped: int = 0               # blocks that fell off the last level
    num_prefetched: int = 0
    num_prefetch_used: int = 0
    num_prefetch_wasted: int = 0       # evicted again before any request used them

    def __post_init__(self) -> None:
        self.hbm_cached = make_eviction_order(self.eviction)
        self.levels = [TierState(t, make_eviction_order(self.eviction),
                                 t.capacity_bytes // self.block_bytes) for t in self.tiers]

    # ---- HBM room ----------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.num_hbm_blocks - self.num_used - len(self.hbm_cached)

    def in_hbm(self, key: Key) -> bool:
        return key in self.refs or key in self.hbm_cached

    def make_room(self, num_blocks: int, now_s: float) -> bool:
        """Evict cached HBM blocks until ``num_blocks`` are free; False if they cannot be."""
        if num_blocks > self.num_hbm_blocks - self.num_used:
            return False
        while self.num_free < num_blocks:
            key = self.hbm_cached.victim()
            self._forget_prefetch(key)
            self.ready_s.pop(key, None)
            if self.level_below(key) is None:
                self._store_below(key, 1, now_s)
        return True

    def allocate(self, num_blocks: int, now_s: float) -> bool:
        """Take ``num_blocks`` private blocks (False, nothing taken, if they do not fit)."""
        if not self.make_room(num_blocks, now_s):
            return False
        self.num_used += num_blocks
        return True

    def release(self, num_blocks: int) -> None:
        if not 0 <= num_blocks <= self.num_used:
            raise ValueError(f"release of {num_blocks} blocks with {self.num_used} in use")
        self.num_used -= num_blocks

    # ---- keyed blocks (prefix caching) --------------------------------------------
    def claim(self, key: Key, now_s: float) -> bool:
        """Hold block ``key`` for a request that computes it now; False if no room."""
        if key in self.refs:
            self.refs[key] += 1
            return True
        if key in self.hbm_cached:
            self._hold_cached(key)
            return True
        if not self.allocate(1, now_s):
            return False
        self.refs[key] = 1
        return True

    def unclaim(self, key: Key, cache: bool) -> None:
        """A request lets go of ``key``; its last holder caches it (``cache``) or frees it."""
        self.refs[key] -= 1
        if self.refs[key]:
            return
        del self.refs[key]
        self.num_used -= 1
        if cache:
            self.hbm_cached.insert(key)

    def lookup(self, keys: list, count: bool = True) -> list[tuple[Key, int]]:
        """The longest prefix of ``keys`` held somewhere, as ``(key, level)`` (0: HBM).
        With ``count``, a block counts a hit at the level that holds it and a miss at every
        level above (all levels for a block held nowhere, which ends the prefix)."""
        found = []
        for key in keys:
            level = 0 if self.in_hbm(key) else self.level_below(key)
            if count:
                if level == 0:
                    self.num_hbm_hits += 1
                else:
                    self.num_hbm_misses += 1
                    for i, state in enumerate(self.levels, start=1):
                        if level == i:
                            state.num_hits += 1
                            break
                        state.num_misses += 1
            if level is None:
                break
            found.append((key, level))
        return found

    def take(self, found: list[tuple[Key, int]], now_s: float) -> tuple[int, float, str | None]:
        """Hold the blocks of ``found`` (a prefix from :meth:`lookup`) for one request,
        copying the ones below HBM up.

        Returns ``(num_taken, ready_s, link)``: how many leading blocks were taken, when
        the last copied one lands and over which link. Blocks in HBM are held first (so
        making room cannot evict them); if the pool cannot hold every copied block, the
        prefix is cut before the first block below HBM.
        """
        ready_s, link = now_s, None
        for key, level in found:
            if level == 0:
                if key in self.refs:
                    self.refs[key] += 1
                else:
                    self._hold_cached(key)
                if key in self.prefetched:
                    self.prefetched.discard(key)
                    self.num_prefetch_used += 1
                landed_s = self.ready_s.pop(key, 0.0)
                if landed_s > ready_s:
                    ready_s, link = landed_s, self.levels[0].spec.link
        below = [i for i, (_, level) in enumerate(found) if level != 0]
        if below and not self.make_room(len(below), now_s):
            return self._cut(found, below[0]), ready_s, link
        # making room may have pushed a copy further down, or off the last level
        by_level: dict[int, list] = {}
        cut = len(found)
        for i in below:
            key = found[i][0]
            level = self.level_below(key)
            if level is None:
                cut = i
                break
            by_level.setdefault(level, []).append(key)
        for done_s, level_link in self._copy_up(by_level, now_s):
            if done_s > ready_s:
                ready_s, link = done_s, level_link
        for keys in by_level.values():
            for key in keys:
                self.ready_s.pop(key, None)
        return self._cut(found, cut), ready_s, link

    def _cut(self, found: list, cut: int) -> int:
        """Let go of the HBM blocks of ``found`` after ``cut``; returns ``cut``."""
        for key, level in found[cut:]:
            if level == 0:
                self.unclaim(key, cache=True)
        return cut

    def _copy_up(self, by_level: dict, now_s: float) -> list[tuple[float, str]]:
        """Copy keys from their tiers into held HBM blocks; each key's ``ready_s`` is when
        its copy lands. Returns, per level, when its copy lands and the link that decided
        it: the level's own, or the staging link of a prefetch that had not landed yet."""
        landings = []
        for level, keys in by_level.items():
            state = self.levels[level - 1]
            landed_s, staging_link = 0.0, None
            for key in keys:
                state.order.touch(key)
                key_landed_s = self.ready_s.pop(key, 0.0)
                if key_landed_s > landed_s:
                    landed_s, staging_link = key_landed_s, self.link_of_key.get(key)
                self.link_of_key.pop(key, None)
                if key in self.prefetched:
                    self.prefetched.discard(key)
                    self.num_prefetch_used += 1
                self.refs[key] = 1
            self.num_used += len(keys)
            state.bytes_read += len(keys) * self.block_bytes
            link_free_s = max(now_s, state.busy_until_s)
            done_s = state.transfer(now_s, len(keys), self.block_bytes, landed_s)
            for key in keys:
                self.ready_s[key] = done_s
            waited_on_staging = staging_link is not None and landed_s > link_free_s
            landings.append((done_s, staging_link if waited_on_staging else state.spec.link))
        return landings

    def prefetch(self, keys: list, now_s: float) -> int:
        """Stage the prefix ``keys`` one level up ahead of use (see the module docstring);
        returns how many blocks started moving."""
        found = self.lookup(keys, count=False)
        started = 0
        lower = [(key, level) for key, level in found if level and level > 1]
        if lower and self.levels[0].capacity_blocks:
            by_level: dict[int, list] = {}
            for key, level in lower:
                by_level.setdefault(level, []).append(key)
            for level, level_keys in by_level.items():
                state = self.levels[level - 1]
                done_s = state.transfer(now_s, len(level_keys), self.block_bytes)
                state.bytes_read += len(level_keys) * self.block_bytes
                for key in level_keys:
                    state.order.touch(key)
                    self._store_below(key, 1, now_s, transfer=False)
                    if key in self.levels[0].order:
                        self.ready_s[key] = done_s
                        self.link_of_key[key] = state.spec.link
                        self.prefetched.add(key)
                        started += 1
        first = [key for key, _ in found if key in self.levels[0].order and not self.in_hbm(key)]
        first = first[:max(0, self.num_free)]
        if first:
            state = self.levels[0]
            landed_s = max(self.ready_s.pop(key, 0.0) for key in first)
            done_s = state.transfer(now_s, len(first), self.block_bytes, landed_s)
            state.bytes_read += len(first) * self.block_bytes
            for key in first:
                state.order.touch(key)
                self.hbm_cached.insert(key)
                self.ready_s[key] = done_s
                self.prefetched.add(key)
            started += len(first)
        self.num_prefetched += started
        return started

    # ---- offloaded KV of running requests -------------------------------------------
    def pin(self, num_blocks: int, now_s: float) -> None:
        """Write ``num_blocks`` blocks of running requests' KV to the first tier."""
        if num_blocks <= 0:
            return
        if not self.levels:
            raise SimulationError("hbm_window_tokens offloads KV to a tier, but the scenario "
                                  "has no tiers")
        state = self.levels[0]
        while state.num_cached + state.num_pinned + num_blocks > state.capacity_blocks \
                and state.num_cached:
            self._evict_from(1, now_s)
        if state.num_pinned + num_blocks > state.capacity_blocks:
            raise SimulationError(f"tier {state.spec.name!r} ({state.spec.capacity_bytes} "
                                  f"bytes) has no room for {state.num_pinned + num_blocks} "
                                  "blocks of offloaded KV; raise its capacity")
        state.num_pinned += num_blocks
        state.bytes_in += num_blocks * self.block_bytes
        state.transfer(now_s, num_blocks, self.block_bytes)

    def unpin(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            return
        state = self.levels[0]
        state.num_pinned -= num_blocks
        state.bytes_out += num_blocks * self.block_bytes

    def stream(self, num_blocks: int) -> int:
        """Offloaded blocks read in place by one step; returns the bytes."""
        num_bytes = num_blocks * self.block_bytes
        if num_bytes:
            self.levels[0].bytes_streamed += num_bytes
        return num_bytes

    # ---- internals ------------------------------------------------------------------
    def _forget_prefetch(self, key: Key) -> None:
        if key in self.prefetched:
            self.prefetched.discard(key)
            self.num_prefetch_wasted += 1

    def _hold_cached(self, key: Key) -> None:
        self.hbm_cached.remove(key)
        self.num_used += 1
        self.refs[key] = 1

    def level_below(self, key: Key) -> int | None:
        """The highest tier (1..) holding a copy of ``key``, or None."""
        for level, state in enumerate(self.levels, start=1):
            if key in state.order:
                return level
        return None

    def _evict_from(self, level: int, now_s: float) -> None:
        state = self.levels[level - 1]
        victim = state.order.victim()
        state.num_cached -= 1
        state.num_evicted += 1
        state.bytes_out += self.block_bytes
        if level == 1 and not self.in_hbm(victim):
            self._forget_prefetch(victim)
            self.ready_s.pop(victim, None)
            self.link_of_key.pop(victim, None)
        if not any(victim in s.order for s in self.levels[level:]):
            self._store_below(victim, level + 1, now_s)     # dirty: no copy below

    def _store_below(self, key: Key, level: int, now_s: float, transfer: bool = True) -> None:
        """Write ``key`` into ``level`` (making room there) or the first level below with
        room; the last level drops it."""
        while level <= len(self.levels):
            state = self.levels[level - 1]
            while state.num_cached + state.num_pinned >= state.capacity_blocks \
                    and state.num_cached:
                self._evict_from(level, now_s)
            if state.num_cached + state.num_pinned < state.capacity_blocks:
                state.order.insert(key)
                state.num_cached += 1
                state.bytes_in += self.block_bytes
                if transfer:
                    state.transfer(now_s, 1, self.block_bytes)
                return
            level += 1
        self.num_dropped += 1

    def check_integrity(self) -> None:
        """Raise AssertionError if the counts disagree (conservation of blocks and bytes)."""
        assert 0 <= self.num_used and self.num_used + len(self.hbm_cached) <= self.num_hbm_blocks
        assert not any(key in self.hbm_cached for key in self.refs)
        for i, state in enumerate(self.levels, start=1):
            assert state.num_cached == len(state.order)
            assert state.num_cached + state.num_pinned <= max(state.capacity_blocks, 0)
            assert state.bytes_in - state.bytes_out == \
                (state.num_cached + state.num_pinned) * self.block_bytes

