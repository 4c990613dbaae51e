"""The sweet spot: the best measured configuration on one objective under the SLA, an
accuracy budget and an optional KV memory budget.

    recommend(configs, Constraints(slo, max_accuracy_drop_pct=1.0), "throughput")

Every configuration is checked against every constraint (``ConstraintCheck``: measured,
limit, pass). Among those that pass all, the best on the objective wins:

    throughput  highest SLA capacity on the primary workload when it is swept over
                load levels (``loadcurve``; ties: more output tokens/s), else most
                output tokens/s on the primary workload
    memory      least peak resident KV bytes
    latency     least P99 time between tokens on the primary workload

Speed has noise: when the winner's interval on the objective overlaps a feasible
rival's (``objective_interval``), the margin is not separable and the simplest of those
configurations (fewest spec parts, ``noise.complexity``; bf16 is 0) is recommended
instead, with a note. A configuration whose tier or policy never acted on the primary
workload (``ConfigSummary.equal_to``) is ranked with its base's figures and behind it:
it is the same configuration there.

The *binding* constraint is the one that stopped a configuration better on the objective
than the winner: the best excluded configuration and what it fails. Runners-up are the
other feasible configurations with what each costs against the winner. With no feasible
configuration the answer says so and names the closest miss: the configuration whose
worst relative shortfall ``(measured - limit) / limit`` is the smallest. A constraint no
configuration has data for (an accuracy budget in a run without accuracy tasks) is
dropped with a note rather than failing everything. A reference layout (``all_global``,
``WindowLayout.reference_only``) is measured to show what the default saves and is
never a candidate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvmap.config import format_bytes
from kvmap.report.configs import ConfigSummary
from kvmap.report.constraints import ConstraintCheck, Constraints, check, fmt

OBJECTIVES = ("throughput", "memory", "latency")
_OBJECTIVE = {  # objective -> (attribute, higher is better, label)
    "throughput": ("throughput_tok_s", True, "throughput"),
    "memory": ("peak_kv_bytes", False, "peak KV"),
    "latency": ("tbt_p99_s", False, "P99 TBT"),
}


def check_objective(objective: str) -> str:
    """``objective`` if it is one of ``OBJECTIVES``; ValueError naming it otherwise (the
    CLI's wording: ``kvmap report``/``recommend``/``tune --objective``)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective={objective!r} is not one of {', '.join(OBJECTIVES)}")
    return objective


def higher_is_better(objective: str) -> bool:
    """Whether a larger figure wins on ``objective``."""
    return _OBJECTIVE[objective][1]


@dataclass(frozen=True)
class RunnerUp:
    name: str
    costs: str                # what choosing it instead of the winner costs


@dataclass(frozen=True)
class Recommendation:
    objective: str
    constraints: Constraints
    choice: str | None
    binding: str | None                           # explanation; None when nothing binds
    binding_constraints: tuple[str, ...]
    runners_up: tuple[RunnerUp, ...]
    checks: dict[str, list[ConstraintCheck]]      # config name -> [ConstraintCheck]
    closest_miss: str | None
    notes: tuple[str, ...]
    margin: str | None = None                     # the winner's margin is inside the noise
    accuracy: tuple[str, ...] = ()                # the winner's drops against zero
    by_capacity: bool = False                     # throughput ranked by SLA capacity
    leader: str | None = None                     # best on the objective, before the noise
    why: str | None = None                        # infeasible: which part of the step misses

    @property
    def feasible(self) -> bool:
        return self.choice is not None

    def lines(self) -> list[str]:
        """The answer in plain sentences, for the terminal and the report."""
        obj = _OBJECTIVE[self.objective][2]
        out = []
        if self.choice is not None:
            if self.by_capacity:
                obj = "SLA capacity (the highest load within the SLA)"
            out.append(f"Recommended: {self.choice} (objective: {self.objective}, "
                       f"best {obj} among the configurations that meet every constraint).")
            if self.margin:
                out.append(f"Within the noise: {self.margin}.")
            if self.binding:
                out.append(f"Binding constraint: {self.binding}")
            elif self.leader not in (None, self.choice):   # swapped within the noise
                out.append("No constraint binds.")
            else:
                out.append(f"No constraint binds: {self.choice} is the best on {obj} among "
                           "all measured configurations.")
            for r in self.runners_up:
                out.append(f"Runner-up {r.name}: {r.costs}.")
            out.extend(f"Accuracy of {self.choice} on {a}." for a in self.accuracy)
        else:
            out.append("No measured configuration meets the SLA and the budgets.")
            if self.closest_miss is not None:
                missed = [c.describe() for c in self.checks[self.closest_miss] if not c.ok]
                out.append(f"Closest miss: {self.closest_miss}, which misses "
                           + "; ".join(missed) + ".")
            if self.why:
                out.append(f"Why: {self.why}")
        out.extend(f"Note: {n}" for n in self.notes)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective, "feasible": self.feasible,
                "choice": self.choice, "binding": self.binding,
                "binding_constraints": list(self.binding_constraints),
                "runners_up": [{"name": r.name, "costs": r.costs} for r in self.runners_up],
                "closest_miss": self.closest_miss, "notes": list(self.notes),
                "margin": self.margin, "accuracy": list(self.accuracy),
                "by_capacity": self.by_capacity, "leader": self.leader, "why": self.why,
                "constraints": {"slo": self.constraints.slo,
                                "max_accuracy_drop_pct": self.constraints.max_accuracy_drop_pct,
                                "kv_budget_bytes": self.constraints.kv_budget_bytes},
                "checks": {name: [{"name": c.name, "label": c.label, "measured": c.measured,
                                   "limit": c.limit, "ok": c.ok} for c in checks]
                           for name, checks in self.checks.items()},
                "text": self.lines()}


def objective_value(config: ConfigSummary, objective: str, by_capacity: bool = False
                    ) -> float | None:
    """The figure ranked on (higher or lower is better as ``_OBJECTIVE`` says)."""
    if objective == "throughput" and by_capacity:
        return None if config.capacity is None else config.capacity.sort_value
    value: float | None = getattr(config, _OBJECTIVE[objective][0])
    return value


def objective_interval(config: ConfigSummary, objective: str,
                       by_capacity: bool = False) -> tuple[float, float] | None:
    """95% interval of the objective figure (None: none measured; peak KV is exact)."""
    if objective == "throughput" and by_capacity:
        cap = config.capacity
        if cap is None or cap.value is None:
            return None
        return cap.ci or (cap.value, cap.value)
    if objective == "throughput":
        return config.throughput_ci
    if objective == "latency":
        return config.tbt_p99_ci
    return None


def _objective_sort_key(config: ConfigSummary, objective: str, by_capacity: bool = False,
                        base: ConfigSummary | None = None) -> tuple[int, float, float, int]:
    """Best first; a configuration equal to its ``base`` sorts right behind it."""
    ref = base or config
    _, higher, _ = _OBJECTIVE[objective]
    value = objective_value(ref, objective, by_capacity)
    if value is None:
        return (1, 0.0, 0.0, int(base is not None))
    tie = ref.throughput_tok_s if by_capacity and objective == "throughput" else None
    tie = -(tie or 0.0)
    return (0, -value if higher else value, tie, int(base is not None))


def _overlaps(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _costs(other: ConfigSummary, winner: ConfigSummary, objective: str,
           by_capacity: bool = False) -> str:
    """What ``other`` costs against ``winner``, objective first."""
    parts = []
    if by_capacity and other.capacity is not None and winner.capacity is not None:
        parts.append(f"SLA capacity {other.capacity.describe()} vs "
                     f"{winner.capacity.describe()}")
    order = [objective] + [o for o in OBJECTIVES if o != objective]
    for obj in order:
        attr, _, label = _OBJECTIVE[obj]
        a, b = getattr(other, attr), getattr(winner, attr)
        if a is None or b is None:
            continue
        if obj == "throughput":
            parts.append(f"{_pct(a, b)} throughput ({a:.1f} vs {b:.1f} tok/s)")
        elif obj == "memory":
            sign = "+" if a >= b else "-"
            parts.append(f"{sign}{format_bytes(abs(a - b))} peak KV ({_pct(a, b)})")
        else:
            parts.append(f"P99 TBT {(a - b) * 1000:+.0f} ms")
    a, b = other.accuracy_drop_pct, winner.accuracy_drop_pct
    if a is not None and b is not None:
        parts.append(f"accuracy drop {a - b:+.2f} points ({a:.2f}% vs {b:.2f}%"
                     + ("; not separable: their intervals overlap" if a != b
                        and _overlaps(_worst_ci(other), _worst_ci(winner)) else "") + ")")
    return ", ".join(parts) if parts else "no comparable figures"


def _worst_ci(c: ConfigSummary) -> tuple[float, float] | None:
    """The interval of the task that gives ``accuracy_drop_pct`` (its worst drop)."""
    return c.worst_task.drop_ci if c.worst_task is not None else None


def _pct(a: float, b: float) -> str:
    return f"{100.0 * (a - b) / b:+.0f}%" if b else "n/a"


def _accuracy_lines(c: ConfigSummary) -> tuple[str, ...]:
    """Whether each of ``c``'s accuracy drops is distinguishable from zero."""
    out = []
    for t in c.tasks.values():
        if t.drop_pct is None or c.is_baseline:
            continue
        unit = "% perplexity" if t.kind == "ppl" else " points"
        sep = t.distinguishable
        verdict = ("no interval: too few samples to tell" if sep is None else
                   "distinguishable from zero" if sep else "not distinguishable from zero")
        ci = f" [{t.drop_ci[0]:+.2f}, {t.drop_ci[1]:+.2f}]" if t.drop_ci else ""
        neg = (f"; {t.negative.value:.0%} of samples right in the baseline are wrong here"
               if t.negative is not None and t.negative.value > 0 else "")
        out.append(f"{t.task}: drop {t.drop_pct:+.2f}{unit}{ci}, {verdict}{neg}")
    return tuple(out)


def _simplest_within_noise(winner: ConfigSummary, feasible: list[ConfigSummary],
                           objective: str, by_capacity: bool) -> tuple[ConfigSummary, str | None]:
    """The simplest feasible configuration whose objective interval overlaps the
    winner's, and a sentence when it is not the winner (or when a rival ties within
    the noise and the winner is already the simplest)."""
    mine = objective_interval(winner, objective, by_capacity)
    tied = [c for c in feasible if c is not winner and c.equal_to is None
            and c.model == winner.model        # a deployment picks among its model's
            and _overlaps(mine, objective_interval(c, objective, by_capacity))]
    if not tied:
        return winner, None
    label = "SLA capacity" if by_capacity and objective == "throughput" \
        else _OBJECTIVE[objective][2]
    pick = min([winner, *tied], key=lambda c: (c.complexity, feasible.index(c)))
    rivals = ", ".join(c.name for c in tied if c is not pick)
    if pick is winner:
        return winner, (f"{winner.name}'s margin on {label} over {rivals} lies inside the "
                        "95% intervals; it is also the simplest of them")
    return pick, (f"{winner.name} leads on {label}, but its margin over {pick.name} lies "
                  f"inside the 95% intervals: recommending the simpler {pick.name}")


def recommend(configs: list[ConfigSummary], constraints: Constraints,
              objective: str = "throughput", num_runners_up: int = 3) -> Recommendation:
    """The sweet spot among ``configs`` (see the module docstring)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    notes, dropped = [], set()
    usable = [c for c in configs if c.num_failed < c.num_cells or c.num_cells == 0]
    for c in configs:
        if c not in usable:
            notes.append(f"{c.name}: every cell failed; not considered")
    if any(not c.accuracy_na for c in usable):
        # a random-weight model (speed and memory only) is no deployment choice beside
        # models whose accuracy was measured
        for c in [c for c in usable if c.accuracy_na]:
            usable.remove(c)
            notes.append(f"{c.name}: random weights (accuracy n/a), speed and memory "
                         "only; not a candidate")
    for c in [c for c in usable if c.reference is not None]:
        usable.remove(c)
        notes.append(f"{c.name}: the {c.reference} layout is a reference measured beside "
                     "the deployable layouts (the hybrid saving's baseline); not a candidate")
    if constraints.max_accuracy_drop_pct is not None and not any(
            c.accuracy_drop_pct is not None for c in usable):
        dropped.add("accuracy_drop")
        notes.append("no configuration has an accuracy drop measured (no accuracy task "
                     "against the baseline in this run): the accuracy budget was not checked")
    for key in constraints.slo:
        if not any(c.measure(key) is not None for c in usable):
            notes.append(f"{key}: no workload measured it; every configuration fails it")
    by_capacity = objective == "throughput" and any(
        c.capacity is not None and c.capacity.status != "unmeasured" for c in usable)
    if any(c.capacity is not None and c.capacity.status != "unmeasured" for c in usable):
        dropped.add("goodput_miss")     # swept: the SLA capacity is the goodput answer
    bases = {c.name: next((b for b in usable if b.name == c.equal_to), None) for c in usable}
    for c in usable:
        if c.equal_to is not None:
            parts = " and ".join({"tiers": "its tier was never read",
                                  "policy": "its policy evicted nothing"}[p] for p in c.idle)
            notes.append(f"{c.name}: {parts} on {c.primary_workload}; it equals "
                         f"{c.equal_to} there and is not ranked above it")
    checks = {c.name: check(c, constraints, dropped) for c in usable}
    ranked = sorted(usable, key=lambda c: _objective_sort_key(c, objective, by_capacity,
                                                              bases[c.name]))
    feasible = [c for c in ranked if all(k.ok for k in checks[c.name])]
    if not feasible:
        closest = min(usable, key=lambda c: (max((k.shortfall for k in checks[c.name]),
                                                 default=0.0),
                                             _objective_sort_key(c, objective, by_capacity)),
                      default=None)
        return Recommendation(objective, constraints, None, None, (), (), checks,
                              closest.name if closest else None, tuple(notes),
                              why=why_missed(closest, checks[closest.name]) if closest
                              else None)
    leader = feasible[0]
    winner, margin = _simplest_within_noise(leader, feasible, objective, by_capacity)
    better = ranked[:ranked.index(leader)]
    binding: str | None = None
    names: tuple[str, ...] = ()
    if better:
        blocked = better[0]
        failed = [k for k in checks[blocked.name] if not k.ok]
        names = tuple(k.name for k in failed)
        label, shown = _objective_label(blocked, objective, by_capacity)
        binding = (" and ".join(k.label for k in failed) + f" -- {blocked.name} would "
                   f"give {label} {shown} but measures "
                   + "; ".join(f"{fmt(k.name, k.measured)}" for k in failed))
    runners = tuple(RunnerUp(c.name, _costs(c, winner, objective, by_capacity))
                    for c in feasible if c is not winner)[:num_runners_up]
    return Recommendation(objective, constraints, winner.name, binding, names, runners,
                          checks, None, tuple(notes), margin, _accuracy_lines(winner),
                          by_capacity, leader.name)


TAIL_RATIO = 3.0        # a P99 gap this many times the P50: the tail is a kind of step


def why_missed(config: ConfigSummary, checks: list[ConstraintCheck]) -> str | None:
    """Which part of the step breaks the SLA for the closest miss, from its own figures:
    a TBT P99 far above its P50 comes from the decode steps that also carry another
    request's prefill chunk (the step's token budget, ``max_num_batched_tokens``); a
    TBT P50 past the limit, from every decode step."""
    failed = {c.name for c in checks if not c.ok}
    tbt = next((k for k in failed if k.startswith("tbt")), None)
    p50, p99 = config.tbt_p50_s, config.tbt_p99_s
    if tbt is None or p50 is None or p99 is None:
        return None
    limit = next(c.limit for c in checks if c.name == tbt)
    if p50 > limit:
        return (f"every decode step is slow here: TBT P50 {p50 * 1000:.0f} ms is past the "
                f"{limit * 1000:.0f} ms limit on this machine")
    if p99 > TAIL_RATIO * p50:
        return (f"its TBT P99 ({p99 * 1000:.0f} ms) is {p99 / p50:.0f}x its P50 "
                f"({p50 * 1000:.0f} ms): the slow gaps are decode steps that also run "
                "another request's prefill chunk; a smaller step token budget "
                "(max_num_batched_tokens) or a looser TBT limit would meet it")
    return None


def _objective_label(c: ConfigSummary, objective: str, by_capacity: bool) -> tuple[str, str]:
    if by_capacity and objective == "throughput":
        return "SLA capacity", c.capacity.describe() if c.capacity else "not measured"
    attr, _, label = _OBJECTIVE[objective]
    return label, fmt(attr, getattr(c, attr))
