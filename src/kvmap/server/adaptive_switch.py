"""The engine thread's side of an adaptive switch: measure the signals, ask the
controller, and when it moves, build the new level's engine over the same weights and
make it the one new requests get (the old one drains; ``EngineLoop._retire_drained``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from kvmap.server.adaptive import Signals
from kvmap.kv.redact import redact_spec as redact

log = logging.getLogger("kvmap.server")


@dataclass(frozen=True)
class SwitchEvent:
    time_s: float
    from_kv: str
    to_kv: str
    signals: Signals


def switch_if_asked(loop, num_waiting: int, now_s: float) -> None:
    """One controller decision on ``loop`` (the ``EngineLoop``, engine thread); switches
    ``loop.active`` when the level moved."""
    signals = Signals(kv_usage=loop.active.kv.pool.usage(), num_waiting=num_waiting,
                      p99_tbt_ms=loop.tbt_window.p99_ms(now_s))
    if loop.controller.decide(signals, now_s) is not None:
        _switch(loop, loop.controller.kv, signals, now_s)


def _switch(loop, kv: str, signals: Signals, now_s: float) -> None:
    controller = loop.controller
    try:
        level = controller.policy.levels[controller.level]
        engine = loop.factory(kv, **level.scheduler_overrides())
    except Exception:       # noqa: BLE001 -- keep serving with the current engine
        log.exception("adaptive switch to %r failed; staying on %r", redact(kv),
                      redact(loop.active_kv))
        controller.level = controller.policy.levels.index(
            next(lv for lv in controller.policy.levels if lv.kv == loop.active_kv))
        return
    old_kv = loop.active_kv
    loop.draining.append(loop.active)
    loop.active, loop.active_kv = loop._watch(engine), kv
    loop.switches.append(SwitchEvent(now_s, old_kv, kv, signals))
    loop.metrics.switches.inc()
    loop.metrics.set_active_config(redact(kv))
    log.info("adaptive switch %s -> %s (%s)", redact(old_kv), redact(kv), signals)
