"""The workload loop of a cell: requests into the engine as their arrival process says.

- closed loop (``arrival: closed:N``): keep N requests in flight; a request's arrival is
  the moment it is sent;
- open loop (``poisson:R``, ``gamma:R:B``, a trace's own times): a request is added once
  its scheduled time has come and its ``arrival_s`` is that scheduled time (run start +
  offset), so waiting behind a long engine step counts in its TTFT;
- multi-turn: turn k is sent only after turn k-1 of its conversation finished.

(Driven here, not by ``LLM.generate``, so that arrivals are honoured.)
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class LoopStats:
    """What the workload loop saw, sampled around every engine step."""

    start_s: float = 0.0
    duration_s: float = 0.0
    peak_tier_bytes: dict = field(default_factory=dict)
    num_steps: int = 0

    def sample(self, engine) -> None:
        for tier, resident_bytes in engine.tier_resident_bytes().items():
            self.peak_tier_bytes[tier] = max(self.peak_tier_bytes.get(tier, 0), resident_bytes)


def drive(engine, requests: list, prompt_ids: list[list[int]], concurrency: int | None,
          on_finish: Callable[[int], None] | None = None,
          watch=None) -> tuple[dict, dict, LoopStats]:
    """Send ``requests`` (``WorkloadRequest``s, in send order) through ``engine``.

    ``concurrency=None`` is an open loop on the requests' ``arrival_s`` offsets. ``watch``
    (a ``saturation.SaturationWatch``) may stop it early: the requests not sent yet are
    refused with the reason, those in flight aborted. Returns
    ``(outputs, errors, stats)``: ``RequestOutput`` by request id, the error text of
    requests the engine refused, and loop statistics. Mutates ``engine`` (its requests are
    all finished and popped on return).
    """
    from kvmap.request import SamplingParams
    stats = LoopStats()
    open_loop = concurrency is None
    order = list(range(len(requests)))
    if open_loop:
        order.sort(key=lambda i: requests[i].arrival_s or 0.0)
    pending, in_flight = order, set()
    position = {r.request_id: i for i, r in enumerate(requests)}
    outputs, errors = {}, {}
    finished_turn: dict[str, int] = {}           # conversation -> last finished turn
    finished_at: dict[str, float] = {}           # conversation -> when it finished
    t0 = stats.start_s = time.perf_counter()

    def ready(r) -> bool:
        return not r.turn or finished_turn.get(r.conversation_id, -1) >= r.turn - 1

    def done(r, when: float) -> None:
        if r.conversation_id is not None:
            finished_turn[r.conversation_id] = r.turn
            finished_at[r.conversation_id] = when
        if on_finish is not None:
            on_finish(len(outputs) + len(errors))

    while pending or in_flight:
        now, i, next_due = time.perf_counter(), 0, None
        while i < len(pending) and (open_loop or len(in_flight) < concurrency):
            r = requests[pending[i]]
            due = t0 + (r.arrival_s or 0.0) if open_loop else now
            if due > now:
                next_due = due
                break                            # sorted by arrival: none later is due
            if not ready(r):
                i += 1
                continue
            pending.pop(i)
            arrival = max(due, finished_at.get(r.conversation_id, due)) if r.turn else due
            params = SamplingParams(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos)
            try:
                engine.add_request(prompt_ids[position[r.request_id]], params,
                                   request_id=r.request_id, arrival_s=arrival)
            except ValueError as e:
                errors[r.request_id] = str(e)
                done(r, time.perf_counter())
                continue
            in_flight.add(r.request_id)
        if not in_flight:
            if pending and next_due is None:
                raise RuntimeError(f"{len(pending)} requests wait for earlier turns that "
                                   "were never sent")
            if next_due is not None:
                time.sleep(max(0.0, next_due - time.perf_counter()))
            continue
        stats.sample(engine)
        for req in engine.step():
            if req.status.finished and req.request_id in in_flight:
                in_flight.discard(req.request_id)
                outputs[req.request_id] = engine.pop_finished(req.request_id)
                done(requests[position[req.request_id]],
                     req.metrics.finished_s or time.perf_counter())
                times = req.metrics.token_times_s
                if watch is not None and watch.finished(
                        time.perf_counter() - t0, len(in_flight),
                        times[0] - req.metrics.arrival_s if times else None):
                    _stop(engine, requests, pending, in_flight, outputs, errors)
        stats.num_steps += 1
        stats.sample(engine)
    stats.duration_s = time.perf_counter() - t0
    return outputs, errors, stats


def _stop(engine, requests: list, pending: list, in_flight: set, outputs: dict,
          errors: dict) -> None:
    """An over-saturated level ends now: nothing more is sent, what is in flight aborts."""
    for i in pending:
        errors[requests[i].request_id] = "not sent: the level stopped as over-saturated"
    pending.clear()
    for request_id in list(in_flight):
        engine.abort(request_id)
        outputs[request_id] = engine.pop_finished(request_id)
    in_flight.clear()
