"""A time budget: size what is sizeable so that a run fits, keep what gives it meaning.

    plan = size_to_budget(scenario, parse_duration("40m"), estimate)

What is sizeable, each from its written value down to a stated minimum (``minimum_of``):

- requests per load level of a workload: never below 8 (or the written value, if less),
  below a closed loop's concurrency (the level would not be what its label says), or
  below 1.25x the requests the pool holds at the densest configuration whose pool binds
  at the written size (a memory-bound comparison stays memory-bound: the baseline's
  pool stays full, and a denser codec shows what it holds more);
- accuracy samples of a task (``num_samples``): never below ``MIN_SAMPLES`` (ppl: 4
  windows; passkey / needle: 1 per context x depth cell of the grid; chat_generation:
  8 prompts; any other: 4). A task's value is one for all its configurations: every
  configuration gets the same samples (paired);
- an ``arrival: auto`` search's requests per probe (``runs.search``): never below 12,
  nor below 1.25x what the densest configuration's pool holds in the saturated run.

One scale s in [0, 1] moves every knob at once, ``value = max(minimum, round(written x s))``,
and s is bisected to the largest value whose estimate fits the budget. Before any cell:
a cell that would pass its own ``cell_timeout_s`` on its estimate is left out, with the
reason, rather than run to be killed (a search whole, by its template's id, if any probe
would); one that passes it even at the minimum costs the budget nothing. A budget whose
minimum still does not fit leaves out the scenario's ``optional: true`` entries (every
configuration of one together), the costliest at its minimum first, until it fits; if it
does not fit without them either, it is refused (``BudgetError`` naming the budget, the
minimum's estimate, and the families that cost most at their minimum).
``BudgetPlan.to_dict`` goes to run.json (``budget``): the report says what the budget
cut and what it left out, with why.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvmap.bench.cellspec import Scenario
from kvmap.bench.duration import fmt_duration
from kvmap.runs.left_out import left_out_lines

MIN_REQUESTS = 8
MIN_SEARCH_REQUESTS = 12      # an attainment per probe needs requests
POOL_MARGIN = 1.25
MIN_SAMPLES = {"ppl": 4, "passkey": 1, "needle": 1, "chat_generation": 8}
DEFAULT_MIN_SAMPLES = 4
OVERRUN_WARNING = 1.25        # an estimate this far over its budget is said before the run
_UNITS = {"h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0}


class BudgetError(ValueError):
    """A budget that cannot hold the minimum of every configuration."""


def parse_duration(text: str | float | int) -> float:
    """``"40m"``, ``"3m"``, ``"90s"``, ``"1h30m"``, ``"2.5m"`` -> seconds; ValueError
    naming the value for anything else (a bare number has no unit: refused)."""
    raw = str(text).strip().lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|min|m|s)", raw)
    if not raw or not parts or re.sub(r"(\d+(?:\.\d+)?)\s*(h|min|m|s)", "", raw).strip():
        raise ValueError(f"--budget {text!r} is not a duration such as 40m, 90s or 1h30m")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"--budget {text!r} must be longer than 0 s")
    return seconds


@dataclass(frozen=True)
class Knob:
    """One sizeable quantity: where it is, its written value and its minimum."""

    kind: str                    # "workload" | "task" | "search"
    name: str                    # the workload (with its level) or task
    key: str                     # "num_requests" | "num_samples" | "requests_per_probe"
    written: int
    minimum: int
    why_minimum: str

    def at(self, scale: float) -> int:
        return max(self.minimum, min(self.written, int(round(self.written * scale))))


@dataclass(frozen=True)
class BudgetPlan:
    budget_s: float
    written_estimate_s: float
    minimum_estimate_s: float | None     # None: not sized (--no-sizing)
    estimate_s: float            # of what will run
    scale: float
    cuts: tuple[tuple[Knob, int], ...] = ()          # (knob, value) where value < written
    left_out: tuple[tuple[str, str], ...] = ()       # (cell id, reason)
    scenario: Scenario | None = field(default=None, repr=False)

    @property
    def overrun(self) -> float:
        return self.estimate_s / self.budget_s

    def lines(self) -> list[str]:
        least = "" if self.minimum_estimate_s is None else \
            f", at the minimum {fmt_duration(self.minimum_estimate_s)}"
        head = (f"budget {fmt_duration(self.budget_s)}: estimate {fmt_duration(self.estimate_s)} "
                f"(as written {fmt_duration(self.written_estimate_s)}{least})")
        out = [head] + [f"  cut {k.name} {k.key} {k.written} -> {v} (minimum {k.minimum}: "
                        f"{k.why_minimum})" for k, v in self.cuts]
        out += left_out_lines(self.left_out)
        if self.overrun > OVERRUN_WARNING:
            out.append(f"  warning: the run would overrun its budget by "
                       f"{(self.overrun - 1):.0%} on its own estimate")
        return out

    def to_dict(self) -> dict:
        return {"budget_s": self.budget_s, "estimate_s": round(self.estimate_s, 1),
                "written_estimate_s": round(self.written_estimate_s, 1),
                "minimum_estimate_s": None if self.minimum_estimate_s is None
                else round(self.minimum_estimate_s, 1),
                "scale": round(self.scale, 4),
                "cuts": [{"kind": k.kind, "name": k.name, "key": k.key,
                          "written": k.written, "value": v, "minimum": k.minimum,
                          "why_minimum": k.why_minimum} for k, v in self.cuts],
                "left_out": [{"cell_id": c, "reason": r} for c, r in self.left_out]}


# ---- the knobs of a scenario ------------------------------------------------------------

def _level_name(w) -> str:
    return w.name if w.load is None else f"{w.name}@{w.load['label']}"


def knobs(scenario: Scenario, pool_requests: Callable) -> list[Knob]:
    """Every sizeable quantity of ``scenario``; ``pool_requests(workload entry)`` is the
    list of requests the pool holds at each of its configurations (the estimator's)."""
    out = []
    for i, w in enumerate(scenario.workloads):
        n = w.options.get("num_requests")
        if not isinstance(n, int) or w.options.get("kind") == "trace":
            continue
        spec = w.spec(scenario.seed)
        floor, why = MIN_REQUESTS, f"at least {MIN_REQUESTS} requests"
        concurrency = getattr(spec.arrival, "concurrency", None)
        if w.is_search:                 # its saturated run has them all in flight
            floor, why = MIN_SEARCH_REQUESTS, f"at least {MIN_SEARCH_REQUESTS} a probe"
            concurrency = min(n, scenario.engine.max_num_seqs)
        elif concurrency is not None and concurrency > floor:
            floor, why = concurrency, f"closed:{concurrency} keeps {concurrency} in flight"
        bound = [c for c in pool_requests(w) if c < min(n, concurrency or n)]
        if bound and math.ceil(POOL_MARGIN * min(bound)) > floor:
            floor = math.ceil(POOL_MARGIN * min(bound))
            why = f"the pool binds: {POOL_MARGIN}x the {min(bound):.0f} requests it holds"
        if n <= floor:
            why = f"as written (below {why})"
        out.append(Knob("workload", f"{_level_name(w)}#{i}", "num_requests", n, min(n, floor),
                        why))
    for i, t in enumerate(scenario.tasks):
        if not t.is_accuracy_task:
            continue
        from kvmap.bench.tasks import eval_options
        from kvmap.evals import get_task
        task = get_task(t.task, eval_options(t.params, scenario.seed))
        n = getattr(task, "num_samples", None)
        if not isinstance(n, int):
            continue
        floor = MIN_SAMPLES.get(t.task, DEFAULT_MIN_SAMPLES)
        grid = " per grid cell" if t.task in ("passkey", "needle") else ""
        why = f"at least {floor} samples{grid}, the same for every configuration"
        out.append(Knob("task", f"{t.name}#{i}", "num_samples", n, min(n, floor),
                        why if n > floor else f"as written (below {why})"))
    return out


def apply(scenario: Scenario, values: dict[Knob, int]) -> Scenario:
    """``scenario`` with each knob at its value (the others as written)."""
    workloads, tasks = list(scenario.workloads), list(scenario.tasks)
    for knob, value in values.items():
        index = int(knob.name.rsplit("#", 1)[1])
        if knob.kind == "workload":
            w = workloads[index]
            workloads[index] = replace(w, options={**w.options, knob.key: value})
        elif knob.kind == "task":
            t = tasks[index]
            tasks[index] = replace(t, params={**t.params, knob.key: value})
    return replace(scenario, workloads=tuple(workloads), tasks=tuple(tasks))


def size_to_budget(scenario: Scenario, budget_s: float,
                   estimate: Callable[[Scenario], object],
                   pool_requests: Callable, steps: int = 24) -> BudgetPlan:
    """The largest scale whose estimate fits ``budget_s`` (module docstring).

    ``estimate(scenario)`` -> a ``RunEstimate``; raises ``BudgetError`` when even the
    minimum does not fit."""
    all_knobs = knobs(scenario, pool_requests)

    def at(scale: float):
        values = {k: k.at(scale) for k in all_knobs}
        sized = apply(scenario, values)
        return sized, values, estimate(sized)

    sized, values, written = at(1.0)
    _, _, minimum = at(0.0)
    timeout = scenario.cell_timeout_s
    # a cell over its timeout even at the minimum can run at no size: it is left out
    # whatever the scale, so it costs the budget nothing (a search goes whole)
    never = {c.group for c in _over(minimum, timeout)}

    def runs_s(est) -> float:
        """What runs of ``est``: not the groups left out, nor a cell (or search) that
        would pass its timeout at this size (a bigger size may leave it out)."""
        over = {c.left_out_as for c in _over(est, timeout)}
        return est.seconds - sum(c.seconds for c in est.cells
                                 if c.group in never or c.left_out_as in over)

    dropped = _drop_optional(minimum, never, runs_s, budget_s)
    if runs_s(minimum) > budget_s:
        raise BudgetError(_refusal(budget_s, minimum, never, runs_s(minimum)))
    scale = 1.0
    if runs_s(written) > budget_s:
        lo, hi = 0.0, 1.0
        for _ in range(steps):
            mid = (lo + hi) / 2
            if runs_s(at(mid)[2]) <= budget_s:
                lo = mid
            else:
                hi = mid
        scale = lo
    sized, values, est = at(scale)
    left_out = _left_out(est, sized.cell_timeout_s, dropped, budget_s)
    cuts = tuple((k, v) for k, v in values.items() if v < k.written)
    return BudgetPlan(budget_s, written.seconds, runs_s(minimum),
                      est.without({cid for cid, _ in left_out}).seconds,
                      scale, cuts, left_out, sized)


def _drop_optional(minimum, never: set, runs_s: Callable, budget_s: float) -> dict:
    """While the minimum does not fit, leave out the scenario's ``optional`` entries, the
    costliest at its minimum first (adds their groups to ``never``); {entry: its minimum's
    seconds} of those left out."""
    dropped: dict = {}
    while runs_s(minimum) > budget_s:
        cost: dict = {}
        for c in minimum.cells:
            if c.optional is not None and c.group not in never:
                cost[c.optional] = cost.get(c.optional, 0.0) + c.seconds
        if not cost:
            break
        entry = max(cost, key=cost.get)
        dropped[entry] = cost[entry]
        never.update(c.group for c in minimum.cells if c.optional == entry)
    return dropped


def _over(est, timeout_s: float | None) -> list:
    """The cells of ``est`` whose estimate passes ``timeout_s``: they would be killed."""
    return [] if timeout_s is None else [c for c in est.cells if c.seconds > timeout_s]


def _left_out(est, timeout_s: float | None, dropped: dict,
              budget_s: float) -> tuple[tuple[str, str], ...]:
    """(id, reason) of each cell, or search, left out: an optional entry's (``dropped``,
    {entry: its minimum's seconds}), then each that would pass its timeout; a search that
    would lose a probe to it is left out whole, by its template's id."""
    out: dict[str, str] = {}
    for c in est.cells:
        if c.optional in dropped and c.left_out_as not in out:
            out[c.left_out_as] = (f"optional, and the minimum does not fit --budget "
                                  f"{fmt_duration(budget_s)} with it (its entry "
                                  f"{fmt_duration(dropped[c.optional])} at its minimum)")
    for c in sorted(_over(est, timeout_s), key=lambda c: -c.seconds):
        if c.left_out_as not in out:
            what = "a probe of its search" if c.search else "its cell"
            out[c.left_out_as] = (f"{what} estimated {c.seconds:.0f} s, over its "
                                  f"cell_timeout_s {timeout_s:g} s: it would be killed")
    return tuple(out.items())


def check_only(scenario: Scenario, budget_s: float, est) -> BudgetPlan:
    """The plan of a scenario run as written (``--no-sizing``): nothing cut."""
    return BudgetPlan(budget_s, est.seconds, None, est.seconds, 1.0, scenario=scenario)


def _refusal(budget_s: float, minimum, never: set, minimum_s: float) -> str:
    families = sorted(minimum.by_family(never).items(), key=lambda kv: -kv[1][1])
    costly = ", ".join(f"{f} ({n} cells, {fmt_duration(s)})" for f, (n, s) in families[:3])
    dropped = len({c.left_out_as for c in minimum.cells if c.group in never})
    left = (f" ({dropped} cell(s) or searches left out: optional, or over their "
            f"cell_timeout_s even at the minimum)" if dropped else "")
    return (f"--budget {fmt_duration(budget_s)} cannot hold the minimum of every configuration: "
            f"the minimum is estimated at {fmt_duration(minimum_s)} on this machine{left}. "
            f"Drop configurations or jobs, or mark them optional (most costly at their "
            f"minimum: {costly}), or "
            f"give --budget {fmt_duration(math.ceil(minimum_s / 60) * 60)} or more")


def replay(scenario: Scenario, stored: dict, estimate: Callable[[Scenario], object],
           pool_requests: Callable) -> BudgetPlan:
    """The plan a run was sized with (``BudgetPlan.to_dict``), applied again: a resumed
    run keeps its sizes and what it left out, whatever the machine's speed is now."""
    by_name = {(k.name, k.key): k for k in knobs(scenario, pool_requests)}
    values = {by_name[c["name"], c["key"]]: c["value"] for c in stored.get("cuts") or []
              if (c["name"], c["key"]) in by_name}
    sized = apply(scenario, values)
    left_out = tuple((x["cell_id"], x["reason"]) for x in stored.get("left_out") or [])
    est = estimate(sized).without({cid for cid, _ in left_out})
    return BudgetPlan(stored["budget_s"], stored["written_estimate_s"],
                      stored.get("minimum_estimate_s"), est.seconds, stored.get("scale", 1.0),
                      tuple(values.items()), left_out, sized)
