"""A run's ``arrival: auto`` searches held to its budget while they run (``SearchBudget``).

The estimate counts a search as it usually runs (``bench.estimate``: a few levels); one
that needs more -- sequential extensions of an undecided level, a bisection past a wide
bracket -- would run past the budget, and the re-plan after the cells (``bench.replan``)
cannot re-size a search, which decides its next probe from the last. So before each
probe the search projects its wall time from the probes it already ran, and stops,
undecided, when that probe and the least the later searches need do not fit in what the
budget has left:

    probe at rate r     = d_ref x r_ref / r   (a level lasts its schedule, N / rate; the
                          reference is the last level run, else the saturated run at its
                          own rate)
    a closed run        = the same role's time in an earlier search (none yet: it runs)
    a later search      = serial + saturated + one level at ``LEVEL_SHARE`` of the
                          saturated rate, timed from the searches run so far

The stop is said in the search's result (``searches.json``: ``stopped``) with the
projection and the time left, so a reader knows what the answer would have taken.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvmap.bench.estimate import LEVEL_SHARE


@dataclass
class SearchBudget:
    """``time_left()``: seconds the run may still spend before its budget (less the
    report's reserve); ``num_searches``: the run's searches, in order."""

    time_left: Callable[[], float]
    num_searches: int
    seen: dict[str, float] = field(default_factory=dict)    # role -> seconds, latest

    def ran(self, role: str, seconds: float | None) -> None:
        """A probe of ``role`` took ``seconds``."""
        if seconds is not None and seconds > 0:
            self.seen[role] = seconds

    def projected_s(self, step, probes: list, durations: list[float | None]) -> float | None:
        """The wall time of ``step`` (a ``runs.search.NextProbe``) from ``probes`` and
        their ``durations`` in this search; None when nothing yet says."""
        rate = _rate_of(step.arrival)
        if rate is None:
            return self.seen.get(step.role)
        for probe, seconds in zip(reversed(probes), reversed(durations)):
            ref = probe.rate or (probe.requests_per_s if probe.role == "saturated" else None)
            if ref and seconds:
                return seconds * ref / rate
        return None

    def later_s(self, index: int) -> float:
        """The least each search after the ``index``-th needs: serial, saturated and one
        level, timed from what ran (0 before any search ran its closed runs)."""
        serial, saturated = self.seen.get("serial", 0.0), self.seen.get("saturated", 0.0)
        return max(0, self.num_searches - index - 1) * (serial + saturated
                                                        + saturated / LEVEL_SHARE)

    def stop(self, index: int, step, probes: list, durations: list[float | None]
             ) -> str | None:
        """Why the ``index``-th search stops before ``step``, or None when it fits."""
        need = self.projected_s(step, probes, durations)
        if need is None:
            return None
        later, left = self.later_s(index), self.time_left()
        if need + later <= left:
            return None
        what = step.arrival.replace("poisson:", "") + " req/s" if step.arrival.startswith(
            "poisson:") else step.arrival
        rest = f" + {later:.0f} s the later searches need at least" if later else ""
        return (f"stopped by the budget before its {step.role} at {what}: projected "
                f"{need:.0f} s{rest}, {max(0.0, left):.0f} s left")


def _rate_of(arrival: str) -> float | None:
    if not arrival.startswith("poisson:"):
        return None
    try:
        return float(arrival.split(":", 1)[1])
    except ValueError:
        return None


__all__ = ["SearchBudget"]
