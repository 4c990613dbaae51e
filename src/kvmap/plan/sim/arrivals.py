"""When simulated requests reach the server: open or closed loop, conversations in order.

``Arrivals`` is the event queue of requests not yet arrived:

- open loop (every request has an ``arrival_s``): each arrives at its time;
- closed loop (``concurrency``): the first ``concurrency`` arrive at 0, and each request
  that leaves (finished or rejected) lets the next one in, at that moment;
- either way, turn k of a conversation is held back until turn k-1 has left, and then
  arrives at once (a user does not send the next message before reading the reply).

The simulator pops what is due with :meth:`due`, and reports each departure with
:meth:`left`.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque

from kvmap.plan.sim.workload import SimRequest


class Arrivals:
    def __init__(self, requests: list[SimRequest], concurrency: int | None):
        if concurrency is None and any(r.arrival_s is None for r in requests):
            concurrency = 1          # requests without times are sent one after another
        self.concurrency = concurrency
        self._heap: list = []                        # (time_s, seq, request)
        self._seq = itertools.count()
        self._to_send = deque(requests)              # closed loop: not yet sent
        self._held: dict[str, list[SimRequest]] = {}     # conversation -> later turns
        self._last_turn_left: dict[str, int] = {}
        if concurrency is None:
            for req in requests:
                self._push(req, req.arrival_s)
            self._to_send.clear()
        else:
            for _ in range(min(concurrency, len(self._to_send))):
                self._push(self._to_send.popleft(), 0.0)

    def _push(self, req: SimRequest, time_s: float) -> None:
        heapq.heappush(self._heap, (time_s, next(self._seq), req))

    def next_s(self) -> float | None:
        """When the next queued request arrives (None: none is queued)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now_s: float) -> list[tuple[SimRequest, float]]:
        """Requests that have arrived by ``now_s``, with their arrival times, in order."""
        out = []
        while self._heap and self._heap[0][0] <= now_s:
            time_s, _, req = heapq.heappop(self._heap)
            conv = req.conversation_id
            if conv is not None and req.turn > 0 and \
                    self._last_turn_left.get(conv, -1) < req.turn - 1:
                self._held.setdefault(conv, []).append(req)
                continue
            out.append((req, time_s))
        return out

    def left(self, req: SimRequest, now_s: float) -> None:
        """``req`` finished or was rejected at ``now_s``: release what waited for it."""
        conv = req.conversation_id
        if conv is not None:
            self._last_turn_left[conv] = max(self._last_turn_left.get(conv, -1), req.turn)
            held = self._held.get(conv, [])
            for later in [r for r in held if r.turn == req.turn + 1]:
                held.remove(later)
                self._push(later, now_s)
        if self.concurrency is not None and self._to_send:
            self._push(self._to_send.popleft(), now_s)
