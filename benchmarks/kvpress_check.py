"""kvmap's selection policies against kvpress's presses on the same model, the same passkey
prompts and the same budget (x86-amx record names its class and dtype).

kvmap side: the embedded SmolLM2-135M (its GGUF, bf16 weights and bf16 KV), the passkey
grid (``kvmap.evals.passkey``) through ``run_passkey`` for bf16 (full cache) and each
policy at ``budget=B`` (the fraction of the prompt's tokens kept; prefill in one chunk,
so every policy compresses the whole prompt, question included).
kvpress side (``benchmarks/kvpress_peer.py`` in kvpress's venv, ``scripts/kvpress.sh``):
the same GGUF through HF transformers at bf16, the same prompts (kvmap writes them), each
press at ``compression_ratio = 1 - B``, in two modes -- ``blind`` (kvpress's own: the
context compressed without the question) and ``window`` (the whole prompt compressed, as
kvmap does). The pairs: snapkv / SnapKVPress (window 32, kernel 11 on both),
streaming_llm(sinks=4) / StreamingLLMPress(n_sink=4), knorm / KnormPress, tova /
TOVAPress, h2o / ObservedAttentionPress (kvpress's H2O-like press; ``KEEPS`` says what
each side keeps, and the record carries it with every row).

A pair agrees when kvmap's accuracy lies in the Wilson 95% interval of kvpress's in
``window`` mode and the other way round. The record keeps every answer.

    PYTHONPATH=src .venv/bin/python benchmarks/kvpress_check.py [--budget 0.25]
        [--contexts 1024] [--depths 0.1 0.5 0.9] [--samples 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import write_record  # noqa: E402

from kvmap import LLM  # noqa: E402
from kvmap.evals.passkey import contains_key, make_cases, run_passkey  # noqa: E402
from kvmap.evals.stats import wilson_interval  # noqa: E402
from kvmap.model.loader import embedded_model_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAIRS = {"snapkv": "snapkv(budget={b},window=32,kernel=11)",
         "streaming_llm": "streaming_llm(sinks=4,budget={b})",
         "knorm": "knorm(budget={b})", "tova": "tova(budget={b})", "h2o": "h2o(budget={b})"}
# What each side keeps at the same budget (read from kvmap.kv.policies and kvpress 0.5.5's
# presses): the granularity (per layer, per KV head) and what ranks the tokens. Both
# sides keep the same number of tokens in every layer and head; kvpress compresses the
# prompt once, kvmap also again during decoding each time a sequence grows a block past
# its budget (after 16 of the 24 new tokens at most: past the 5-digit answer).
KEEPS = {
    "snapkv": {"kvmap": "per layer and KV head: attention of the last 32 prompt queries, "
                        "summed over the head's query heads, avg-pooled (kernel 11); the "
                        "32 window tokens always kept",
               "kvpress": "SnapKVPress: the same per layer and KV head (attention of the "
                          "last 32 queries, averaged over the group's query heads, "
                          "avg-pooled, kernel 11), window kept"},
    "streaming_llm": {"kvmap": "4 sinks + the most recent tokens, the same in every layer "
                               "and head",
                      "kvpress": "StreamingLLMPress(n_sink=4): the same"},
    "knorm": {"kvmap": "per layer and KV head: the keys of smallest L2 norm; no forced "
                       "sinks or recent tokens",
              "kvpress": "KnormPress: the same (score -||k|| per layer and KV head)"},
    "tova": {"kvmap": "per layer, one set for all heads: attention of the newest query "
                      "(the prompt's last token), averaged over all query heads",
             "kvpress": "TOVAPress: the same, plus the last token itself kept (scored "
                        "with the maximum)"},
    "h2o": {"kvmap": "per layer and KV head: half the budget the most recent tokens, the "
                     "other half the largest attention *summed* over every prompt query "
                     "(H2O's heavy hitters + recent window)",
            "kvpress": "ObservedAttentionPress (kvpress 0.5.5 has no press named H2O; "
                       "this is its H2O-like one): per layer and KV head, attention "
                       "*averaged* over the queries that see each key (sum / number of "
                       "later queries), no recent window"},
}


def kvmap_side(args, specs: dict[str, str], start_peer) -> tuple[list, dict, object]:
    """The passkey cases, kvmap's per-sample correctness per policy name, and what
    ``start_peer(cases)`` returned (called once the cases exist, so kvpress runs while
    kvmap does: the two halves are independent)."""
    out, cases, peer = {}, None, None
    for name, spec in specs.items():
        llm = LLM(dtype="bf16", kv=spec, kv_memory=args.kv_memory, device="cpu",
                  max_num_batched_tokens=max(args.contexts) + 256)
        if cases is None:
            cases = make_cases(llm.tokenizer, args.contexts, args.depths, args.samples,
                               args.seed)
            peer = start_peer(cases)
        result = run_passkey(llm, args.contexts, args.depths, args.samples, args.seed)
        by_id = {s["sample_id"]: bool(s["correct"]) for s in result["samples"]}
        out[name] = [by_id[c.sample_id] for c in cases]
        print(f"kvmap   {spec:42s} {sum(out[name])}/{len(out[name])}", flush=True)
    return cases, out, peer


def start_kvpress(args, cases, names: list[str], tmp: Path) -> tuple:
    """``kvpress_peer.py`` in kvpress's venv on ``cases``, started, not awaited."""
    if not Path(args.kvpress_python).exists():
        raise SystemExit(f"kvpress is not installed at {args.kvpress_python}: run "
                         "scripts/kvpress.sh (kvpress 0.5.5 needs transformers < 5.3, "
                         "so it lives in a venv of its own)")
    cases_path, out_path = tmp / "cases.json", tmp / "out.json"
    cases_path.write_text(json.dumps([{"sample_id": c.sample_id, "prompt": c.prompt,
                                       "key": c.key} for c in cases]))
    process = subprocess.Popen(
        [args.kvpress_python, str(ROOT / "benchmarks" / "kvpress_peer.py"),
         str(cases_path), str(out_path), "--gguf", str(embedded_model_path()),
         "--ratio", f"{1 - args.budget:g}", "--presses", ",".join(names),
         "--modes", args.modes])
    return process, out_path


def kvpress_answers(started: tuple) -> dict:
    process, out_path = started
    if process.wait() != 0:
        raise SystemExit(f"kvpress_peer.py exited with code {process.returncode}")
    return json.loads(out_path.read_text())


def accuracy(correct: list[bool]) -> dict:
    k, n = sum(correct), len(correct)
    return {"accuracy": k / n, "ci95": wilson_interval(k, n), "n": n}


def compare(cases, kvmap_correct: dict, peer: dict) -> list[dict]:
    rows = []
    for name, correct in kvmap_correct.items():
        row = {"policy": name, "kvmap": accuracy(correct), "keeps": KEEPS.get(name)}
        for mode, answers in peer["answers"].get(name, {}).items():
            row[f"kvpress_{mode}"] = accuracy([contains_key(a, c.key)
                                               for a, c in zip(answers, cases)])
            row[f"kvpress_{mode}_answers"] = answers
        if "kvpress_window" in row or "kvpress_blind" in row:
            other = row.get("kvpress_window", row.get("kvpress_blind"))
            mine = row["kvmap"]
            row["agree"] = (other["ci95"][0] <= mine["accuracy"] <= other["ci95"][1]
                            and mine["ci95"][0] <= other["accuracy"] <= mine["ci95"][1])
        rows.append(row)
    return rows


def fmt(acc: dict | None) -> str:
    if acc is None:
        return "-"
    return f"{acc['accuracy']:.2f} [{acc['ci95'][0]:.2f}, {acc['ci95'][1]:.2f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=0.25, help="fraction of tokens kept")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024])
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-memory", default="256MiB")
    p.add_argument("--policies", default=",".join(PAIRS), help=", ".join(PAIRS))
    p.add_argument("--modes", default="blind,window", help="kvpress modes: blind, window")
    p.add_argument("--kvpress-python", default=str(ROOT / ".venv-kvpress/bin/python"))
    args = p.parse_args()
    if not 0.0 < args.budget < 1.0:
        raise SystemExit(f"--budget={args.budget!r} must be in (0, 1)")
    names = args.policies.split(",")
    unknown = [n for n in names if n not in PAIRS]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; valid: {', '.join(PAIRS)}")
    started, load_start = time.perf_counter(), os.getloadavg()
    specs = {"none": "bf16", **{n: PAIRS[n].format(b=f"{args.budget:g}") for n in names}}
    with tempfile.TemporaryDirectory() as tmp:
        cases, kvmap_correct, started_peer = kvmap_side(
            args, specs, lambda c: start_kvpress(args, c, ["none", *names], Path(tmp)))
        peer = kvpress_answers(started_peer)
    rows = compare(cases, kvmap_correct, peer)
    print(f"\npasskey, SmolLM2-135M bf16, budget {args.budget:g} of the prompt "
          f"({len(cases)} prompts; accuracy [Wilson 95%])")
    print(f"{'policy':14s} {'kvmap':20s} {'kvpress window':20s} {'kvpress blind':20s} agree")
    for r in rows:
        print(f"{r['policy']:14s} {fmt(r['kvmap']):20s} {fmt(r.get('kvpress_window')):20s} "
              f"{fmt(r.get('kvpress_blind')):20s} {r.get('agree', '-')}")
    for r in rows:
        if r["keeps"]:
            print(f"\n{r['policy']}: kvmap keeps {r['keeps']['kvmap']};\n"
                  f"  kvpress keeps {r['keeps']['kvpress']}")
    path = write_record("kvpress_check", {
        "budget": args.budget, "contexts": args.contexts, "depths": args.depths,
        "samples": args.samples, "seed": args.seed, "kvmap_specs": specs,
        "kvpress": {k: peer[k] for k in ("kvpress", "transformers", "ratio", "snapkv")},
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF, dense bf16 weights on both sides",
        "dtype": "bf16"}, {"rows": rows, "sample_ids": [c.sample_id for c in cases],
                           "wall_s": time.perf_counter() - started,
                           "load_avg_start": load_start, "load_avg_end": os.getloadavg()})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
