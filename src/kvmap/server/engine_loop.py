"""The engine loop: engines step in a background thread; each HTTP request waits on its
own asyncio queue.

Threads. The event loop (uvicorn) parses requests and writes responses; one engine thread
owns every ``Engine`` and is the only thread that touches them. The two meet in

- an inbox (a list under a condition variable) of commands (``inbox.py``) --
  ``AddRequest``, ``AbortRequest``, ``CallInEngine`` -- applied between steps;
- per-request ``RequestStream`` queues, fed from the engine thread with
  ``loop.call_soon_threadsafe(queue.put_nowait, item)`` and read with a deadline.

Lifecycle of a request: ``submit`` counts it as queued (503 when ``max_queue`` requests
already wait) and posts ``AddRequest``; the engine thread calls ``Engine.add_request``
and answers ``Accepted`` or ``Rejected`` (a ``ValueError`` -> 400), so a bad request
never reaches a step. Each step, every request that got tokens is sent one ``Delta``
(token ids + text from its ``IncrementalDetokenizer``); the last ``Delta`` has a
``finish_reason``. ``abort`` (client gone, deadline passed) frees the request's blocks
at the next loop turn.

Faults (``engine_faults``): a step that raises in the forward pass fails the requests it
is pinned on (aborted, blocks freed, the pool checked) and the rest go on; any other
fault rebuilds the engine over the same weights (``kvmap:engine_restarts``), failing the
requests that were on it with a 503 to retry. When faults keep coming the loop gives up:
``alive`` is False, ``/health`` answers 503, nothing submitted afterwards can hang
(``_closed`` is set under the inbox lock before the inbox is drained), and
``on_give_up`` is called -- ``kvmap serve`` then exits non-zero, for its supervisor to
restart it. A fault in one request's sampling or post-processing (the engine's
``Request.error``, or publishing its output) fails that request alone. Clients never see
an exception's text: they get an incident id that the log holds (``errors.incident``).

Adaptive mode: with an ``AdaptiveController``, every ``interval_s`` the thread measures
the signals and may switch the active KV configuration (``adaptive_switch``): new
requests go to the new engine, the old one drains and is closed, so total KV memory <=
2 x ``--kv-memory``.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from kvmap.engine.engine import Engine
from kvmap.request import SamplingParams
from kvmap.server.adaptive import AdaptiveController
from kvmap.server.latency_window import LatencyWindow
from kvmap.server.adaptive_switch import SwitchEvent, switch_if_asked
from kvmap.server.engine_faults import BatchRecorder, RestartBudget, StepFault, classify
from kvmap.server.errors import incident
from kvmap.server.inbox import AbortRequest, AddRequest, CallInEngine, Command
from kvmap.server.messages import (EngineDeadError, QueueFullError, Rejected,
                                   RequestFailedError, RequestTimeoutError)
from kvmap.server.metrics import ServerMetrics
from kvmap.server.publisher import Publisher
from kvmap.kv.redact import redact_spec as redact
from kvmap.server.request_stream import RequestStream

log = logging.getLogger("kvmap.server")

EngineFactory = Callable[..., Engine]   # (KV spec, **scheduler limits) -> a new engine over
                                        # the shared weights
DEFAULT_CALL_TIMEOUT_S = 60.0

__all__ = ["EngineLoop", "EngineDeadError", "QueueFullError", "RequestFailedError",
           "RequestTimeoutError", "RequestStream", "SwitchEvent"]


class EngineLoop:
    def __init__(self, factory: EngineFactory, kv: str, metrics: ServerMetrics, *,
                 max_queue: int | None = None, controller: AdaptiveController | None = None,
                 tick_s: float = 0.1, first_engine: Engine | None = None,
                 request_timeout_s: float | None = None):
        if max_queue is not None and (not isinstance(max_queue, int) or max_queue < 1):
            raise ValueError(f"max_queue={max_queue!r} must be a positive integer (or None)")
        if request_timeout_s is not None and not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s={request_timeout_s!r} must be > 0 (or None)")
        self.factory = factory
        self.metrics = metrics
        self.max_queue = max_queue
        self.request_timeout_s = request_timeout_s
        self.controller = controller
        self.tick_s = min(tick_s, controller.policy.interval_s) if controller else tick_s
        self.active_kv = kv
        self.draining: list[Engine] = []
        self._recorders: dict[int, BatchRecorder] = {}
        self.active = self._watch(first_engine or factory(kv))
        self.tokenizer = self.active.tokenizer
        self.model_config = self.active.model_config
        self.tbt_window = LatencyWindow(controller.policy.window_s if controller else 10.0)
        self.switches: list[SwitchEvent] = []
        self.restarts = RestartBudget()
        self.num_restarts = 0
        self.error: BaseException | None = None
        self.on_give_up: Callable[[], None] | None = None   # called once the loop is dead
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._num_queued = 0                 # accepted, not yet scheduled (inbox included)
        self.publisher = Publisher(self)
        self._inbox: list[Command] = []
        self._stopping = False
        self._closed = False                 # no command will be read any more
        self._thread: threading.Thread | None = None
        metrics.set_active_config(redact(kv))

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

    def _post(self, command: Command) -> None:
        """Under ``_cv``: queue a command, or raise if the engine thread will never read it."""
        if self._closed or not self.alive:
            raise EngineDeadError("the engine is not running")
        self._inbox.append(command)
        self._cv.notify()

    async def submit(self, request_id: str, prompt_token_ids: list[int],
                     params: SamplingParams, prompt: str | None,
                     arrival_s: float, cache_salt: str | None = None) -> RequestStream:
        """Queue a request; returns once the engine thread accepted it. The stream's
        deadline is ``request_timeout_s`` from now.

        Raises EngineDeadError, QueueFullError, RequestTimeoutError, or the engine's
        refusal (ValueError; RequestFailedError)."""
        deadline_s = (time.monotonic() + self.request_timeout_s
                      if self.request_timeout_s is not None else None)
        stream = RequestStream(request_id, asyncio.get_running_loop(), deadline_s)
        with self._cv:
            if self.max_queue is not None and self._num_queued >= self.max_queue:
                raise QueueFullError(f"the queue is full ({self._num_queued} requests "
                                     f"waiting, --max-queue {self.max_queue}); retry later")
            self._post(AddRequest(stream, prompt_token_ids, params, prompt, arrival_s,
                                  cache_salt))
            self._num_queued += 1
        try:
            first = await stream.get()
        except (asyncio.CancelledError, RequestTimeoutError):
            self.abort(request_id)
            raise
        if isinstance(first, BaseException):
            raise first
        if isinstance(first, Rejected):
            raise first.error
        return stream

    def abort(self, request_id: str) -> None:
        """Thread-safe; the request's blocks are freed at the next loop turn."""
        with self._cv:
            if not self._closed:
                self._inbox.append(AbortRequest(request_id))
                self._cv.notify()

    async def call(self, fn: Callable[[EngineLoop], object],
                   timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        """Run ``fn(self)`` in the engine thread between steps; returns its result."""
        future = asyncio.get_running_loop().create_future()
        with self._cv:
            self._post(CallInEngine(fn, future))
        return await asyncio.wait_for(future, timeout_s)

    # ---- engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._main()
        except BaseException as e:      # noqa: BLE001 -- the loop must report any fault
            log.error("engine loop gave up; requests in flight: %s",
                      self.publisher.describe_tracked())
            self.error = e
            self._drain(EngineDeadError(incident("the engine failed and the server gives "
                                                 "up", e)))
        finally:
            self._shutdown()
        if self.error is not None and self.on_give_up is not None:
            self.on_give_up()

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
            self._step_engines()
            self.publisher.update_queued()
            self._retire_drained()
            now_s = time.perf_counter()
            if now_s >= next_tick_s:
                self._tick(now_s)
                next_tick_s = now_s + self.tick_s

    def _busy(self) -> bool:
        return any(e.has_unfinished() for e in self.engines)

    def _watch(self, engine: Engine) -> Engine:
        self._recorders[id(engine)] = BatchRecorder(engine)
        return engine

    def _step_engines(self) -> None:
        for engine in self.engines:
            if not engine.has_unfinished():
                continue
            recorder = self._recorders[id(engine)]
            recorder.clear()
            try:
                touched = engine.step()
            except Exception as e:      # noqa: BLE001 -- a fault fails requests, not the server
                self._on_fault(engine, classify(engine, e, recorder))
                return                  # the engine list may have changed
            self.publisher.publish(touched)

    def _on_fault(self, engine: Engine, fault: StepFault) -> None:
        error = fault.error
        if fault.request_ids is not None:
            log.warning("a step failed for requests %s", list(fault.request_ids))
            message = incident("the request failed in the engine", error)
            for rid in fault.request_ids:
                self.publisher.fail(engine, rid, RequestFailedError(message))
            try:
                engine.check_integrity()
                return
            except Exception as e:      # noqa: BLE001 -- the engine itself is damaged
                error = e
        self._restart(engine, error)

    def _restart(self, engine: Engine, error: BaseException) -> None:
        """Rebuild ``engine`` over the same weights; its requests fail with a 503."""
        if not self.restarts.allow():
            raise EngineDeadError(f"the engine keeps failing ({self.restarts.max_restarts} "
                                  f"restarts within {self.restarts.window_s:.0f} s)"
                                  ) from error
        self.num_restarts += 1
        self.metrics.engine_restarts.inc()
        self.publisher.fail_engine(engine, EngineDeadError(incident(
            "the engine restarted after an internal fault; retry the request", error)))
        self._close_engine(engine)
        if engine is self.active:
            overrides = (self.controller.policy.levels[self.controller.level]
                         .scheduler_overrides() if self.controller is not None else {})
            self.active = self._watch(self.factory(self.active_kv, **overrides))
        else:
            self.draining.remove(engine)

    def _close_engine(self, engine: Engine) -> None:
        self._recorders.pop(id(engine), None)
        self.metrics.forget_engine(id(engine))
        try:
            engine.close()
        except Exception:       # noqa: BLE001 -- it is being replaced anyway
            log.exception("closing an engine failed")

    def _apply(self, cmd: Command) -> None:
        if isinstance(cmd, AddRequest):
            self.publisher.add(self.active, cmd)
        elif isinstance(cmd, AbortRequest):
            self.publisher.abort(cmd.request_id)
        elif isinstance(cmd, CallInEngine):
            try:
                self._resolve(cmd.future, result=cmd.fn(self))
            except Exception as e:   # noqa: BLE001 -- handed back to the caller
                self._resolve(cmd.future, error=e)

    def release_queued(self, num: int = 1) -> None:
        with self._cv:
            self._num_queued -= num

    def push(self, stream: RequestStream, item) -> None:
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

    def _retire_drained(self) -> None:
        for engine in list(self.draining):
            if not engine.has_unfinished() and not self.publisher.has_requests_on(engine):
                self._close_engine(engine)
                self.draining.remove(engine)

    def _num_waiting(self) -> int:
        """Requests not running: in the inbox or in an engine's waiting queue."""
        with self._cv:
            pending = sum(1 for c in self._inbox if isinstance(c, AddRequest))
        return pending + sum(len(e.scheduler.waiting) for e in self.engines)

    def _tick(self, now_s: float) -> None:
        num_waiting = self._num_waiting()
        try:
            if self.controller is not None and not self.draining:
                switch_if_asked(self, num_waiting, now_s)
            self.metrics.update_engine_state(self.engines, num_waiting)
        except Exception:       # noqa: BLE001 -- reporting must not take the engine down
            log.exception("the periodic metrics/adaptive tick failed")

    def _drain(self, error: EngineDeadError) -> None:
        """Close the inbox and answer everything waiting on it, and every tracked request."""
        with self._cv:
            self._closed = True
            inbox, self._inbox = self._inbox, []
        for cmd in inbox:
            if isinstance(cmd, AddRequest):
                self.push(cmd.stream, error)
            elif isinstance(cmd, CallInEngine):
                self._resolve(cmd.future, error=error)
        self.publisher.fail_all(error)

    def _shutdown(self) -> None:
        self.publisher.abort_all()
        self._drain(EngineDeadError("the server is shutting down"))
        for engine in self.engines:
            try:
                engine.close()
            except Exception:       # noqa: BLE001
                log.exception("closing an engine failed")
