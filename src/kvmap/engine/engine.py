"""The engine loop: schedule -> run -> sample -> stop checks -> free.

``Engine.step()`` does one iteration of continuous batching and returns the requests
that produced a token or finished in it. It owns the model, the paged KV cache, the
scheduler and the tokenizer; ``kvmap.engine.llm.LLM`` is the friendly front.

With ``tiers(...)``, a prompt larger than the pool is accepted and paged through the
tiers (``kvmap.kv.offload``, reached through its one doorway, ``Offloader``). A paged-out page that cannot be read back (missing,
corrupt) aborts that step's forward pass; the request is recomputed from scratch, and
after ``MAX_PAGE_FAULTS`` such faults it is finished as aborted -- never a wrong token.
"""
from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import replace

import torch

from kvmap.config import DTYPES, EngineConfig, ModelConfig
from kvmap.kv.cache import PagedKVCache, num_blocks_for_budget
from kvmap.kv.compacted import CompactedStates
from kvmap.kv.config import KVConfig
from kvmap.kv.layer_pool import wants_per_layer_tables
from kvmap.kv.layer_kinds import warn_layer_kinds
from kvmap.kv.offload.offloader import Offloader
from kvmap.kv.offload.pager import PageLost
from kvmap.kv.prefix import prefix_salt
from kvmap.kv.spec import KVGeometry
from kvmap.kv.tiers.shared_namespace import weights_identity
from kvmap.engine.logprobs import TokenLogprobs, record_known_targets, record_sampled
from kvmap.engine.policy_runner import PolicyRunner
from kvmap.engine.refusal import InvalidRequest, check_request
from kvmap.engine.runner import ModelRunner
from kvmap.engine.sampler import sample
from kvmap.engine.stats import EngineStats, LoadCounters, TierUsage
from kvmap.engine.scheduler import Scheduler
from kvmap.engine.stop_strings import stop_in_tail
from kvmap.model.decoders import build_decoder
from kvmap.model.llama import LlamaModel
from kvmap.request import Request, RequestOutput, RequestStatus, SamplingParams


MAX_PAGE_FAULTS = 3      # lost pages after which a request is aborted, not recomputed


def bf16_bytes_per_token(config: ModelConfig) -> int:
    """K and V of one token in bf16, all layers: the unit of a token budget."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2


class Engine:
    def __init__(self, config: EngineConfig, loaded, kv_config: KVConfig,
                 model: LlamaModel | None = None):
        """``loaded`` is a ``kvmap.model.loader.LoadedModel`` (config, weights, tokenizer),
        ``kv_config`` the parsed ``config.kv`` (``kvmap.engine.builder.build_engine``
        parses it once). ``model``: an already-built ``LlamaModel`` of the same weights,
        shared with another engine (the server's adaptive mode runs one engine per KV
        configuration over one copy of the weights); ``loaded.weights`` is then not
        used. Neither argument is changed; ``self.loaded`` keeps ``loaded`` less its
        weights (the model holds its own fused copies), for a sibling engine."""
        self.config = config
        self.kv_config = kv_config
        self.dtype = getattr(torch, DTYPES[config.dtype])
        self.device = torch.device(config.device)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.model_id = loaded.model_id
        if model is None:
            model = build_decoder(loaded, self.dtype, self.device)
        self.model = model
        self.loaded = replace(loaded, weights=None)
        cc = config.cache
        max_pos = loaded.config.max_position_embeddings
        if max_pos % cc.block_size:
            fits = [str(b) for b in (8, 16, 32, 64) if max_pos % b == 0]
            raise ValueError(f"block_size={cc.block_size} does not divide the model's context "
                             f"of {max_pos} tokens; choose a divisor (e.g. "
                             f"{', '.join(fits) or '1'})")
        self.geom = KVGeometry.of(loaded.config, cc.block_size)
        codec = self.kv_config.codec
        codec.validate_geometry(self.geom)
        num_blocks = cc.num_blocks or num_blocks_for_budget(
            codec, self.geom, self.kv_budget_bytes(), self.dtype)
        tiers = self.kv_config.tiers
        has_tiers = tiers is not None and bool(tiers.levels)
        per_layer = wants_per_layer_tables(self.kv_config.policy, codec, self.geom, self.dtype,
                                           has_tiers, self.kv_config.window_layout)
        warn_layer_kinds(self.geom, self.kv_config, per_layer, codec, self.dtype, has_tiers)
        self.kv = PagedKVCache(codec, self.geom, num_blocks, self.device, self.dtype,
                               per_layer_tables=per_layer)
        # a selection policy keeps prefix caching: compaction writes only into blocks
        # the sequence alone holds, and forgets the hashes of the blocks it rewrites.
        # Per-layer block tables share groups for a hybrid model's sliding layers (a
        # hit needs their window: LayerBlockPool.usable_hit), not with a policy
        # (layer_budgets, or one on a hybrid model), whose compaction moves groups
        policy = self.kv_config.policy
        salt = prefix_salt(self.model_id, self.kv_config.spec, config.dtype) \
            if cc.enable_prefix_caching and (not per_layer or policy is None) else None
        # paging merges a paged-out front into every layer: not for sliding layers
        self.offload = self._make_offload(salt, paging=policy is None
                                          and not self.geom.sliding_layers)
        min_last_chunk = policy.observation_window if policy is not None and \
            policy.needs_window_attention else 1
        # hard eviction: a finished compacted sequence is kept for the next turn
        compacted = CompactedStates(salt) if salt is not None and policy is not None \
            and policy.evict_to is None else None
        self.scheduler = Scheduler(config.scheduler, self.kv, salt, self.offload,
                                   min_last_chunk, compacted=compacted)
        self.runner = ModelRunner(self.model, self.kv, self.offload)
        self.policy = self.kv_config.policy
        self.policy_runner = PolicyRunner(self.policy, self.kv, config.seed, self.offload,
                                          self.scheduler.apply_page_out) \
            if self.policy is not None else None
        if self.policy_runner is not None and self.policy_runner.offload is not None:
            self.scheduler.reserve_slots = self.policy_runner.reserve_slots
        self.requests: dict[str, Request] = {}
        self.num_prefill_tokens = 0      # tokens computed in prefill chunks, all steps
        self.load = LoadCounters()
        self._ids = itertools.count()
        self.eos_token_ids = set(loaded.config.eos_token_ids)
        if self.tokenizer is not None:
            self.eos_token_ids |= set(self.tokenizer.eos_token_ids)

    def kv_budget_bytes(self) -> int:
        """The pool's byte budget: ``kv_memory`` bytes, or a token budget times the
        model's own bf16 bytes per token (the same bytes for every KV configuration)."""
        cc = self.config.cache
        if cc.kv_memory_tokens is None:
            return cc.kv_memory_bytes
        return cc.kv_memory_tokens * bf16_bytes_per_token(self.model_config)

    def _make_offload(self, salt: bytes | None, paging: bool) -> Offloader | None:
        """The tiers below the pool, if the KV spec has ``tiers(...)``. Blocks are kept
        there by prefix hash, so tiers need prefix caching."""
        layout = self.kv_config.tiers
        if layout is None or not layout.levels:
            return None
        if salt is None:
            raise ValueError(f"KV spec {self.kv_config.spec!r}: {layout!r} keeps blocks by "
                             f"prefix hash, but prefix caching is off "
                             f"(enable_prefix_caching is off)")
        identity = weights_identity(self.model_id, self.model_config, self.model.quantization,
                                    (self.model.embed, self.model.norm))
        offload = Offloader(layout, self.kv, self.model_config, identity, paging)
        weakref.finalize(self, offload.close)     # temp dirs and Redis keys go with us
        return offload

    def close(self) -> None:
        """Release the tiers (files, Redis keys). The engine must not be used after."""
        if self.offload is not None:
            self.offload.close()

    # ---- requests ------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, prompt: str | None = None,
                    arrival_s: float | None = None, cache_salt: str | None = None) -> Request:
        """Validate and queue a request. ``cache_salt``: its tenant's salt of the prefix
        hashes (``kvmap.kv.prefix``). Every check runs before anything is stored: a
        refused request raises ``InvalidRequest`` (a ValueError naming its parameter)
        and leaves no trace in the engine."""
        check_request(self, prompt_token_ids, params, prompt, cache_salt)
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise InvalidRequest(f"request_id {request_id!r} is already in use",
                                 "request_id")
        req = Request(request_id, prompt_token_ids, params,
                      arrival_s if arrival_s is not None else time.perf_counter(), prompt)
        req.logprobs = TokenLogprobs.for_request(req)
        self.scheduler.add(req, cache_salt)      # cannot fail: the salt was checked
        self.requests[request_id] = req
        return req

    def abort(self, request_id: str) -> bool:
        req = self.requests.get(request_id)
        if req is None or req.status.finished:
            return False
        self._finish(req, RequestStatus.FINISHED_ABORTED)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop ------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One iteration. Returns requests that got a token or finished in this step."""
        step_start_s = time.perf_counter()
        batch = self.scheduler.schedule()
        num_running, num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        touched: list[Request] = []
        try:
            return self._step(batch, touched)
        finally:
            self.load.observe(num_running, num_waiting, time.perf_counter() - step_start_s,
                              batch.pool_full)

    def _step(self, batch, touched: list[Request]) -> list[Request]:
        for req in batch.unfittable:
            self._finish(req, RequestStatus.FINISHED_LENGTH)
            touched.append(req)
        if not batch.items:
            return touched
        run_s = time.perf_counter()
        for req, _ in batch.items:
            if req.metrics.first_scheduled_s is None:
                req.metrics.first_scheduled_s = run_s
        try:
            out = self.runner.run(batch.items, self.policy)
        except PageLost as e:
            # nothing was advanced: the other requests redo this step's tokens (same
            # slots, same values); the faulted one is recomputed or, at the limit, aborted
            req = self.requests[e.request_id]
            req.page_faults += 1
            if req.page_faults >= MAX_PAGE_FAULTS:
                self._finish(req, RequestStatus.FINISHED_ABORTED)
                touched.append(req)
            else:
                self.scheduler.preempt(req)
            return touched
        except Exception as e:
            # tells a caller that isolates faults (the server) that this one came out of
            # the forward pass over ``batch``, not out of the engine's own bookkeeping
            e.in_forward_pass = True
            raise
        record_known_targets(self.model, batch.items, out.hidden)
        self.num_prefill_tokens += batch.num_tokens - out.meta.num_decode
        if self.offload is not None:     # the cost model learns the compute rate
            self.offload.observe_run([(r.num_computed_tokens, r.num_computed_tokens + n)
                                      for r, n in batch.items], time.perf_counter() - run_s)
        self._advance(batch.items)
        if self.policy_runner is not None:
            self.policy_runner.after_step(batch.items, out.meta)
        token_ids = sample(out.logits, out.sampled, self.config.seed) if out.sampled else []
        now = time.perf_counter()
        for row, (req, token) in enumerate(zip(out.sampled, token_ids)):
            touched.append(req)
            if req.forced_token_ids is not None:
                req.recorded_logits.append(out.logits[row])
                token = req.forced_token_ids.pop(0)
            try:             # a fault in sampling or post-processing fails this request
                if isinstance(token, Exception):
                    raise token
                req.token_ids.append(token)
                req.metrics.token_times_s.append(now)
                record_sampled(req, out.logits[row])
                self._check_stop(req, token)
            except Exception as e:      # noqa: BLE001 -- the batch's other requests go on
                self._fail(req, e)
        return touched

    def _fail(self, req: Request, error: Exception) -> None:
        """A fault in one request's sampling or stop checks ends it alone (``error``)."""
        req.error = f"{type(error).__name__}: {error}"
        if not req.status.finished:
            self._finish(req, RequestStatus.FINISHED_ABORTED, keep_text=True)

    def _advance(self, items: list[tuple[Request, int]], register: bool = True) -> None:
        """After a forward pass: the n tokens of each item are computed and cached; with
        ``register``, newly full blocks are named in the prefix cache."""
        for req, n in items:
            req.num_computed_tokens += n
            req.num_kv_slots += n
            req.num_slid_out_blocks = self.kv.release_slid_out(
                req.block_ids, req.num_kv_slots, req.num_slid_out_blocks)
            if register:
                self.scheduler.register_full_blocks(req)

    def score(self, token_ids: list[int], num_context_tokens: int | None = None, *,
              per_chunk=None) -> torch.Tensor:
        """Teacher-forced logits through the configured KV cache. The engine must be idle;
        the request is freed afterwards.

        Without ``num_context_tokens``: logits (T, V) fp32 at every position, computed in
        prefill chunks of the step budget (each chunk's attention reads its context back
        from the cache, quantized or not). No selection policy acts in this mode.
        ``per_chunk``: applied to each chunk's logits (n, V) before they are joined, so a
        caller that needs less than (T, V) (log-probabilities of given tokens, top-k)
        never holds the whole matrix.

        With ``num_context_tokens = c``: the first c tokens are prefilled as a prompt
        (a selection policy compresses them), then the rest are fed one decode step at a
        time (the policy keeps acting); returns logits (T - c, V) predicting tokens
        c .. T-1.
        """
        if self.has_unfinished():
            raise RuntimeError("score() needs an idle engine")
        if num_context_tokens is not None:
            c = num_context_tokens
            if not 0 < c < len(token_ids):
                raise ValueError(f"num_context_tokens={c} must be in [1, {len(token_ids)})")
            req = self.add_request(token_ids[:c], SamplingParams(
                max_tokens=len(token_ids) - c, ignore_eos=True))
            req.forced_token_ids = list(token_ids[c:])
            while not req.status.finished:
                self.step()
            self.requests.pop(req.request_id, None)
            return torch.stack(req.recorded_logits)
        req = self.add_request(token_ids, SamplingParams(max_tokens=1, ignore_eos=True))
        chunks = []
        try:
            while req.num_computed_tokens < req.num_tokens:
                batch = self.scheduler.schedule()
                if not batch.items:
                    raise ValueError(f"{len(token_ids)} tokens do not fit the KV pool")
                out = self.runner.run(batch.items)
                logits = self.model.logits(out.hidden)
                chunks.append(per_chunk(logits) if per_chunk is not None else logits)
                self._advance(batch.items, register=False)
        finally:
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            self.requests.pop(req.request_id, None)
        return torch.cat(chunks)

    def _check_stop(self, req: Request, token: int) -> None:
        p = req.params
        num_out = req.num_tokens - req.num_prompt_tokens
        if not p.ignore_eos and token in self.eos_token_ids:
            req.token_ids.pop()      # the EOS token is not part of the output
            req.metrics.token_times_s.pop()
            return self._finish(req, RequestStatus.FINISHED_STOPPED)
        if token in p.stop_token_ids:
            return self._finish(req, RequestStatus.FINISHED_STOPPED)
        if p.stop and self.tokenizer is not None \
                and stop_in_tail(self.tokenizer, req.output_token_ids, p.stop):
            text = self.tokenizer.decode(req.output_token_ids)   # once, to cut exactly
            hits = [text.find(s) for s in p.stop if s in text]
            if hits:
                req.output_text = text[:min(hits)]
                return self._finish(req, RequestStatus.FINISHED_STOPPED, keep_text=True)
        if num_out >= p.max_tokens or req.num_tokens >= self.model_config.max_position_embeddings:
            return self._finish(req, RequestStatus.FINISHED_LENGTH)

    def _finish(self, req: Request, status: RequestStatus, keep_text: bool = False) -> None:
        self.scheduler.remove(req)
        req.status = status
        req.finish_reason = status.value
        req.metrics.finished_s = time.perf_counter()
        if not keep_text and self.tokenizer is not None:
            req.output_text = self.tokenizer.decode(req.output_token_ids)

    def pop_finished(self, request_id: str) -> RequestOutput:
        return self.requests.pop(request_id).to_output()

    # ---- reporting -------------------------------------------------------------------
    def stats(self) -> EngineStats:
        usage, sched, pool, load = self.kv.usage(), self.scheduler, self.kv.pool, self.load
        tiers = self.offload.usage() if self.offload is not None else {}
        pr = self.policy_runner
        return EngineStats(
            resident_bytes=usage.resident_bytes, capacity_bytes=usage.capacity_bytes,
            num_blocks_used=usage.num_blocks_used, num_blocks_total=usage.num_blocks_total,
            bytes_per_block=usage.bytes_per_block, block_size=self.kv.block_size,
            num_running=len(sched.running), num_waiting=len(sched.waiting),
            num_preemptions=sched.num_preemptions,
            prefix_cache_queries=pool.num_prefix_queries,
            prefix_cache_hits=pool.num_prefix_hits,
            max_num_running=load.max_num_running, max_num_waiting=load.max_num_waiting,
            running_seq_s=load.running_seq_s, waiting_seq_s=load.waiting_seq_s,
            num_steps=load.num_steps, num_pool_full_steps=load.num_pool_full_steps,
            tiers={name: TierUsage.from_dict(t) for name, t in tiers.items()},
            tier_store=self.offload.as_dict() if self.offload is not None else None,
            num_compressions=pr.num_compressions if pr is not None else None,
            num_evicted_tokens=pr.num_evicted_tokens if pr is not None else None)

    def tier_resident_bytes(self) -> dict[str, int]:
        """Per tier level: the bytes it holds now (cheaper than ``stats()``); empty
        without tiers."""
        return self.offload.resident_bytes() if self.offload is not None else {}

    def kv_usage(self) -> dict:
        """``stats().to_dict()``: the JSON form (``LLM.kv_usage()``, the server)."""
        return self.stats().to_dict()

    def check_integrity(self) -> None:
        live = [r.block_ids for r in self.requests.values() if r.block_ids]
        self.kv.pool.check_integrity(live)
        if self.offload is not None:
            self.offload.check_integrity()
