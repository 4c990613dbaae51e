"""A wall time as the bench prints it (``1m05s``, ``42s``, ``?`` when unknown).

Its own module so that the runner, the estimate and the budget share it without the
estimate importing the runner (the runner imports the search, which imports the estimate).
"""
from __future__ import annotations


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
