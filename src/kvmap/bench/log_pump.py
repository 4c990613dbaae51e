"""A child's output into a log file, line by line, through the one redaction
(``kvmap.kv.redact``): every log a run writes -- a cell's, a launched endpoint server's --
is written this way, so no writer of the run directory skips it."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO

from kvmap.kv.redact import redact_spec


def pump_lines(source: IO, log: IO, take: Callable[[str], bool] = lambda line: False
               ) -> threading.Thread:
    """Start a daemon thread copying ``source``'s lines (text or bytes) into ``log``
    (text), redacted, until ``source`` ends; a line for which ``take(line)`` is True is
    consumed by it instead of logged. Returns the thread (join it after the child)."""
    def run() -> None:
        for raw in source:
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            if take(line):
                continue
            log.write(redact_spec(line))
            log.flush()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
