"""Continuous batching with chunked prefill, prefix caching and preemption.

Each step has a token budget (``max_num_batched_tokens``). Running sequences are served
first, in arrival order: a decoding sequence needs one token, a sequence still in
prefill takes the next chunk of its prompt. Then waiting sequences are admitted while
budget, sequence slots and blocks last. A newly admitted sequence first takes the
longest cached prefix of its full blocks from the pool's prefix index and then, with a
tiered store (``tiers(...)``), the blocks that follow from the tiers below the pool.

When the pool has no block for a running sequence, the most recently admitted running
sequence is preempted by recomputation: its blocks are freed (full blocks keep their
hashes, so the recompute usually hits the prefix cache, and with tiers they are demoted
rather than lost when the pool reuses them) and it goes back to the front of the
waiting queue with nothing computed. The engine never runs out of memory.

With a hard-evicting selection policy, a finished compacted sequence is filed under the
tokens it summarizes (``kvmap.kv.compacted``); a later request that starts with those
tokens (the next turn) continues from it instead of looking up prefix blocks.

With tiers, a running sequence that is alone and still short of blocks is paged instead
(``kvmap.kv.offload.pager``): its oldest full blocks go to the tiers a page at a time, so
a context larger than the pool keeps decoding. The offloading side only writes the
pages and says which blocks went (a ``PageOut``); the scheduler frees them and shortens
the block table (:meth:`Scheduler.apply_page_out`). Several sequences may be paged at once:
one that is short of blocks pages its own front out when it is already paged or its
context is larger than the whole pool (it could never fit, so preempting others would
not help); any other is served by preemption as before.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from kvmap.config import SchedulerConfig
from kvmap.kv.cache import PagedKVCache
from kvmap.kv.compacted import CompactedState, CompactedStates
from kvmap.kv.offload.decisions import PageOut
from kvmap.kv.offload.offloader import Offloader
from kvmap.kv.prefix import block_hashes, tenant_salt
from kvmap.request import Request, RequestStatus


@dataclass
class ScheduledBatch:
    # (request, number of new tokens to compute this step), decodes first
    items: list[tuple[Request, int]] = field(default_factory=list)
    num_preempted: int = 0
    # a waiting request was not admitted, or a running one preempted, for lack of blocks
    pool_full: bool = False
    # requests that can never fit the pool, to be finished by the engine
    unfittable: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: PagedKVCache, prefix_salt: bytes | None,
                 offload: Offloader | None = None, min_last_chunk: int = 1,
                 compacted: CompactedStates | None = None):
        self.config = config
        # tokens the chunk that completes a prompt must hold: a selection policy's
        # observation window (SnapKV scores the prompt with its last W queries)
        self.min_last_chunk = min_last_chunk
        self.kv = kv
        self.pool = kv.pool
        self.block_size = kv.block_size
        self.prefix_salt = prefix_salt          # None disables prefix caching
        # tiers below the pool, or None; they page a context larger than the pool
        # unless a selection policy compacts resident blocks (``offload.paging``)
        self.offload = offload
        # a hard-evicting policy's finished sequences, reusable by a later turn
        # (``kvmap.kv.compacted``); None: not kept
        self.compacted = compacted if prefix_salt is not None else None
        # (req, num_new) -> slots req must hold to run num_new tokens, when more than
        # num_kv_slots + num_new (``PolicyRunner.reserve_slots``); None: never more
        self.reserve_slots = None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # ---- queues -----------------------------------------------------------------
    def add(self, req: Request, cache_salt: str | None = None) -> None:
        """Queue ``req``; ``cache_salt``: its tenant's salt of the prefix hashes."""
        if cache_salt is not None and self.prefix_salt is not None:
            req.cache_salt = tenant_salt(self.prefix_salt, cache_salt)
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, req: Request) -> None:
        """Drop a request from the queues and free its blocks (finish or abort)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._file_compacted(req)
        self._free_blocks(req)

    def _free_blocks(self, req: Request) -> None:
        # with paging off too: a policy with prefill=offload pages its prompt out
        # itself (kvmap.kv.offload.prefill)
        if self.offload is not None:
            self.offload.drop(req.request_id)
        if req.block_ids:
            self.pool.free(req.block_ids)
        req.block_ids = []
        req.num_kv_slots = 0
        req.num_hashed_blocks = 0
        req.num_slid_out_blocks = 0

    # ---- step --------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        for req in list(self.running):
            if budget <= 0:
                break
            if req not in self.running:      # preempted earlier in this loop
                continue
            num_new = self._num_new_tokens(req, budget)
            if num_new == 0:
                continue
            while not self._allocate_slots(req, num_new):
                # its own front first, then the other paged sequences' (they read theirs
                # back anyway), and only then recompute someone
                if self._page_out(req, num_new) or self._page_out_paged(req, num_new):
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                batch.num_preempted += 1
                if victim is req:
                    break
            else:
                batch.items.append((req, num_new))
                budget -= num_new
        if batch.num_preempted == 0:
            self._admit_waiting(batch, budget)
        batch.pool_full = batch.pool_full or batch.num_preempted > 0
        # a lone request that cannot grow even with the whole pool is unfittable
        if not batch.items and not self.running and self.waiting and self.pool.num_free == \
                self.pool.num_blocks:
            batch.unfittable.append(self.waiting.popleft())
        batch.items.sort(key=lambda item: item[0].is_prefilling)   # decodes first
        self._read_ahead()
        return batch

    def _read_ahead(self, num_requests: int = 2) -> None:
        """With tiers: start reading the tier-held prefix blocks of the first waiting
        requests, so the read overlaps this step's forward pass (``TieredStore.
        read_ahead``); once per request (its hashes are kept until admission)."""
        if self.offload is None or self.prefix_salt is None:
            return
        for req in list(self.waiting)[:num_requests]:
            if req.block_hashes or req.block_ids:
                continue
            req.block_hashes = block_hashes(
                req.token_ids[:max(0, req.num_tokens - self.min_last_chunk)],
                self.block_size, self._salt_of(req))
            self.offload.read_ahead(req.block_hashes)

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        remaining = req.num_tokens - req.num_computed_tokens
        if remaining > budget and not self.config.chunked_prefill:
            return 0
        num_new = min(remaining, budget)
        # never leave a last chunk shorter than min_last_chunk: stop that many tokens
        # before the end instead (num_new only shrinks, so the budget holds, and
        # remaining > min_last_chunk keeps it >= 1: no request starves)
        if 0 < remaining - num_new < self.min_last_chunk < remaining:
            num_new = remaining - self.min_last_chunk
        return num_new

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.num_computed_tokens == 0 and not req.block_ids:
                self._take_cached_prefix(req)
            num_new = self._num_new_tokens(req, budget)
            if num_new == 0 or not (self._allocate_slots(req, num_new) or (
                    self._page_out(req, num_new) and self._allocate_slots(req, num_new)) or (
                    self._page_out_paged(req, num_new) and self._allocate_slots(req, num_new))):
                batch.pool_full = num_new > 0
                self._release_cached_prefix(req)
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            batch.items.append((req, num_new))
            budget -= num_new

    # ---- prefix cache ------------------------------------------------------------
    def _salt_of(self, req: Request) -> bytes:
        """The salt of ``req``'s block hashes: its tenant's (``cache_salt``) or the
        engine's."""
        return req.cache_salt or self.prefix_salt

    def _take_cached_prefix(self, req: Request) -> None:
        # a request that scores its prompt (prompt_logprobs) computes every position
        if self.prefix_salt is None or req.params.prompt_logprobs is not None:
            return
        # never take the last token from the cache: it must be computed to get logits;
        # nor the last min_last_chunk tokens, a policy's observation window (its
        # queries score the prompt in the chunk that completes it)
        # (a compacted state is taken up to the last token: what follows it, the next
        # user message, is then the whole observation window)
        # (compacted states are keyed by the engine's salt: not a salted tenant's)
        if self.compacted is not None and req.cache_salt is None \
                and self._take_compacted(req, req.num_tokens - 1):
            return
        max_tokens = max(0, req.num_tokens - self.min_last_chunk)
        hashes = block_hashes(req.token_ids[:max_tokens], self.block_size, self._salt_of(req))
        req.block_hashes = hashes
        found = self.pool.lookup(hashes)
        if self.offload is not None and len(found) < len(hashes):
            # the forward pass runs next: fetched blocks may arrive layer by layer in it
            found += self.offload.take_prefix(hashes, len(found), layerwise=True)
        if found:
            req.block_ids = found
            req.num_computed_tokens = req.num_kv_slots = len(found) * self.block_size
            req.num_hashed_blocks = len(found)
            req.metrics.num_cached_prompt_tokens = req.num_computed_tokens

    def _release_cached_prefix(self, req: Request) -> None:
        # a waiting request holds only what it took at admission: a prefix of hashed
        # blocks, or a compacted state (then it is ``evicted``)
        if req.block_ids and (req.evicted or
                              req.num_computed_tokens == req.num_hashed_blocks * self.block_size):
            self._free_blocks(req)
            req.num_computed_tokens = 0
            req.evicted = False
            req.metrics.num_cached_prompt_tokens = 0

    # ---- compacted states (kvmap.kv.compacted) --------------------------------------------
    def _file_compacted(self, req: Request) -> None:
        """A compacted sequence leaves: name its blocks by the state they hold. A block
        that already carries a key (taken from an earlier turn's state, or a prefix block
        compaction left alone) holds that key's content unchanged -- a rewrite forgets the
        key -- and keeps it: the pool gives a block one key, so a new one would be lost
        and the state unreachable."""
        if self.compacted is None or not req.evicted or not req.block_ids \
                or req.cache_salt is not None:
            return
        num_blocks = -(-req.num_kv_slots // self.block_size)
        tokens = req.token_ids[:req.num_computed_tokens]
        fresh = self.compacted.keys_for(tokens, num_blocks)
        keys = [self.pool.block_hash[b] or k for b, k in zip(req.block_ids, fresh)]
        state = CompactedState(req.num_computed_tokens, req.num_kv_slots, num_blocks,
                               tuple(sorted((req.kv_holes or {}).items())), tuple(keys))
        self.compacted.register(tokens, state)
        for block_id, key in zip(req.block_ids, keys):
            self.pool.register_hash(block_id, key)

    def _take_compacted(self, req: Request, max_tokens: int) -> bool:
        """Continue ``req`` from the compacted state of its longest filed prefix (at most
        ``max_tokens`` tokens), its blocks from the pool or the tiers. The partial last
        block, where new tokens go, is copied into a block of its own. False, holding
        nothing, when there is none or a block is gone."""
        found = self.compacted.longest(req.token_ids, max_tokens)
        if found is None:
            return False
        state, keys = found
        blocks = self.pool.lookup(keys)
        if len(blocks) < len(keys) and self.offload is not None:
            blocks += self.offload.take_prefix(keys, len(blocks))
        partial = state.num_kv_slots % self.block_size != 0
        if len(blocks) < len(keys) or (partial and self.pool.num_free == 0):
            self.pool.free(blocks)
            return False
        if partial:
            copy = self.pool.allocate(1)
            src = torch.tensor(blocks[-1:], device=self.kv.device)
            for layer in self.kv.layers:
                layer.copy_blocks(src, torch.tensor(copy, device=self.kv.device))
            self.pool.free(blocks[-1:])
            blocks[-1:] = copy
        req.block_ids = blocks
        req.num_computed_tokens = state.num_tokens
        req.num_kv_slots = state.num_kv_slots
        req.num_hashed_blocks, req.block_hashes = 0, []
        req.evicted = True
        req.kv_holes = dict(state.kv_holes) or None
        req.metrics.num_cached_prompt_tokens = state.num_tokens
        self.compacted.num_taken += 1
        return True

    def register_full_blocks(self, req: Request) -> None:
        """After a step: name the newly completed full blocks by their content hash."""
        if self.prefix_salt is None or req.evicted:
            return
        num_full = req.num_computed_tokens // self.block_size
        if num_full <= req.num_hashed_blocks:
            return
        if len(req.block_hashes) < num_full:
            parent = req.block_hashes[-1] if req.block_hashes else None
            req.block_hashes += block_hashes(req.token_ids[:num_full * self.block_size],
                                             self.block_size, self._salt_of(req),
                                             start_block=len(req.block_hashes), parent=parent)
        for j in range(req.num_hashed_blocks, num_full):
            self.pool.register_hash(req.block_ids[j], req.block_hashes[j])
        req.num_hashed_blocks = num_full

    # ---- memory --------------------------------------------------------------------
    def _allocate_slots(self, req: Request, num_new: int) -> bool:
        slots = req.num_kv_slots + num_new
        if self.reserve_slots is not None:   # blocks a step's after-work needs too
            slots = max(slots, self.reserve_slots(req, num_new))
        need = -(-slots // self.block_size) - len(req.block_ids)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.block_ids += self.pool.allocate(need)
        return True

    def _page_out(self, req: Request, num_new: int) -> bool:
        """``req`` is short of blocks for ``num_new`` tokens: page its own front out to
        the tiers if it is alone, already paged, or longer than the whole pool (module
        docstring). True if any went."""
        if self.offload is None or not self.offload.paging:
            return False
        context_blocks = -(-req.num_tokens // self.block_size)     # all of it, to come too
        if any(r is not req for r in self.running) \
                and not self.offload.is_paged(req.request_id) \
                and context_blocks <= self.pool.num_blocks:
            return False
        need = -(-(req.num_kv_slots + num_new) // self.block_size) - len(req.block_ids)
        return self.apply_page_out(req, self.offload.page_out(req, need))

    def _page_out_paged(self, req: Request, num_new: int) -> bool:
        """Room for a waiting ``req`` of ``num_new`` tokens: page out the fronts of the
        running sequences that are already paged (they read them back anyway)."""
        if self.offload is None or not self.offload.paging:
            return False
        need = -(-(req.num_kv_slots + num_new) // self.block_size) - len(req.block_ids)
        moved = False
        for r in self.running:
            if self.pool.num_free >= need:
                break
            if self.offload.is_paged(r.request_id):
                moved = self.apply_page_out(r, self.offload.page_out(r, need)) or moved
        return moved

    def apply_page_out(self, req: Request, out: PageOut | None) -> bool:
        """The tiers took ``out``'s pages of ``req``: free their pool blocks (a block
        only ``req`` held loses its hash: no second copy beside the tier's) and keep
        the resident rest as its block table, which no longer starts at token 0. True
        if any page went."""
        if out is None:
            return False
        if out.request_id != req.request_id or \
                tuple(req.block_ids[:len(out.block_ids)]) != out.block_ids:
            raise ValueError(f"page-out of request {out.request_id!r} blocks "
                             f"{list(out.block_ids)} is not the front of request "
                             f"{req.request_id!r}'s block table")
        for block_id in out.block_ids:
            if self.pool.ref_counts[block_id] == 1:
                self.pool.forget_hash(block_id)
        self.pool.free(list(out.block_ids))
        req.block_ids = req.block_ids[len(out.block_ids):]
        req.num_kv_slots -= out.num_tokens
        req.evicted = True
        return True

    def preempt(self, req: Request) -> None:
        """Recompute ``req`` from scratch (e.g. one of its paged-out pages was lost)."""
        if req in self.running:
            self._preempt(req)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req.evicted = False
        req.policy_acc = None
        req.block_hashes = []
        req.status = RequestStatus.PREEMPTED
        req.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
