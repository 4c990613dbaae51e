"""Drive one ``Plan`` against a server with asyncio, bounded in count and in time.

- **Count**: the plan holds a finite list of requests (the closed loop may cycle it when
  only a duration bounds the run; repeats get ``-r1``, ``-r2`` ... ids).
- **Time**: ``duration_s`` stops new sends; requests still running
  ``drain_timeout_s`` later are cancelled (``error_kind="cancelled"``); every request is
  also bounded by the endpoint's ``request_timeout_s``. A hung server therefore cannot
  hang a load run: it ends by ``duration_s + drain_timeout_s`` at the latest, or, with no
  duration, when the last request has had its ``request_timeout_s``.
- **The client's own cost**: ``LoadRun.client_cpu_s`` is the process's CPU time over the
  run (``time.process_time``), so a result says how much of the machine the client took
  from a server on the same cores.
- **Conversations**: turn k of a conversation is sent only after turn k-1 finished (its
  prompt holds the history); an open-loop turn k waits for that past its own time, a
  closed-loop slot takes the first request that is ready.

The open loop sends at ``t0 + offset``; the actual send time is what TTFT counts from
(as in vLLM), and ``LoadRun.send_lag_s`` keeps how late each send was, so an overloaded
client shows instead of silently lowering the rate.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import aiohttp

from kvmap.loadgen.client import Endpoint, RawResult, send_request
from kvmap.loadgen.schedule import Plan
from kvmap.workloads.spec import WorkloadRequest


@dataclass
class Sent:
    """One request that was sent (or due): what, when it was due, and what came back."""

    request: WorkloadRequest
    phase: int
    scheduled_s: float | None          # offset from t0 (None: closed loop)
    result: RawResult


@dataclass
class LoadRun:
    """The outcome of ``run_plan``: ``t0_s`` is the ``perf_counter`` start of the run."""

    sent: list[Sent] = field(default_factory=list)
    t0_s: float = 0.0
    end_s: float = 0.0
    num_not_sent: int = 0              # planned requests left out by the duration bound
    stopped_by: str = "count"          # "count" | "duration" | "drain_timeout"
    client_cpu_s: float = 0.0          # this process's CPU time (all threads) over the run

    @property
    def duration_s(self) -> float:
        return self.end_s - self.t0_s

    @property
    def client_cpu_share(self) -> float | None:
        """The client's CPU seconds per wall second of the run (1.0 = one core busy)."""
        return self.client_cpu_s / self.duration_s if self.duration_s > 0 else None

    @property
    def send_lag_s(self) -> list[float]:
        return [s.result.sent_s - self.t0_s - s.scheduled_s for s in self.sent
                if s.scheduled_s is not None and s.result.sent_s is not None]


def _renamed(request: WorkloadRequest, round_no: int) -> WorkloadRequest:
    if round_no == 0:
        return request
    conv = request.conversation_id
    return replace(request, request_id=f"{request.request_id}-r{round_no}",
                   conversation_id=None if conv is None else f"{conv}-r{round_no}")


class _Turns:
    """Which turn of each conversation has finished; wakes the ones waiting for it."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.changed = asyncio.Condition()

    def ready(self, r: WorkloadRequest) -> bool:
        return not r.turn or self.done.get(r.conversation_id, -1) >= r.turn - 1

    async def finished(self, r: WorkloadRequest) -> None:
        async with self.changed:
            if r.conversation_id is not None:
                self.done[r.conversation_id] = max(self.done.get(r.conversation_id, -1),
                                                   r.turn or 0)
            self.changed.notify_all()


def open_session(endpoint: Endpoint) -> aiohttp.ClientSession:
    """The session a load run sends on: no connection limit (the client never queues a
    request behind its own pool, so every wait it measures is the server's), keep-alive
    connections, and the endpoint's connect timeout."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(
        total=None, sock_connect=endpoint.connect_timeout_s))


async def run_plan(endpoint: Endpoint, plan: Plan, *, duration_s: float | None = None,
                   drain_timeout_s: float = 30.0, cycle: bool = False,
                   on_done: Callable[[Sent], None] | None = None,
                   session: aiohttp.ClientSession | None = None) -> LoadRun:
    """Send ``plan`` to ``endpoint``; see the module docstring for the bounds.

    ``cycle`` (closed loop with a ``duration_s`` only) repeats the plan's requests until
    the duration ends. ``on_done`` is called as each request ends. ``session`` is
    ``open_session(endpoint)`` when not given; pass one that a warm-up used so that the
    run's first requests do not pay for their connections.
    """
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s={duration_s!r} must be > 0")
    if not drain_timeout_s > 0:
        raise ValueError(f"drain_timeout_s={drain_timeout_s!r} must be > 0")
    if cycle and (plan.concurrency is None or duration_s is None):
        raise ValueError("cycle needs a closed loop bounded by duration_s")
    own_session = session is None
    if own_session:
        session = open_session(endpoint)
    run = LoadRun()
    turns = _Turns()
    tasks: list[asyncio.Task] = []
    try:
        cpu0_s = time.process_time()
        run.t0_s = time.perf_counter()
        deadline_s = None if duration_s is None else run.t0_s + duration_s

        async def one(sent: Sent) -> None:
            run.sent.append(sent)
            try:
                await send_request(session, endpoint, sent.request, sent.result)
            finally:
                if on_done is not None and sent.result.error_kind != "cancelled":
                    on_done(sent)
                await turns.finished(sent.request)

        if plan.offsets_s is not None:
            tasks = [asyncio.create_task(_open_one(run, turns, one, sent, deadline_s))
                     for sent in (Sent(r, p, off, RawResult(r.request_id)) for r, p, off
                                  in zip(plan.requests, plan.phases, plan.offsets_s))]
        else:
            source = (itertools.chain.from_iterable(
                [_renamed(r, k) for r in plan.requests] for k in itertools.count())
                if cycle else iter(plan.requests))
            pending: list[WorkloadRequest] = []
            tasks = [asyncio.create_task(_closed_worker(run, turns, one, source, pending,
                                                        deadline_s))
                     for _ in range(plan.concurrency)]
        hard_s = None if duration_s is None else duration_s + drain_timeout_s
        done, still = await asyncio.wait(tasks, timeout=hard_s)
        if still:
            run.stopped_by = "drain_timeout"
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        run.end_s = time.perf_counter()
        run.client_cpu_s = time.process_time() - cpu0_s
        if deadline_s is not None and run.stopped_by == "count" and (
                run.num_not_sent or cycle):
            run.stopped_by = "duration"
    finally:
        for task in tasks:
            task.cancel()
        if own_session:
            await session.close()
    run.sent.sort(key=lambda s: s.result.sent_s if s.result.sent_s is not None else 0.0)
    return run


async def _open_one(run: LoadRun, turns: _Turns, one, sent: Sent,
                    deadline_s: float | None) -> None:
    due_s = run.t0_s + sent.scheduled_s
    if deadline_s is not None and due_s >= deadline_s:
        run.num_not_sent += 1
        return
    await asyncio.sleep(max(0.0, due_s - time.perf_counter()))
    if not turns.ready(sent.request):
        async with turns.changed:
            await turns.changed.wait_for(lambda: turns.ready(sent.request))
        if deadline_s is not None and time.perf_counter() >= deadline_s:
            run.num_not_sent += 1
            return
    await one(sent)


async def _closed_worker(run: LoadRun, turns: _Turns, one, source, pending: list,
                         deadline_s: float | None) -> None:
    """One slot of the closed loop: take the first ready request, send it, repeat."""
    while True:
        async with turns.changed:
            while True:
                if deadline_s is not None and time.perf_counter() >= deadline_s:
                    return
                request = next((r for r in pending if turns.ready(r)), None)
                if request is not None:
                    pending.remove(request)
                    break
                nxt = next(source, None)
                if nxt is None:
                    if not pending:
                        return
                    await turns.changed.wait()
                    continue
                pending.append(nxt)
        await one(Sent(request, 0, None, RawResult(request.request_id)))   # one phase
