"""The event loop: arrivals, continuous batching, KV blocks across tiers, step timing.

The simulated server mirrors kvmap's own engine (``kvmap.engine.scheduler``), one step
at a time, with the clock advanced by the cost model instead of a real forward pass:

1. Requests arrive (:mod:`kvmap.plan.sim.arrivals`: open loop at their times; closed
   loop: one enters when one leaves; turn k of a conversation never before turn k-1
   finished). A request that can never fit (past the context, or the whole pool) is
   rejected and counted. ``prefetch: queue`` stages the prefix blocks of the first
   ``prefetch_depth`` waiting requests one tier up before they are scheduled.
2. ``schedule`` builds a batch under the token budget: running requests first (one token
   for a decode, the next chunk of a prompt), then waiting ones while sequence slots,
   budget and blocks last. A newly admitted request takes the longest prefix of its
   blocks held anywhere; blocks in a tier are promoted (the step waits for them to land:
   a *stall*, charged to the tier's link). When the pool is short the most recently
   admitted request is preempted by recomputation (its full blocks stay cached).
3. The step's time is :func:`kvmap.plan.sim.costmodel.step_cost` of what it computes and
   reads; the offloaded KV of running requests (``hbm_window_tokens``) is streamed over
   the first tier's link, overlapping the step (``stream_overlap``) or not.
4. Computed tokens advance; a request whose last known token was computed samples one
   (its token time is the step's end); finished requests free or cache their blocks.

Blocks are keyed (prefix caching) unless a sliding window, an offload window or per-layer
tables (``layer_budgets``; a hybrid model's sliding layers, ``capacity.hybrid_layer_blocks``)
make a request's blocks its own; keys are ``(owner, block index)``, the owner the conversation
or the request. A policy keeps prefix caching: compaction is copy on write, and a finished
compacted sequence is filed for the next turn (:mod:`kvmap.plan.sim.compaction`).
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import replace

from kvmap.plan import capacity
from kvmap.plan.sim.arrivals import Arrivals
from kvmap.plan.sim.blocks import BlockStore
from kvmap.plan.sim.compaction import (CompactedState, compact, compaction_due, file_state,
                                       take_state)
from kvmap.plan.sim.config import SimConfig
from kvmap.plan.sim.costmodel import KVWork, StepLoad, causal_pairs, model_cost, step_cost
from kvmap.plan.sim.results import SimResult, StepLog, build_result
from kvmap.plan.sim.state import SimState
from kvmap.plan.sim.workload import SimRequest

__all__ = ["SimState", "Simulator"]


class Simulator:
    """Run one :class:`SimConfig` over ``requests``; :meth:`run` returns a SimResult."""

    def __init__(self, config: SimConfig, requests: list[SimRequest]):
        self.config = config
        e = config.engine
        self.block_size = e.block_size
        self.mc = model_cost(config.model, config.kv, config.hardware, e.block_size,
                             config.weights, config.kv_costs)
        self.num_hbm_blocks = self._pool_blocks()
        self.state_blocks = -(-self.mc.state_bytes_per_seq_per_device // self.mc.kv_block_bytes_per_device)
        self.policy = config.kv.policy
        self.num_layers = config.model.config.num_layers
        self.contiguous = e.reservation == "contiguous"
        self.reserve_tokens = e.reservation_tokens or config.model.config.max_position_embeddings
        # layer_budgets: each layer frees its hole; shares no prefix blocks
        self.per_layer = capacity.per_layer_tables(config.kv, config.model.config,
                                                   e.block_size, bool(config.tiers))
        self.window, self.windows = capacity.window_layout(config.model.config, e.block_size,
                                                           self.per_layer)
        self.keyed = (e.enable_prefix_caching and not self.window
                      and e.hbm_window_tokens is None and not self.contiguous
                      and not self.per_layer)
        # the engine's prefix lookup leaves a policy's observation window to compute
        self.min_last_chunk = self.policy.observation_window if self.policy is not None \
            and self.policy.needs_window_attention else 1
        # hard eviction: a finished compacted sequence is filed for the next turn
        self.states: dict[str, CompactedState] | None = {} if self.keyed and \
            self.policy is not None and self.policy.evict_to is None else None
        self.window_blocks = (None if e.hbm_window_tokens is None
                              else math.ceil(e.hbm_window_tokens / e.block_size) + 1)
        self.store = BlockStore(self.num_hbm_blocks, self.mc.kv_block_bytes,
                                list(config.tiers), config.eviction)
        self.link_bandwidth = {t.link: t.bandwidth for t in config.tiers}
        self.prefetching = config.prefetch == "queue" and self.keyed and bool(config.tiers)
        self.requests = requests
        self.waiting: deque[SimState] = deque()
        self.running: list[SimState] = []
        self.done: list[SimState] = []
        self.rejected: list[tuple[SimRequest, str]] = []
        self.steps = StepLog()
        self.now_s = 0.0
        self.num_preemptions = 0
        self.arrivals = Arrivals(requests, config.workload.concurrency
                                 if config.workload is not None else None)

    def _pool_blocks(self) -> int:
        hw, e = self.config.hardware, self.config.engine
        if e.kv_memory_bytes is not None:
            return e.kv_memory_bytes // self.mc.kv_block_bytes_per_device
        usable = capacity.usable_kv_bytes_per_gpu(hw.memory_bytes, self.mc.weight_bytes_per_device,
                                                  hw.gpu_memory_utilization, hw.reserve_bytes)
        return capacity.num_blocks_in(usable, self.mc.kv_block_bytes_per_device)

    # ---- blocks a request needs ------------------------------------------------------
    def _total_blocks(self, st: SimState, num_tokens: int, compressed: bool) -> int:
        """``_kv_blocks`` + a linear-attention state in whole blocks (vLLM v1's hybrid pool)."""
        return self._kv_blocks(st, num_tokens, compressed) + self.state_blocks * (num_tokens > 0)

    def _kv_blocks(self, st: SimState, num_tokens: int, compressed: bool) -> int:
        """Blocks the KV of ``num_tokens`` tokens occupies (HBM + offloaded); a selection
        policy only acts once the prompt is in (``compressed``), so a prompt holds all its
        blocks until the step after its last chunk."""
        if num_tokens <= 0:
            return 0
        if self.contiguous:          # the whole reservation from the first token on
            return math.ceil(max(num_tokens, self.reserve_tokens) / self.block_size)
        if self.windows is not None:          # hybrid: layer blocks, in whole groups
            return st.hold_layer_blocks(capacity.hybrid_layer_blocks(
                num_tokens, self.block_size, self.policy if compressed else None,
                self.windows, num_prompt_tokens=st.req.prompt_tokens), self.num_layers)
        if self.policy is None and not self.window:
            return math.ceil(num_tokens / self.block_size)
        if st.compacted and not compressed:      # continues a compacted state
            return math.ceil(st.slots_at(num_tokens) / self.block_size)
        policy = self.policy if compressed else None
        if self.per_layer and compressed:    # layer blocks in groups, + one for growth
            layer_blocks = capacity.resident_layer_blocks(
                num_tokens, self.block_size, policy, num_layers=self.num_layers,
                num_prompt_tokens=st.req.prompt_tokens)
            return min(math.ceil(layer_blocks / self.num_layers) + 1,
                       math.ceil(num_tokens / self.block_size))
        return capacity.resident_blocks(num_tokens, self.block_size, policy, self.window,
                                        num_layers=self.num_layers,
                                        num_prompt_tokens=st.req.prompt_tokens)

    def _resident_tokens(self, st: SimState, num_computed: int) -> int:
        if num_computed <= 0:
            return 0
        compressed = num_computed >= st.req.prompt_tokens
        if st.compacted and not compressed:
            return st.slots_at(num_computed)
        policy = self.policy if compressed else None
        return capacity.resident_tokens_per_seq(num_computed, policy, self.window,
                                                num_layers=self.num_layers,
                                                num_prompt_tokens=st.req.prompt_tokens)

    def _split(self, total_blocks: int) -> tuple[int, int]:
        """(HBM blocks, offloaded blocks) of a request holding ``total_blocks``."""
        hbm = total_blocks if self.window_blocks is None else min(total_blocks, self.window_blocks)
        return hbm, total_blocks - hbm

    def _fits_ever(self, req: SimRequest) -> str | None:
        max_pos = self.config.model.config.max_position_embeddings
        if req.prompt_tokens >= max_pos:
            return f"prompt of {req.prompt_tokens} tokens >= the model's context {max_pos}"
        final = SimState(req, 0.0)
        last = self._total_blocks(final, req.prompt_tokens + req.output_tokens - 1, True)
        prompt = self._total_blocks(final, req.prompt_tokens, False)
        hbm = max(self._split(last)[0], self._split(prompt)[0])
        if hbm > self.num_hbm_blocks:
            return f"needs {hbm} KV blocks; the HBM pool has {self.num_hbm_blocks}"
        return None

    # ---- arrivals --------------------------------------------------------------------
    def _release_arrivals(self) -> None:
        max_pos = self.config.model.config.max_position_embeddings
        for req, time_s in self.arrivals.due(self.now_s):
            why = self._fits_ever(req)
            if why is None:
                if req.prompt_tokens + req.output_tokens > max_pos:   # stops at the context
                    req = replace(req, output_tokens=max_pos - req.prompt_tokens)
                self.waiting.append(SimState(req, time_s))
            else:
                self.rejected.append((req, why))
                self.arrivals.left(req, self.now_s)

    def _prefetch(self) -> None:
        """Stage the prefixes of the requests at the head of the queue (once each)."""
        for st in itertools.islice(self.waiting, self.config.engine.prefetch_depth):
            if not st.prefetched and st.num_computed == 0 and not st.keys:
                st.prefetched = True
                self.store.prefetch(self._prefix_keys(st), self.now_s)

    # ---- scheduling ------------------------------------------------------------------
    def _prefix_keys(self, st: SimState) -> list:
        # never the last known token: it must be computed to sample the next one
        num_full = max(0, st.num_tokens - self.min_last_chunk) // self.block_size
        return [(st.owner, j) for j in range(num_full)]

    def _take_prefix(self, st: SimState) -> None:
        state = self.states.get(st.owner) if self.states is not None else None
        if state is not None and state.num_tokens < st.num_tokens and \
                take_state(self.store, st, state, self.now_s):
            return
        found = self.store.lookup(self._prefix_keys(st))
        if not found:
            return
        num_taken, ready_s, link = self.store.take(found, self.now_s)
        st.keys = [key for key, _ in found[:num_taken]]
        st.num_computed = num_taken * self.block_size
        st.num_cached_prompt_tokens = min(st.num_computed, st.req.prompt_tokens)
        st.ready_s, st.ready_link = ready_s, link

    def _release_blocks(self, st: SimState, cache: bool) -> None:
        num_full = st.num_computed // self.block_size
        for j, key in enumerate(st.keys):
            self.store.unclaim(key, cache=cache and j < num_full)
        self.store.release(st.num_private)
        self.store.unpin(st.num_offloaded)
        st.keys, st.num_private, st.num_offloaded = [], 0, 0

    def _grow(self, st: SimState, num_new: int) -> bool:
        """Hold the blocks for ``num_new`` more tokens; False (nothing held) if no room."""
        total = self._total_blocks(st, st.num_computed + num_new,
                                   st.num_computed >= st.req.prompt_tokens)
        hbm, offloaded = self._split(total)
        need = hbm - st.num_hbm_blocks
        if need > 0:
            if self.keyed and not st.compacted:
                start = len(st.keys)
                for j in range(start, start + need):
                    if not self.store.claim((st.owner, j), self.now_s):
                        for key in st.keys[start:]:
                            self.store.unclaim(key, cache=False)
                        del st.keys[start:]
                        return False
                    st.keys.append((st.owner, j))
            elif not self.store.allocate(need, self.now_s):
                return False
            else:
                st.num_private += need
        if offloaded > st.num_offloaded:
            self.store.pin(offloaded - st.num_offloaded, self.now_s)
            st.num_offloaded = offloaded
        return True

    def _trim(self, st: SimState) -> None:
        """After a step: give back blocks a policy or window freed; the first compaction
        of a keyed sequence is copy on write (:func:`compact`)."""
        compressed = st.num_computed >= st.req.prompt_tokens
        if self.keyed and (self.policy is None or not compressed):
            return
        hbm, offloaded = self._split(self._total_blocks(st, st.num_computed, compressed))
        if st.keys and (not self._compaction_due(st) or not compact(
                self.store, st, min(hbm, st.num_hbm_blocks), self.block_size, self.now_s)):
            return          # not over its budget yet, or no room for the copy: next step
        if st.num_private > hbm:
            self.store.release(st.num_private - hbm)
            st.num_private = hbm
        if st.num_offloaded > offloaded:
            self.store.unpin(st.num_offloaded - offloaded)
            st.num_offloaded = offloaded

    def _compaction_due(self, st: SimState) -> bool:
        n = st.num_computed
        return compaction_due(st.slots_at(n) if st.compacted else n,
                              self._resident_tokens(st, n), n > st.req.prompt_tokens,
                              self.policy.decode_every_steps(self.block_size))

    def _preempt(self, st: SimState) -> None:
        self.running.remove(st)
        self._release_blocks(st, cache=True)
        st.num_computed = 0
        st.compacted = False
        st.num_preemptions += 1
        self.waiting.appendleft(st)

    def _schedule(self) -> tuple[list[tuple[SimState, int]], int]:
        """The step's (request, new tokens) items and how many requests it preempted."""
        e = self.config.engine
        budget, items, num_preempted = e.max_num_batched_tokens, [], 0
        for st in list(self.running):
            if budget <= 0:
                break
            if st not in self.running:
                continue
            num_new = min(st.num_tokens - st.num_computed, budget)
            while not self._grow(st, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                num_preempted += 1
                if victim is st:
                    break
            else:
                items.append((st, num_new))
                budget -= num_new
        if num_preempted:
            return items, num_preempted
        while self.waiting and budget > 0 and len(self.running) < e.max_num_seqs:
            st = self.waiting[0]
            if self.keyed and st.num_computed == 0 and not st.keys:
                self._take_prefix(st)
            num_new = min(st.num_tokens - st.num_computed, budget)
            if not self._grow(st, num_new):
                if st.num_computed and (st.compacted or
                                        st.num_computed == len(st.keys) * self.block_size):
                    self._release_blocks(st, cache=True)     # let go of the cached prefix
                    st.num_computed = st.num_cached_prompt_tokens = 0
                    st.compacted = False
                break
            self.waiting.popleft()
            self.running.append(st)
            items.append((st, num_new))
            budget -= num_new
        return items, 0

    # ---- one step ------------------------------------------------------------------
    def _load(self, items: list[tuple[SimState, int]]) -> StepLoad:
        num_tokens = num_sampled = pairs = read = write = streamed_blocks = 0
        work = KVWork(self.policy, self.block_size)
        for st, n in items:
            start, end = st.num_computed, st.num_computed + n
            num_tokens += n
            num_sampled += end == st.num_tokens
            resident_before = self._resident_tokens(st, start)
            if self.policy is None and not self.window:
                pairs += causal_pairs(start, end)
            else:   # the new tokens attend what is kept, plus each other
                pairs += n * resident_before + n * (n + 1) // 2
            hbm_tokens = resident_before
            if self.window_blocks is not None:
                hbm_tokens = min(resident_before, self.window_blocks * self.block_size)
                streamed_blocks += st.num_offloaded
            read += hbm_tokens + n
            write += n
            work.add(start >= st.req.prompt_tokens, end == st.req.prompt_tokens, hbm_tokens + n)
        link_bytes = {}
        if streamed_blocks:
            link_bytes[self.store.levels[0].spec.link] = self.store.stream(streamed_blocks)
        return StepLoad(num_tokens, num_sampled, pairs, read, write, link_bytes, len(items),
                        **work.counts())

    def _step(self, items: list[tuple[SimState, int]]) -> None:
        start_s = self.now_s
        stall_s, stall_link = 0.0, None
        for st, _ in items:
            if st.first_scheduled_s is None:
                st.first_scheduled_s = start_s
            if st.ready_s - start_s > stall_s:
                stall_s, stall_link = st.ready_s - start_s, st.ready_link
        if stall_link is not None:
            level = next(s for s in self.store.levels if s.spec.link == stall_link)
            level.stall_s += stall_s
        cost = step_cost(self.mc, self.config.hardware, self._load(items), self.link_bandwidth,
                         self.config.engine.stream_overlap)
        self.now_s = start_s + stall_s + cost.total_s
        decode = sum(1 for st, n in items if st.num_computed >= st.req.prompt_tokens)
        self.steps.add(start_s, stall_s, stall_link, cost, len(items), decode,
                       sum(n for _, n in items), self.store.num_used)
        for st, n in items:
            st.num_computed += n
            st.peak_hbm_blocks = max(st.peak_hbm_blocks, st.num_hbm_blocks)
            st.peak_total_blocks = max(st.peak_total_blocks, st.num_hbm_blocks + st.num_offloaded)
            self._trim(st)
            if st.num_computed == st.num_tokens:
                st.num_output += 1
                st.token_times_s.append(self.now_s)
                if st.num_output >= st.req.output_tokens:
                    self._finish(st)

    def _finish(self, st: SimState) -> None:
        st.final_hbm_blocks = st.num_hbm_blocks
        self.running.remove(st)
        if self.states is not None and st.compacted:
            self.states[st.owner] = file_state(self.store, st, self._resident_tokens(
                st, st.num_computed), self.block_size)
        self._release_blocks(st, cache=self.keyed)
        st.finished_s = self.now_s
        self.done.append(st)
        self.arrivals.left(st.req, self.now_s)

    def run(self) -> SimResult:
        """Simulate until every request finished or was rejected."""
        while True:
            self._release_arrivals()
            if not self.running and not self.waiting:
                next_s = self.arrivals.next_s()
                if next_s is None:
                    break
                self.now_s = max(self.now_s, next_s)
                continue
            items, num_preempted = self._schedule()
            if self.prefetching:
                self._prefetch()
            self.num_preemptions += num_preempted
            if items:
                self._step(items)
                continue
            if num_preempted:
                continue
            if not self.running and self.waiting and self.store.num_used == 0:
                st = self.waiting.popleft()      # cannot start even in an empty pool
                self.rejected.append((st.req, "does not fit the HBM pool beside cached blocks"))
                self.arrivals.left(st.req, self.now_s)
                continue
            next_s = self.arrivals.next_s()
            if next_s is None:
                raise RuntimeError("simulator stuck: requests wait and none can run")
            self.now_s = max(self.now_s, next_s)
        return build_result(self)
