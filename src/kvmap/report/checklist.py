"""The pre-launch checklist: for each configuration, each item PASS / WARN / FAIL with the
measured figure and its threshold. An item the run did not measure is a WARN that says
so (nothing unmeasured passes).

    item                           PASS                 WARN                 FAIL
    peak KV memory vs budget       <= 80% of budget     <= budget            > budget
    accuracy drop, per task        <= max drop (and the interval's top too) <= max drop, top above   > max drop
    output stability               identical tokens     -                    any difference
    P99 latency within the SLA     every key met        -                    a key missed
    latency stable over lengths    long/short <= 1.5x   <= 3x                > 3x
    throughput at target latency   goodput >= 90%       >= 50%               < 50%   (of throughput)
    storage P99 read < decode step read P99 < 0.5 x TBT P50   < TBT P50      >= TBT P50
    tier errors                    none                 some, tiers served   errors, no tier hit
    operator launches per step     <= 1.2x baseline     <= 2x                > 2x
    output length vs the baseline  mean <= +10%         > +10% (or unmeasured)  -
    every part acted               tier read, policy evicted   a part never acted  -

Thresholds are module constants; docs/report.md explains each item.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvmap.config import format_bytes
from kvmap.report.configs import ConfigSummary
from kvmap.report.noise import parts
from kvmap.report.constraints import GOODPUT_FAIL_BELOW, Constraints, check, fmt

KV_HEADROOM = 0.20
LENGTH_RATIO_PASS, LENGTH_RATIO_WARN = 1.5, 3.0
GOODPUT_PASS, GOODPUT_WARN = 0.90, GOODPUT_FAIL_BELOW
OPS_RATIO_PASS, OPS_RATIO_WARN = 1.2, 2.0
STORAGE_PASS = 0.5
INFLATION_WARN_PCT = 10.0
STATUSES = ("PASS", "WARN", "FAIL")


@dataclass(frozen=True)
class CheckItem:
    item: str
    status: str               # PASS | WARN | FAIL
    measured: str
    threshold: str

    def to_dict(self) -> dict[str, str]:
        return {"item": self.item, "status": self.status, "measured": self.measured,
                "threshold": self.threshold}


def _grade(value: float, pass_at: float, warn_at: float) -> str:
    return "PASS" if value <= pass_at else "WARN" if value <= warn_at else "FAIL"


def kv_memory_item(c: ConfigSummary, budget_bytes: int | None) -> CheckItem:
    item = "peak KV memory with headroom under the budget"
    if budget_bytes is None or c.peak_kv_bytes is None:
        return CheckItem(item, "WARN", fmt("peak_kv_bytes", c.peak_kv_bytes),
                         "no budget given" if budget_bytes is None else "-")
    share = c.peak_kv_bytes / budget_bytes
    status = _grade(share, 1 - KV_HEADROOM, 1.0)
    return CheckItem(item, status, f"{format_bytes(c.peak_kv_bytes)} ({share:.0%} of budget)",
                     f"<= {1 - KV_HEADROOM:.0%} of {format_bytes(budget_bytes)} "
                     f"({KV_HEADROOM:.0%} headroom)")


def accuracy_items(c: ConfigSummary, max_drop_pct: float) -> list[CheckItem]:
    items = []
    for task in c.tasks.values():
        if task.kind == "generation":         # judged by its length (inflation_item)
            continue
        item = f"accuracy drop on {task.task}"
        unit = "perplexity rise" if task.kind == "ppl" else "accuracy points lost"
        threshold = f"<= {max_drop_pct:g}% ({unit})"
        if task.failed or task.drop_pct is None:
            why = "cell failed" if task.failed else "no baseline to compare with"
            items.append(CheckItem(item, "WARN", f"not measured ({why})", threshold))
            continue
        ci = (f" [{task.drop_ci[0]:.2f}, {task.drop_ci[1]:.2f}]"
              if task.drop_ci and task.drop_ci[0] != task.drop_ci[1] else "")
        if task.distinguishable is False:
            ci += ", not distinguishable from 0"
        if task.negative is not None and task.negative.value > 0:
            ci += f"; negative-sample rate {task.negative.value:.0%}"
        if task.drop_pct > max_drop_pct:
            status = "FAIL"
        elif task.drop_ci and task.drop_ci[1] > max_drop_pct:
            status = "WARN"                  # passes, but the interval reaches past it
        else:
            status = "PASS"
        items.append(CheckItem(item, status, f"{task.drop_pct:.2f}%{ci}", threshold))
    return items


def stability_item(c: ConfigSummary) -> CheckItem:
    item = "output stability (temperature 0, alone vs in a mixed batch)"
    s = c.probes.stability if c.probes else None
    threshold = "identical tokens"
    if not s:
        return CheckItem(item, "WARN", "not measured", threshold)
    if s.identical:
        return CheckItem(item, "PASS", f"identical ({s.num_tokens} tokens, {s.batch_size} "
                         "in the batch)", threshold)
    return CheckItem(item, "FAIL", f"differs from token {s.num_identical_prefix} of "
                     f"{s.num_tokens}", threshold)


def slo_item(c: ConfigSummary, slo: dict[str, float]) -> CheckItem:
    item = "P99 latency within the SLA"
    if not slo:
        return CheckItem(item, "WARN", "no SLA given", "-")
    checks = check(c, Constraints(slo=slo))
    measured = "; ".join(f"{k.label.split(' <=')[0]} {fmt(k.name, k.measured)}"
                         for k in checks)
    threshold = "; ".join(k.label for k in checks)
    return CheckItem(item, "PASS" if all(k.ok for k in checks) else "FAIL", measured,
                     threshold)


def length_stability_item(c: ConfigSummary) -> CheckItem:
    """Time per output token of the longer half of the requests (prompt + output tokens)
    against the shorter half, over all workloads of the configuration (P90 of each)."""
    item = "latency stable across request lengths"
    threshold = f"long/short TPOT P90 <= {LENGTH_RATIO_PASS:g}x"
    rows = [r for rs in c.rows.values() for r in rs
            if not r.get("failed") and r.get("tpot_s")]
    lengths = [(r.get("num_prompt_tokens") or 0) + (r.get("num_output_tokens") or 0)
               for r in rows]
    if len(set(lengths)) < 2:
        return CheckItem(item, "WARN", "not measured (all requests of one length)",
                         threshold)
    cut = float(np.median(lengths))
    short = [r["tpot_s"] for r, n in zip(rows, lengths) if n <= cut]
    long = [r["tpot_s"] for r, n in zip(rows, lengths) if n > cut]
    if not short or not long:
        return CheckItem(item, "WARN", "not measured (lengths too alike)", threshold)
    ratio = float(np.percentile(long, 90) / np.percentile(short, 90))
    return CheckItem(item, _grade(ratio, LENGTH_RATIO_PASS, LENGTH_RATIO_WARN),
                     f"{ratio:.2f}x (> {cut:.0f} tokens vs <= {cut:.0f})", threshold)


def goodput_item(c: ConfigSummary, slo: dict[str, float]) -> CheckItem:
    item = "throughput at the target latency"
    threshold = f"goodput >= {GOODPUT_PASS:.0%} of throughput"
    if not slo or c.throughput_tok_s is None or c.goodput_tok_s is None:
        return CheckItem(item, "WARN", "not measured" + ("" if slo else " (no SLA)"),
                         threshold)
    share = c.goodput_tok_s / c.throughput_tok_s if c.throughput_tok_s else 0.0
    status = "PASS" if share >= GOODPUT_PASS else "WARN" if share >= GOODPUT_WARN else "FAIL"
    return CheckItem(item, status, f"{c.goodput_tok_s:.1f} of {c.throughput_tok_s:.1f} "
                     f"tok/s ({share:.0%}) on {c.primary_workload}", threshold)


def storage_item(c: ConfigSummary) -> CheckItem | None:
    """None when no tier was used (the item does not apply)."""
    reads = [(tier, stats.read_p99_s) for tiers in c.tiers.values()
             for tier, stats in tiers.items() if stats.num_hits]
    found = [(t, v) for t, v in reads if v is not None and v == v]
    if not c.tiers:
        return None
    item = "storage P99 read latency below the per-token decode time"
    decode = c.tbt_p50_s
    threshold = "read P99 < TBT P50" + (f" ({fmt('tbt', decode)})" if decode else "")
    if not found or decode is None:
        return CheckItem(item, "WARN", "not measured (no tier read)", threshold)
    tier, worst = max(found, key=lambda tv: tv[1])
    ratio = worst / decode
    status = "PASS" if ratio < STORAGE_PASS else "WARN" if ratio < 1.0 else "FAIL"
    return CheckItem(item, status, f"{worst * 1e3:.2f} ms ({tier}; {ratio:.2f}x TBT P50)",
                     threshold)


def tier_errors_item(c: ConfigSummary) -> CheckItem | None:
    """Tier faults counted in the cells (``metrics.tier_errors``, else the per-tier
    ``errors``); None when no tier was used."""
    if not c.tiers:
        return None
    stats = [s for tiers in c.tiers.values() for s in tiers.values()]
    counted = [m.tier_errors for m in c.workloads.values() if m.tier_errors is not None]
    errors = sum(counted) if counted else sum(s.num_errors for s in stats)
    hits = sum(s.num_hits or 0 for s in stats)
    status = "PASS" if errors == 0 else "WARN" if hits > 0 else "FAIL"
    return CheckItem("tier errors (failed reads, writes, frames)", status,
                     f"{errors} errors, {hits} tier hits", "0 errors")


def _ops_per_step(c: ConfigSummary | None) -> float | None:
    ops = c.probes.decode_ops if c is not None and c.probes else None
    return ops.num_ops_per_step if ops else None


def ops_item(c: ConfigSummary, baseline: ConfigSummary | None) -> CheckItem:
    item = "operator launches per decode step vs the baseline"
    threshold = f"<= {OPS_RATIO_PASS:g}x baseline"
    mine, base = _ops_per_step(c), _ops_per_step(baseline)
    if mine is None:
        return CheckItem(item, "WARN", "not measured", threshold)
    if not base:
        return CheckItem(item, "WARN", f"{mine:.0f} ops (no baseline measured)", threshold)
    ratio = mine / base
    return CheckItem(item, _grade(ratio, OPS_RATIO_PASS, OPS_RATIO_WARN),
                     f"{mine:.0f} ops ({ratio:.2f}x baseline's {base:.0f})", threshold)


def inflation_item(c: ConfigSummary, run_has_lengths: bool) -> CheckItem:
    """Output-length inflation on the natural-stopping generation task: compression that
    makes the model ramble costs end-to-end latency that TPOT hides."""
    item = "output length vs the baseline (natural stopping)"
    threshold = f"mean output tokens <= +{INFLATION_WARN_PCT:g}% of the baseline's"
    inf = c.inflation
    if inf is None:
        why = ("this is the baseline" if c.is_baseline and run_has_lengths else
               "n/a (no accuracy cells for this model)" if c.accuracy_na else
               "not measured (no natural-stopping generation task)")
        return CheckItem(item, "PASS" if why.startswith("this is") else "WARN", why,
                         threshold)
    ci = f" [{inf.mean_ci[0]:+.1f}, {inf.mean_ci[1]:+.1f}]" if inf.mean_ci else ""
    e2e = f"; E2E {inf.e2e_pct:+.1f}%" if inf.e2e_pct is not None else ""
    measured = (f"mean {inf.mean_tokens:.1f} vs {inf.base_mean_tokens:.1f} tokens "
                f"({inf.mean_pct:+.1f}%{ci}), P90 {inf.p90_tokens:.0f} vs "
                f"{inf.base_p90_tokens:.0f}{e2e}")
    return CheckItem(item, "WARN" if inf.mean_pct > INFLATION_WARN_PCT else "PASS",
                     measured, threshold)


def acted_item(c: ConfigSummary) -> CheckItem | None:
    """None for a configuration with no tier and no policy (nothing that can idle)."""
    kinds = [k for k in ("tiers", "policy") if k in parts(c.kv)]
    if not kinds or c.primary_workload is None:
        return None
    item = "every part of the configuration acted"
    threshold = "a tier read, a policy evicted, on the primary workload"
    if c.idle:
        return CheckItem(item, "WARN", f"{' and '.join(c.idle)} never acted on "
                         f"{c.primary_workload}: equal to {c.equal_to} there", threshold)
    return CheckItem(item, "PASS", f"{' and '.join(kinds)} acted on {c.primary_workload}",
                     threshold)


def checklist(configs: list[ConfigSummary], constraints: Constraints,
              budget_bytes: int | None = None) -> dict[str, list[CheckItem]]:
    """Config name -> its items. ``budget_bytes``: the KV budget for the memory item when
    ``constraints`` gives none (e.g. the scenario's KV pool size)."""
    baseline = next((c for c in configs if c.is_baseline), None)
    budget = constraints.kv_budget_bytes or budget_bytes
    max_drop = (constraints.max_accuracy_drop_pct
                if constraints.max_accuracy_drop_pct is not None else 1.0)
    has_lengths = any(c.inflation is not None for c in configs)
    out = {}
    for c in configs:
        items = [kv_memory_item(c, budget), *accuracy_items(c, max_drop), stability_item(c),
                 slo_item(c, constraints.slo), length_stability_item(c),
                 goodput_item(c, constraints.slo)]
        storage = storage_item(c)
        if storage is not None:
            items.append(storage)
        tier_errors = tier_errors_item(c)
        if tier_errors is not None:
            items.append(tier_errors)
        items.append(ops_item(c, baseline))
        items.append(inflation_item(c, has_lengths))
        acted = acted_item(c)
        if acted is not None:
            items.append(acted)
        out[c.name] = items
    return out
