"""The engine loop: engines step in a background thread; each HTTP request waits on its
own asyncio queue.

Threads. The event loop (uvicorn) parses requests and writes responses; one engine thread
owns every ``Engine`` and is the only thread that touches them. The two meet in

- an inbox (a list under a condition variable): ``add``, ``abort`` and ``call``
  commands, applied by the engine thread between steps;
- per-request ``asyncio.Queue``s, fed from the engine thread with
  ``loop.call_soon_threadsafe(queue.put_nowait, item)``.

Lifecycle of a request: ``submit`` counts it as queued (503 when ``max_queue`` requests
already wait) and posts ``add``; the engine thread calls ``Engine.add_request`` and
answers ``accepted`` or ``rejected`` (a ``ValueError`` -> 400), so a bad request never
reaches a step. Each step, every request that got tokens is sent one ``Delta`` (token ids
+ text from its ``IncrementalDetokenizer``); the last ``Delta`` has a ``finish_reason``.
``abort`` (client gone) frees the request's blocks at the next loop turn.

Adaptive mode: with an ``AdaptiveController``, every ``interval_s`` the thread measures
the signals and may switch the active KV configuration. A switch builds a new engine over
the same weights (``Engine(..., model=shared)``); new requests go to it, the old engine
keeps stepping until its requests finish, then it is closed and dropped (its pool freed).
While an old engine drains no further switch happens, so at most two KV pools exist:
total KV memory <= 2 x ``--kv-memory``.

If a step raises, the engine is in an unknown state: the loop stops, every waiting
request gets ``EngineDeadError`` and ``alive`` is False (/health answers 503).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvmap.engine.engine import Engine
from kvmap.request import Request, SamplingParams
from kvmap.server.adaptive import AdaptiveController, LatencyWindow, Signals
from kvmap.server.detokenize import IncrementalDetokenizer
from kvmap.server.metrics import ServerMetrics

log = logging.getLogger("kvmap.server")

EngineFactory = Callable[..., Engine]   # (KV spec, **scheduler limits) -> a new engine over
                                        # the shared weights


class EngineDeadError(RuntimeError):
    pass


class QueueFullError(RuntimeError):
    pass


@dataclass
class Delta:
    """New output of one request since the previous ``Delta``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0          # all output tokens so far


@dataclass
class _Rejected:
    error: Exception


_ACCEPTED = object()


class RequestStream:
    """The event-loop side of one request: ``await stream.next()`` -> ``Delta``."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    async def next(self) -> Delta:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finish_reason is not None:
            self.finished = True
        return item


@dataclass
class _Tracked:
    stream: RequestStream
    engine: Engine
    req: Request
    detok: IncrementalDetokenizer
    num_seen_times: int = 0        # token timestamps already observed in the metrics
    num_sent_ids: int = 0          # output token ids already sent


@dataclass
class SwitchEvent:
    time_s: float
    from_kv: str
    to_kv: str
    signals: Signals


@dataclass
class _Command:
    kind: str                       # "add" | "abort" | "call"
    stream: RequestStream | None = None
    args: tuple = ()
    future: asyncio.Future | None = None
    fn: Callable | None = None


class EngineLoop:
    def __init__(self, factory: EngineFactory, kv: str, metrics: ServerMetrics, *,
                 max_queue: int | None = None, controller: AdaptiveController | None = None,
                 tick_s: float = 0.1, first_engine: Engine | None = None):
        if max_queue is not None and (not isinstance(max_queue, int) or max_queue < 1):
            raise ValueError(f"max_queue={max_queue!r} must be a positive integer (or None)")
        self.factory = factory
        self.metrics = metrics
        self.max_queue = max_queue
        self.controller = controller
        self.tick_s = min(tick_s, controller.policy.interval_s) if controller else tick_s
        self.active = first_engine or factory(kv)
        self.active_kv = kv
        self.draining: list[Engine] = []
        self.tokenizer = self.active.tokenizer
        self.model_config = self.active.model_config
        self.tbt_window = LatencyWindow(controller.policy.window_s if controller else 10.0)
        self.switches: list[SwitchEvent] = []
        self.error: BaseException | None = None
        self._tracked: dict[str, _Tracked] = {}
        self._queued: set[str] = set()       # accepted, not yet scheduled once
        self._num_queued = 0                 # the same plus those still in the inbox
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._inbox: list[_Command] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        metrics.set_active_config(kv)

    # ---- event-loop side ------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    @property
    def engines(self) -> list[Engine]:
        """Active engine first, then the draining ones (engine thread's view)."""
        return [self.active, *self.draining]

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kvmap-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    async def submit(self, request_id: str, prompt_token_ids: list[int],
                     params: SamplingParams, prompt: str | None,
                     arrival_s: float) -> RequestStream:
        """Queue a request; returns once the engine thread accepted it.

        Raises EngineDeadError, QueueFullError, or ValueError (the engine refused it)."""
        if not self.alive:
            raise EngineDeadError(f"the engine is not running ({self.error!r})"
                                  if self.error else "the engine is not running")
        with self._cv:
            if self.max_queue is not None and self._num_queued >= self.max_queue:
                raise QueueFullError(f"the queue is full ({self._num_queued} requests "
                                     f"waiting, --max-queue {self.max_queue}); retry later")
            self._num_queued += 1
            stream = RequestStream(request_id, asyncio.get_running_loop())
            self._inbox.append(_Command("add", stream,
                                        (prompt_token_ids, params, prompt, arrival_s)))
            self._cv.notify()
        try:
            first = await stream.queue.get()
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        if isinstance(first, BaseException):
            raise first
        if isinstance(first, _Rejected):
            raise first.error
        return stream

    def abort(self, request_id: str) -> None:
        """Thread-safe; the request's blocks are freed at the next loop turn."""
        with self._cv:
            self._inbox.append(_Command("abort", args=(request_id,)))
            self._cv.notify()

    async def call(self, fn: Callable[[EngineLoop], object]):
        """Run ``fn(self)`` in the engine thread between steps; returns its result."""
        if not self.alive:
            raise EngineDeadError("the engine is not running")
        future = asyncio.get_running_loop().create_future()
        with self._cv:
            self._inbox.append(_Command("call", future=future, fn=fn))
            self._cv.notify()
        return await future

    # ---- engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._main()
        except BaseException as e:      # noqa: BLE001 -- the loop must report any fault
            log.exception("engine loop died; requests in flight: %s",
                          [(t.req.request_id, t.req.num_prompt_tokens, t.req.params)
                           for t in self._tracked.values()])
            self.error = e
            dead = EngineDeadError(f"the engine failed: {type(e).__name__}: {e}")
            with self._cv:
                inbox, self._inbox = self._inbox, []
            for cmd in inbox:
                if cmd.stream is not None:
                    self._push(cmd.stream, dead)
                if cmd.future is not None:
                    self._resolve(cmd.future, error=dead)
            for t in list(self._tracked.values()):
                self._push(t.stream, dead)
            self._tracked.clear()
        finally:
            self._shutdown()

    def _main(self) -> None:
        next_tick_s = 0.0
        while True:
            with self._cv:
                if not self._inbox and not self._busy() and not self._stopping:
                    self._cv.wait(timeout=self.tick_s)
                if self._stopping:
                    return
                commands, self._inbox = self._inbox, []
            for cmd in commands:
                self._apply(cmd)
            for engine in self.engines:
                if engine.has_unfinished():
                    self._publish(engine.step())
            self._update_queued()
            self._retire_drained()
            now_s = time.perf_counter()
            if now_s >= next_tick_s:
                self._tick(now_s)
                next_tick_s = now_s + self.tick_s

    def _busy(self) -> bool:
        return any(e.has_unfinished() for e in self.engines)

    def _push(self, stream: RequestStream, item) -> None:
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:         # its event loop is closed: nobody is listening
            pass

    def _resolve(self, future: asyncio.Future, result=None, error=None) -> None:
        def settle():
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)
        try:
            future.get_loop().call_soon_threadsafe(settle)
        except RuntimeError:
            pass

    def _apply(self, cmd: _Command) -> None:
        if cmd.kind == "add":
            self._add(cmd.stream, *cmd.args)
        elif cmd.kind == "abort":
            t = self._tracked.get(cmd.args[0])
            if t is not None and t.engine.abort(t.req.request_id):
                self._finish(t)
        elif cmd.kind == "call":
            try:
                self._resolve(cmd.future, result=cmd.fn(self))
            except Exception as e:   # noqa: BLE001 -- handed back to the caller
                self._resolve(cmd.future, error=e)

    def _add(self, stream: RequestStream, ids: list[int], params: SamplingParams,
             prompt: str | None, arrival_s: float) -> None:
        engine = self.active
        try:
            req = engine.add_request(ids, params, request_id=stream.request_id, prompt=prompt,
                                     arrival_s=arrival_s)
        except ValueError as e:
            with self._cv:
                self._num_queued -= 1
            self._push(stream, _Rejected(e))
            return
        self._tracked[req.request_id] = _Tracked(stream, engine, req,
                                                 IncrementalDetokenizer(engine.tokenizer,
                                                                        params.stop))
        self._queued.add(req.request_id)
        self._push(stream, _ACCEPTED)

    def _publish(self, touched: list[Request]) -> None:
        for req in touched:
            t = self._tracked.get(req.request_id)
            if t is None:
                continue
            self._observe_tokens(t)
            if req.status.finished:
                self._finish(t)
                continue
            out_ids = req.output_token_ids
            new_ids = out_ids[t.num_sent_ids:]
            text = t.detok.update(out_ids)
            if new_ids or text:
                t.num_sent_ids = len(out_ids)
                self._push(t.stream, Delta(text, new_ids, None, req.num_prompt_tokens,
                                           len(out_ids)))

    def _observe_tokens(self, t: _Tracked) -> None:
        times = t.req.metrics.token_times_s
        if len(times) <= t.num_seen_times:
            return
        start = t.num_seen_times
        ttft_s = times[0] - t.req.metrics.arrival_s if start == 0 else None
        itls = [times[k] - times[k - 1] for k in range(max(1, start), len(times))]
        for k, itl in zip(range(max(1, start), len(times)), itls):
            self.tbt_window.add(times[k], itl)
        self.metrics.observe_tokens(len(times) - start, itls, ttft_s,
                                    t.req.num_prompt_tokens)
        t.num_seen_times = len(times)

    def _finish(self, t: _Tracked) -> None:
        rid = t.req.request_id
        out = t.engine.pop_finished(rid)
        text = t.detok.finish(out.text)
        self._tracked.pop(rid, None)
        self._dequeue(rid)
        self.metrics.observe_finished(out.metrics, out.finish_reason, t.req.params.max_tokens)
        self._push(t.stream, Delta(text, out.token_ids[t.num_sent_ids:], out.finish_reason,
                                   len(out.prompt_token_ids), len(out.token_ids)))

    def _dequeue(self, request_id: str) -> None:
        if request_id in self._queued:
            self._queued.discard(request_id)
            with self._cv:
                self._num_queued -= 1

    def _update_queued(self) -> None:
        for rid in [r for r in self._queued
                    if self._tracked[r].req.metrics.first_scheduled_s is not None]:
            self._dequeue(rid)

    def _retire_drained(self) -> None:
        for engine in list(self.draining):
            if not engine.has_unfinished() and not any(t.engine is engine
                                                       for t in self._tracked.values()):
                engine.close()
                self.draining.remove(engine)
                self.metrics.forget_engine(id(engine))

    def _num_waiting(self) -> int:
        """Requests not running: in the inbox or in an engine's waiting queue."""
        with self._cv:
            pending = sum(1 for c in self._inbox if c.kind == "add")
        return pending + sum(len(e.scheduler.waiting) for e in self.engines)

    def _tick(self, now_s: float) -> None:
        num_waiting = self._num_waiting()
        if self.controller is not None and not self.draining:
            signals = Signals(kv_usage=self.active.kv.pool.usage(), num_waiting=num_waiting,
                              p99_tbt_ms=self.tbt_window.p99_ms(now_s))
            level = self.controller.decide(signals, now_s)
            if level is not None:
                self._switch(self.controller.kv, signals, now_s)
        self.metrics.update_engine_state(self.engines, num_waiting)

    def _switch(self, kv: str, signals: Signals, now_s: float) -> None:
        try:
            level = self.controller.policy.levels[self.controller.level]
            engine = self.factory(kv, **level.scheduler_overrides())
        except Exception:       # noqa: BLE001 -- keep serving with the current engine
            log.exception("adaptive switch to %r failed; staying on %r", kv, self.active_kv)
            self.controller.level = self.controller.policy.levels.index(
                next(lv for lv in self.controller.policy.levels if lv.kv == self.active_kv))
            return
        old_kv = self.active_kv
        self.draining.append(self.active)
        self.active, self.active_kv = engine, kv
        self.switches.append(SwitchEvent(now_s, old_kv, kv, signals))
        self.metrics.switches.inc()
        self.metrics.set_active_config(kv)
        log.info("adaptive switch %s -> %s (%s)", old_kv, kv, signals)

    def _shutdown(self) -> None:
        for t in list(self._tracked.values()):
            try:
                if t.engine.abort(t.req.request_id):
                    self._finish(t)
            except Exception:       # noqa: BLE001 -- best effort on the way out
                self._push(t.stream, EngineDeadError("the server is shutting down"))
        self._tracked.clear()
        with self._cv:
            inbox, self._inbox = self._inbox, []
        for cmd in inbox:
            if cmd.stream is not None:
                self._push(cmd.stream, EngineDeadError("the server is shutting down"))
            if cmd.future is not None:
                self._resolve(cmd.future, error=EngineDeadError("the server is shutting down"))
        for engine in self.engines:
            try:
                engine.close()
            except Exception:       # noqa: BLE001
                log.exception("closing an engine failed")
