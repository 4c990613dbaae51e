"""The engine thread's view of the requests it serves: which engine holds each, what has
been sent to its stream, and how a request ends -- finished, aborted, or failed by a
fault. Every path out frees the request's blocks in its engine and releases its place
in the queue count, exactly once.

A fault that belongs to one request fails that request alone with a 500: the engine
ended it with ``error`` set (its sampling or stop checks raised), or publishing its
output raised here (detokenizing, say)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from kvmap.engine.engine import Engine
from kvmap.request import Request
from kvmap.server.detokenize import IncrementalDetokenizer
from kvmap.server.errors import incident
from kvmap.server.inbox import AddRequest
from kvmap.server.messages import (ACCEPTED, Delta, EngineDeadError, Rejected,
                                   RequestFailedError)
from kvmap.server.request_stream import RequestStream

log = logging.getLogger("kvmap.server")


@dataclass
class Tracked:
    stream: RequestStream
    engine: Engine
    req: Request
    detok: IncrementalDetokenizer
    num_seen_times: int = 0        # token timestamps already observed in the metrics
    num_sent_ids: int = 0          # output token ids already sent


class Publisher:
    def __init__(self, loop):
        """``loop``: the ``EngineLoop`` whose thread this runs on (it pushes to streams,
        keeps the queue count and the TBT window)."""
        self.loop = loop
        self.metrics = loop.metrics
        self.tracked: dict[str, Tracked] = {}
        self.queued: set[str] = set()       # accepted, not yet scheduled once

    def describe_tracked(self) -> list:
        return [(t.req.request_id, t.req.num_prompt_tokens, t.req.params)
                for t in self.tracked.values()]

    def has_requests_on(self, engine: Engine) -> bool:
        return any(t.engine is engine for t in self.tracked.values())

    # ---- arrivals ---------------------------------------------------------------------
    def add(self, engine: Engine, cmd: AddRequest) -> None:
        stream = cmd.stream
        try:
            req = engine.add_request(cmd.prompt_token_ids, cmd.params,
                                     request_id=stream.request_id, prompt=cmd.prompt,
                                     arrival_s=cmd.arrival_s, cache_salt=cmd.cache_salt)
        except ValueError as e:
            self.loop.release_queued()
            self.loop.push(stream, Rejected(e))
            return
        self.tracked[req.request_id] = Tracked(
            stream, engine, req, IncrementalDetokenizer(engine.tokenizer, cmd.params.stop))
        self.queued.add(req.request_id)
        self.loop.push(stream, ACCEPTED)

    def update_queued(self) -> None:
        for rid in [r for r in self.queued
                    if self.tracked[r].req.metrics.first_scheduled_s is not None]:
            self._dequeue(rid)

    def _dequeue(self, request_id: str) -> None:
        if request_id in self.queued:
            self.queued.discard(request_id)
            self.loop.release_queued()

    # ---- outputs ----------------------------------------------------------------------
    def publish(self, touched: list[Request]) -> None:
        for req in touched:
            t = self.tracked.get(req.request_id)
            if t is None:
                continue
            try:
                self._publish_one(t, req)
            except Exception as e:      # noqa: BLE001 -- post-processing: this request's
                self.fail(t.engine, req.request_id, RequestFailedError(
                    incident("the request failed while its output was prepared", e)))

    def _publish_one(self, t: Tracked, req: Request) -> None:
        self._observe_tokens(t)
        if req.status.finished:
            self._finish(t)
            return
        out_ids = req.output_token_ids
        new_ids = out_ids[t.num_sent_ids:]
        text = t.detok.update(out_ids)
        if new_ids or text:
            t.num_sent_ids = len(out_ids)
            self.loop.push(t.stream, Delta(text, new_ids, None, req.num_prompt_tokens,
                                           len(out_ids)))

    def _observe_tokens(self, t: Tracked) -> None:
        times = t.req.metrics.token_times_s
        if len(times) <= t.num_seen_times:
            return
        start = t.num_seen_times
        ttft_s = times[0] - t.req.metrics.arrival_s if start == 0 else None
        itls = [times[k] - times[k - 1] for k in range(max(1, start), len(times))]
        for k, itl in zip(range(max(1, start), len(times)), itls):
            self.loop.tbt_window.add(times[k], itl)
        self.metrics.observe_tokens(len(times) - start, itls, ttft_s,
                                    t.req.num_prompt_tokens)
        t.num_seen_times = len(times)

    def _finish(self, t: Tracked) -> None:
        rid = t.req.request_id
        out = t.engine.pop_finished(rid)
        if out.error is not None:       # the engine failed it alone (sampling, stops)
            self._untrack(rid)
            self.metrics.failed.inc()
            self.loop.push(t.stream, RequestFailedError(
                incident("the request failed in the engine", out.error)))
            return
        text = t.detok.finish(out.text)
        self._untrack(rid)
        self.metrics.observe_finished(out.metrics, out.finish_reason, t.req.params.max_tokens)
        self.loop.push(t.stream, Delta(text, out.token_ids[t.num_sent_ids:], out.finish_reason,
                                       len(out.prompt_token_ids), len(out.token_ids),
                                       out.logprobs))

    def _untrack(self, request_id: str) -> None:
        self.tracked.pop(request_id, None)
        self._dequeue(request_id)

    # ---- ends other than finishing ------------------------------------------------------
    def abort(self, request_id: str) -> None:
        t = self.tracked.get(request_id)
        if t is not None and t.engine.abort(t.req.request_id):
            self._finish(t)

    def fail(self, engine: Engine, request_id: str, error: Exception) -> None:
        """A fault was pinned on this request: abort it in ``engine`` (blocks freed) and
        hand ``error`` to its client. Raises if the engine cannot even abort it."""
        t = self.tracked.get(request_id)
        if engine.abort(request_id):
            engine.requests.pop(request_id, None)
        if t is None:
            return
        self._untrack(request_id)
        self.metrics.failed.inc()
        self.loop.push(t.stream, error)

    def fail_engine(self, engine: Engine, error: EngineDeadError) -> None:
        """Every request on ``engine`` (which is being replaced) gets ``error``."""
        for rid, t in list(self.tracked.items()):
            if t.engine is engine:
                self._untrack(rid)
                self.loop.push(t.stream, error)

    def fail_all(self, error: EngineDeadError) -> None:
        for rid, t in list(self.tracked.items()):
            self._untrack(rid)
            self.loop.push(t.stream, error)

    def abort_all(self) -> None:
        """Shutdown: abort what can be aborted (counted, blocks freed); the rest fail."""
        for t in list(self.tracked.values()):
            try:
                if t.engine.abort(t.req.request_id):
                    self._finish(t)
            except Exception:       # noqa: BLE001 -- best effort on the way out
                self._untrack(t.req.request_id)
                self.loop.push(t.stream, EngineDeadError("the server is shutting down"))
