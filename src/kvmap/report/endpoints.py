"""Endpoints on the map: a server measured over HTTP is one more configuration, named by
its ``name (kv_label)``, whose accuracy baseline is the one its scenario chose.

An endpoint's cells carry ``metrics.endpoint`` (``kvmap.bench.endpoint_http``:
``name``, ``label``, ``kv_label``, ``baseline`` ...) and its name as their ``kv``. Its
baseline for a task: the cell of that task of the endpoint named by ``baseline``, else
kvmap's own cell of the KV spec it names -- by default the model's dtype -- on dense
weights, preferring the same model name. Both figures use the same definition: an
endpoint runs ``prompt_ppl`` (``ppl_definition: prompt_logprobs``), never ``ppl``.

KL and top-1 of a ``prompt_ppl`` cell (an endpoint's or kvmap's own) against that
baseline are computed here from both cells' stored top-k (``details.per_sample[*]
.top_logprobs``) by the task's own function (``kvmap.evals.topk.topk_comparison``), and
shown as "over the returned top-k": the mass outside the baseline's top-k is not seen.
A server that returns no prompt log-probabilities (llama-server) has no such cell, so
no KL; one that returns them without a top-k has a perplexity but no KL.

A ``generation`` cell (fixed-length greedy output) against its baseline: exact match,
first divergence and token agreement from both cells' stored ``output_ids``
(``kvmap.evals.generation.record_agreement``), so a server's outputs are compared with
its baseline's as kvmap's own are.
"""
from __future__ import annotations

from typing import Any

from kvmap.runs.cell_payloads import EndpointInfo
from kvmap.runs.record import CellRecord
from kvmap.evals.generation import record_agreement
from kvmap.evals.stats import wilson_interval
from kvmap.evals.topk import topk_comparison


def endpoint_of(cells: list[CellRecord]) -> EndpointInfo | None:
    """The ``metrics.endpoint`` of the first of ``cells`` that has one."""
    return next((e for c in cells if (e := c.endpoint) is not None), None)


def endpoint_baseline(cell: CellRecord, endpoint: EndpointInfo, cells: list[CellRecord]
                      ) -> CellRecord | None:
    """The baseline cell of an endpoint's task cell (module docstring); None if none ran."""
    wanted = endpoint.baseline
    same_task = [c for c in cells if c.task == cell.task and c is not cell]
    names = {c.endpoint.name for c in same_task if c.endpoint}
    if wanted is not None and wanted in names:
        return next(c for c in same_task if c.endpoint and c.endpoint.name == wanted)
    own = [c for c in same_task if c.endpoint is None and c.quantization is None
           and c.kv == (wanted or c.dtype)]
    own.sort(key=lambda c: c.model != cell.model)
    return own[0] if own else None


def memory_note(cells: list[CellRecord]) -> str | None:
    """Why an endpoint has no memory coordinate (its cells' ``kv_memory_note``)."""
    return next((str(note) for c in cells if (note := c.metric("kv_memory_note"))), None)


def _records(cell: CellRecord) -> list[Any]:
    return cell.per_sample


def topk_figures(cell: CellRecord, baseline: CellRecord | None, seed: int = 0
                 ) -> dict[str, Any] | None:
    """``kl_topk``, ``top1_topk`` with their ``*_ci95`` ... of ``cell`` against
    ``baseline`` (module docstring); None without a baseline or a top-k on both sides."""
    if baseline is None or baseline is cell or baseline.status != "ok":
        return None
    return topk_comparison(_records(cell), _records(baseline), seed)


def output_agreement(cell: CellRecord, baseline: CellRecord | None, seed: int = 0
                     ) -> dict[str, Any] | None:
    """A generation cell's agreement with its baseline's outputs (module docstring), with
    ``exact_match_ci95`` (Wilson); None without output ids on both sides."""
    if baseline is None or baseline is cell or baseline.status != "ok":
        return None
    out = record_agreement(_records(cell), _records(baseline), seed)
    if out is not None:
        n = out["num_samples"]
        out["exact_match_ci95"] = wilson_interval(round(out["exact_match"] * n), n)
    return out


def agreement_text(figures: dict[str, Any]) -> str:
    ci = figures["exact_match_ci95"]
    return (f"exact match {100 * figures['exact_match']:.0f}% [{100 * ci[0]:.0f}, "
            f"{100 * ci[1]:.0f}] (n={figures['num_samples']}), first divergence mean "
            f"{figures['first_divergence_mean']:.1f}, token agreement "
            f"{100 * figures['token_agreement']:.1f}%")


def topk_text(figures: dict[str, Any]) -> str:
    """``KL 1.2e-03 [..], top-1 98.0% [..] over the returned top-5`` for a table cell."""
    kl, top1 = figures["kl_topk_ci95"], figures["top1_topk_ci95"]
    return (f"KL {figures['kl_topk']:.2e} [{kl[0]:.2e}, {kl[1]:.2e}], top-1 "
            f"{100 * figures['top1_topk']:.1f}% [{100 * top1[0]:.1f}, {100 * top1[1]:.1f}] "
            f"over the returned top-{figures['num_top_logprobs']}")
