"""What the engine loop does when a step raises.

A step that raises leaves one of two states behind:

- **a request's fault**: the runner raised for the requests of the step's batch (a bad
  block read back from a tier, a kernel failing on one sequence's shape, ...). Nothing
  was advanced (``Engine.step`` appends tokens only after the forward pass), so the
  culprit is aborted -- its blocks freed -- and every other request redoes the step. The
  culprit is the request the exception names (``error.request_id``, as ``PageLost``
  does) or, failing that, the whole batch the scheduler handed out for that step.
- **an internal fault**: it raised outside the forward pass (the scheduler, the
  sampler, bookkeeping), or the pool fails ``check_integrity()`` afterwards. The engine
  is in an unknown state: every request on it fails, and the loop rebuilds the engine
  over the same weights. ``RestartBudget`` gives up (the loop dies, ``/health`` 503s)
  when faults keep coming -- a restart that cannot help must not spin forever.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from kvmap.engine.engine import Engine

MAX_RESTARTS = 3                 # within RESTART_WINDOW_S, then the loop gives up
RESTART_WINDOW_S = 60.0


@dataclass(frozen=True)
class StepFault:
    """``request_ids``: the requests to fail alone; None: an internal fault (restart)."""

    error: BaseException
    request_ids: tuple[str, ...] | None


class BatchRecorder:
    """Wraps ``engine.scheduler.schedule`` to remember the request ids of the batch the
    current step runs, so that a fault in the forward pass can be pinned on them."""

    def __init__(self, engine: Engine):
        self.request_ids: tuple[str, ...] | None = None
        schedule = engine.scheduler.schedule

        def recording_schedule(*args, **kwargs):
            batch = schedule(*args, **kwargs)
            self.request_ids = tuple(req.request_id for req, _ in batch.items)
            return batch
        engine.scheduler.schedule = recording_schedule

    def clear(self) -> None:
        self.request_ids = None


def classify(engine: Engine, error: BaseException, recorder: BatchRecorder) -> StepFault:
    """Pin ``error`` (raised by ``engine.step()``) on requests, or call it internal."""
    named = getattr(error, "request_id", None)
    if isinstance(named, str) and named in engine.requests:
        ids: tuple[str, ...] | None = (named,)
    else:
        ids = recorder.request_ids or None
    if ids is not None and not _in_forward_pass(error):
        ids = None
    return StepFault(error, ids)


def _in_forward_pass(error: BaseException) -> bool:
    """Whether ``error`` came out of ``Engine.step``'s forward pass (the engine marks it
    ``in_forward_pass``), so that failing only the batch's requests is safe."""
    return bool(getattr(error, "in_forward_pass", False))


class RestartBudget:
    """At most ``max_restarts`` restarts within ``window_s`` seconds."""

    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._times_s: deque[float] = deque()

    def allow(self, now_s: float | None = None) -> bool:
        """Records a restart at ``now_s``; False when the budget is spent."""
        now_s = time.monotonic() if now_s is None else now_s
        while self._times_s and now_s - self._times_s[0] > self.window_s:
            self._times_s.popleft()
        if len(self._times_s) >= self.max_restarts:
            return False
        self._times_s.append(now_s)
        return True
