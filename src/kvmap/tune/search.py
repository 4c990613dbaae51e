"""The search: successive cells instead of a fixed grid.

1. The baseline (the model's dtype as codec, full cache): its workload cell and both task
   cells -- every accuracy delta is paired with it.
2. Family by family (``space.Family``; for ``memory`` the cheapest first, so a good
   incumbent comes early), the smallest budget whose accuracy meets the budget: the
   smallest accurate budget is the family's best point on memory and (more concurrency
   in the same pool, less attention) on speed. For ``memory`` by a scan from the
   smallest budget up, which is exact without assuming accuracy rises with the budget
   (on a few ppl samples it does not); else by bisection over the budgets (coarse to
   fine: the middle budget first, then the half that can still hold the answer), which
   does assume it.
3. Each probe is screened: the task on ``screen_samples`` samples first; a point whose
   drop is already above the budget there (its 95% interval, not a noisy point value)
   is rejected without its full task or workload cell. For ``memory`` the workload
   cell comes next: a point whose cells hold as much KV as the incumbent's peak is
   *dominated* (the report's peak is the max over a configuration's cells, so it cannot
   win), and so is every larger budget of its family -- no further cell.
4. The family's point gets its remaining cells (workload: SLA, throughput, peak KV).
5. With several ``max_num_seqs``, the best point is run at the others (workload only).

Every cell counts against ``--max-cells`` / ``--max-minutes`` (``executor``); when the
next one would pass them the search stops and recommends from what it measured. The
answer comes from ``kvmap.report.recommend`` over the summaries of the points tried --
the same rules ``kvmap report`` applies to the run directory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvmap.config import format_bytes
from kvmap.report.constraints import Constraints
from kvmap.report.recommend import Recommendation, recommend
from kvmap.tune.evaluate import Point, Verdict, better, renamed, summary_of, verdict
from kvmap.tune.executor import BudgetExhausted, Executor
from kvmap.tune.path import Step
from kvmap.tune.setup import CellBook, TuneSetup
from kvmap.tune.space import Family, TuneSpace

ACCURATE, INACCURATE, DOMINATED = "accurate", "inaccurate", "dominated"


def min_cells() -> int:
    """The baseline (workload, screen, task) and one candidate (the same three)."""
    return 6


def grid_cells(scenario, space: TuneSpace) -> int:
    """Cells of the exhaustive grid of the same space: every point's workload and task
    cell (no screens), and the workload at every other ``max_num_seqs``."""
    others = [n for n in space.max_num_seqs if n != scenario.engine.max_num_seqs]
    return len(scenario.kv) * (2 + len(others))


@dataclass
class TuneResult:
    steps: list[Step]
    recommendation: Recommendation
    verdicts: dict[Point, Verdict]
    num_cells: int
    stopped: str | None = None
    incumbent: Point | None = None
    status: dict[str, str] = field(default_factory=dict)


class Search:
    def __init__(self, setup: TuneSetup, space: TuneSpace, executor: Executor,
                 constraints: Constraints, objective: str):
        if executor.max_cells < min_cells():
            raise ValueError(f"--max-cells {executor.max_cells} is too small: the baseline "
                             f"and one candidate need {min_cells()} cells (workload, "
                             f"{setup.screen_task}, {setup.task} each)")
        self.setup, self.space, self.ex = setup, space, executor
        self.constraints, self.objective = constraints, objective
        self.book = CellBook(*(s for s, _ in executor.runs))
        self.baseline = Point(executor.scenario.models[0].dtype)
        if not [kv for kv in space.all_kv() if kv != self.baseline.kv]:
            raise ValueError(f"the tune space holds only the baseline {self.baseline.kv!r}:"
                             " nothing to search; add codecs or policies")
        self.jobs = (setup.screen_task, setup.task, self.book.workload)
        self.steps: list[Step] = []
        self.cells: dict[Point, list] = {}
        self.verdicts: dict[Point, Verdict] = {}
        self.status: dict[str, str] = {}
        self.incumbent: Point | None = None

    # ---- running and judging ---------------------------------------------------------
    def _run(self, point: Point, jobs: tuple[str, ...]) -> None:
        seqs = {self.book.workload: point.max_num_seqs}
        cells = [self.book.cell(point.kv, j, seqs.get(j)) for j in jobs]
        self.ex.run(cells)
        mine = self.cells.setdefault(point, [])
        mine += [c for c in cells if c not in mine]

    def _summary(self, point: Point, screen: bool = False):
        """The report's summary of ``point``: from its screen cells (``screen``) or from
        its other cells -- what the main run, and so ``kvmap report``, holds."""
        run = self.ex.run_data
        by_id = {c.cell_id: c for c in run.cells}

        def mine(p: Point, tasks_only: bool = False) -> list[dict]:
            return [by_id[c.cell_id] for c in self.cells.get(p, []) if c.cell_id in by_id
                    and (c.job == self.setup.screen_task) == screen
                    and (c.task is not None or not tasks_only)]
        return summary_of(mine(point), mine(self.baseline, True), run.rows_by_cell,
                          point.kv, self.constraints.slo, self.ex.scenario.seed)

    def _judge(self, point: Point, accuracy_only: bool) -> Verdict:
        skip = tuple(self.constraints.slo) if accuracy_only else ()
        return verdict(self._summary(point), self.constraints, self.objective, skip)

    def _step(self, point: Point, why: str, verdict_text: str, jobs) -> None:
        self.steps.append(Step(len(self.steps) + 1, self._label(point), why, verdict_text,
                               tuple(jobs), self.ex.num_cells))

    def _label(self, point: Point) -> str:
        return point.label(len(self.space.max_num_seqs) > 1)

    def _dominated(self, v: Verdict) -> bool:
        best = self.verdicts.get(self.incumbent) if self.incumbent else None
        return (self.objective == "memory" and best is not None and v.peak_kv_bytes
                is not None and best.peak_kv_bytes is not None
                and v.peak_kv_bytes >= best.peak_kv_bytes)

    def _dominated_text(self, v: Verdict) -> str:
        best = self.verdicts[self.incumbent]
        return (f"dominated: its cells so far hold {format_bytes(v.peak_kv_bytes)} peak "
                f"KV >= {format_bytes(best.peak_kv_bytes)} of {self._label(self.incumbent)}")

    # ---- the steps -------------------------------------------------------------------
    def _complete(self, point: Point, why: str, jobs: tuple[str, ...]) -> Verdict:
        self._run(point, jobs)
        v = self._judge(point, accuracy_only=False)
        self.verdicts[point] = v
        if v.ok and better(v, self.verdicts.get(self.incumbent), self.objective):
            self.incumbent = point
            text = f"feasible, new best ({self._objective_text(v)})"
        elif v.ok:
            text = f"feasible, not better ({self._objective_text(v)})"
        else:
            text = "fails: " + "; ".join(v.failed)
        self._step(point, why, text, jobs)
        return v

    def _objective_text(self, v: Verdict) -> str:
        if v.objective is None:
            return f"{self.objective} not measured"
        if self.objective == "memory":
            return f"peak KV {format_bytes(v.objective)}"
        if self.objective == "throughput":
            return f"{v.objective:.1f} tok/s"
        return f"P99 TBT {v.objective * 1000:.0f} ms"

    def _probe(self, point: Point, why: str) -> str:
        """Screen, (for memory) the workload, then the full task: ``ACCURATE``,
        ``INACCURATE`` or ``DOMINATED``, from the first stage that decides."""
        if point.kv in self.status:
            return self.status[point.kv]
        screen, task, workload = self.jobs
        stages = (screen, workload, task) if self.objective == "memory" else (screen, task)
        ran: list[str] = []
        state, text = ACCURATE, ""
        for job in stages:
            self._run(point, (job,))
            ran.append(job)
            state, text = self._after(point, job)
            if state != ACCURATE:
                break
        self.status[point.kv] = state
        self._step(point, why, text, tuple(ran))
        return state

    def _after(self, point: Point, job: str) -> tuple[str, str]:
        """What the cells of ``point`` so far decide, ``job`` the last one run."""
        screen = job == self.setup.screen_task
        summary = self._summary(point, screen)
        v = verdict(summary, self.constraints, self.objective, tuple(self.constraints.slo))
        if screen:
            rejected = self._screen_rejects(summary)
            if rejected:
                return INACCURATE, rejected
        elif job == self.setup.task and not v.ok:
            return INACCURATE, "rejected: " + "; ".join(v.failed)
        if self._dominated(v):
            return DOMINATED, self._dominated_text(v)
        drop = v.accuracy_drop_pct
        return ACCURATE, ("accurate" + (f" (drop {drop:.2f}%)" if drop is not None else "")
                          if job == self.setup.task else f"passes the {job} stage")

    def _screen_rejects(self, summary) -> str | None:
        """Why the screen rejects (None: it does not): the drop's 95% interval on the
        small sample lies above the budget (a single sample: its value does). A point
        estimate on a few samples is too noisy to reject on: one ppl sample showed an
        8.5% drop where four gave 0.8% (docs/tune.md)."""
        budget = self.constraints.max_accuracy_drop_pct
        result = summary.tasks.get(self.setup.screen_task)
        if budget is None:
            return None
        if result is None or result.drop_pct is None:
            return "rejected early: the screen measured no accuracy drop (cell failed?)"
        lower = result.drop_ci[0] if result.drop_ci else result.drop_pct
        if lower <= budget:
            return None
        return (f"rejected early on {self.setup.screen_samples} samples: drop "
                f"{result.drop_pct:.2f}%, its 95% interval starts at {lower:.2f}% > "
                f"the {budget:g}% budget")

    def _family(self, family: Family) -> None:
        """The family's smallest accurate budget, then its remaining cells: for memory a
        scan from the smallest budget up (exact without assuming accuracy grows with the
        budget; a dominated point ends it, since memory does grow), else bisection."""
        budgets, points = family.budgets, family.points()
        if points == [self.baseline.kv]:
            return
        if self.objective == "memory":
            for i, kv in enumerate(points):
                why = ("the codec on the full cache" if family.policy is None else
                       f"scan up {family.policy.name} budgets: {budgets[i]:g}")
                state = self._probe(Point(kv), why)
                if state != INACCURATE:
                    break
            found = i if state == ACCURATE else len(points)
        else:
            found = self._bisect(family)
        if found < len(points):
            why = ("accurate: its speed and memory" if family.policy is None else
                   f"the smallest accurate {family.policy.name} budget ({budgets[found]:g})")
            self._complete(Point(points[found]), why, self._missing(Point(points[found])))

    def _bisect(self, family: Family) -> int:
        """Index of the smallest accurate budget (len: none), by bisection: it assumes
        accuracy does not fall as the budget grows."""
        budgets, points = family.budgets, family.points()
        lo, hi = 0, len(points)             # the answer's index lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            why = ("the codec on the full cache" if family.policy is None else
                   f"bisection on {family.policy.name} budget in "
                   f"[{budgets[lo]:g}, {budgets[hi - 1]:g}]: {budgets[mid]:g}")
            if self._probe(Point(points[mid]), why) == INACCURATE:
                lo = mid + 1
            else:
                hi = mid
        return hi if hi < len(points) and self.status[points[hi]] == ACCURATE else len(points)

    def _missing(self, point: Point) -> tuple[str, ...]:
        done = {c.job for c in self.cells.get(point, [])}
        return tuple(j for j in self.jobs if j not in done)

    def _seqs(self) -> None:
        if self.incumbent is None:
            return
        default = self.ex.scenario.engine.max_num_seqs
        for n in [n for n in self.space.max_num_seqs if n != default]:
            point = Point(self.incumbent.kv, n)
            if point in self.verdicts:
                continue
            self.cells[point] = [c for c in self.cells[self.incumbent] if c.task is not None]
            self._complete(point, f"max_num_seqs={n} on the best configuration",
                           (self.book.workload,))

    def families(self) -> list[Family]:
        found = self.space.families()
        return sorted(found, key=Family.cost) if self.objective == "memory" else found

    def run(self) -> TuneResult:
        stopped = None
        try:
            self._complete(self.baseline, "baseline: the reference every accuracy delta is "
                           "paired with", self.jobs)
            for family in self.families():
                self._family(family)
            self._seqs()
        except BudgetExhausted as e:
            stopped = str(e)
        return TuneResult(self.steps, self.recommendation(), dict(self.verdicts),
                          self.ex.num_cells, stopped, self.incumbent, dict(self.status))

    def recommendation(self) -> Recommendation:
        """``kvmap.report.recommend`` over every point with a cell in the main run (the
        baseline first): what ``kvmap report`` judges there."""
        summaries = [renamed(self._summary(p), self._label(p)) for p in self.cells
                     if any(c.job != self.setup.screen_task for c in self.cells[p])]
        return recommend(summaries, self.constraints, self.objective)
