"""Can the loadgen client be trusted? ``kvmap loadgen``'s asyncio client against a plain
stdlib client (threads + ``http.client``, ``kvmap.loadgen.reference``) on one server.

    python benchmarks/loadgen_vs_stdlib.py [--rounds 3] [--model dummy:tiny]

Starts ``kvmap serve`` (the embedded model, bf16, unless ``--model``) on loopback, sends
one unrecorded warm-up request, then runs both clients alternately (``--rounds`` times
each, the first client swapping every round): the same requests in the same order,
closed loop at ``--concurrency`` (4), ``--num-requests`` (16) of ``--output-tokens`` (64).
Every run's prompts carry their own tag at the start, so no run gains from another's
prefix cache; the lengths are the same for all. Both clients' results go through the
same ``load_metrics``, so only the transport differs. Prints a table of medians and the
ratios (loadgen / stdlib), and writes a JSON record under ``benchmarks/results/`` with
every run, the client CPU time and the load average.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402
from serve_load import Server  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from kvmap.loadgen import prompts  # noqa: E402
from kvmap.loadgen.client import Endpoint, RawResult, send_request  # noqa: E402
from kvmap.loadgen.reference import connect, run_reference, send_one  # noqa: E402
from kvmap.loadgen.results import load_metrics  # noqa: E402
from kvmap.loadgen.runner import LoadRun, open_session, run_plan  # noqa: E402
from kvmap.loadgen.schedule import Level, make_plan  # noqa: E402

CLIENTS = ("loadgen", "stdlib")
FIGURES = ("output_tokens_per_s", "ttft_p50_s", "e2e_p50_s", "tbt_p50_s",
           "client_cpu_s", "client_cpu_share", "first_sends_spread_s", "wave_spread_s")


def tagged(requests, tag: str):
    return [replace(r, prompt=f"[{tag}] {r.prompt}") for r in requests]


async def _loadgen(endpoint: Endpoint, requests, concurrency: int, warmup) -> LoadRun:
    """As ``kvmap loadgen`` does it: one warm-up request, then the level, one session."""
    async with open_session(endpoint) as session:
        await send_request(session, endpoint, warmup, RawResult(warmup.request_id))
        plan = make_plan(requests, Level(concurrency=concurrency))
        return await run_plan(endpoint, plan, session=session)


def run_client(client: str, endpoint: Endpoint, requests, concurrency: int,
               warmup) -> LoadRun:
    """One closed-loop run of ``client``; each sends ``warmup`` first, unrecorded."""
    if client == "loadgen":
        return asyncio.run(_loadgen(endpoint, requests, concurrency, warmup))
    return run_reference(endpoint, requests, concurrency, warmup=warmup)


def _wave_spread_s(sends: list[float], concurrency: int) -> float | None:
    """The median, over waves of ``concurrency`` consecutive sends, of how far apart a
    wave's sends were: how tight a burst the server got each time the slots refilled."""
    waves = [sends[i:i + concurrency] for i in range(0, len(sends), concurrency)]
    spreads = [w[-1] - w[0] for w in waves if len(w) == concurrency]
    return statistics.median(spreads) if spreads else None


def figures(run: LoadRun, concurrency: int) -> dict:
    m = load_metrics(run.sent, run.t0_s, run.duration_s)
    sends = sorted(s.result.sent_s for s in run.sent if s.result.sent_s is not None)
    first = sends[:concurrency]
    return {"output_tokens_per_s": m["output_tokens_per_s"],
            "ttft_p50_s": (m["ttft_s"] or {}).get("p50"),
            "e2e_p50_s": (m["e2e_s"] or {}).get("p50"),
            "tbt_p50_s": (m["tbt_s"] or {}).get("p50"),
            "duration_s": run.duration_s, "num_completed": m["num_completed"],
            "num_failed": m["num_failed"], "num_output_tokens": m["num_output_tokens"],
            "client_cpu_s": run.client_cpu_s, "client_cpu_share": run.client_cpu_share,
            "first_send_after_s": first[0] - run.t0_s if first else None,
            "first_sends_spread_s": first[-1] - first[0] if first else None,
            "wave_spread_s": _wave_spread_s(sends, concurrency),
            "load_avg_1m": os.getloadavg()[0]}


def _paired(runs: list[dict], k: int, figure: str) -> float | None:
    """Round ``k``'s loadgen / stdlib ratio of ``figure`` (the two ran back to back)."""
    a, b = (next(r[figure] for r in runs if r["round"] == k and r["client"] == c)
            for c in CLIENTS)
    return a / b if a is not None and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None, help="kvmap serve --model (default: embedded)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    console = Console()
    tokenizer = prompts.load_tokenizer("bytes" if (args.model or "").startswith("dummy:")
                                       else "smollm2")
    spec = prompts.workload_spec("throughput", None, prompt_tokens=args.prompt_tokens,
                                 output_tokens=args.output_tokens)
    base = prompts.build(spec, tokenizer, args.num_requests)
    server_args = ("--dtype", "bf16") + (("--model", args.model) if args.model else ())
    load_start = os.getloadavg()
    runs: list[dict] = []
    with Server(*server_args) as server:
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        endpoint = Endpoint(server.url, model, request_timeout_s=600.0)
        send_one(connect(endpoint), endpoint, replace(tagged(base, "server-warmup")[0],
                                                        request_id="warmup"))
        for k in range(args.rounds):
            order = CLIENTS if k % 2 == 0 else CLIENTS[::-1]
            for client in order:
                reqs = tagged(base, f"{k}-{client}")
                run = run_client(client, endpoint, reqs, args.concurrency,
                                 replace(reqs[-1], request_id="warmup"))
                fig = figures(run, args.concurrency)
                runs.append({"round": k, "client": client, **fig})
                console.print(f"round {k} {client}: {fig['output_tokens_per_s']:.1f} tok/s, "
                              f"TTFT p50 {fig['ttft_p50_s'] * 1000:.0f} ms, "
                              f"cpu {fig['client_cpu_s']:.2f} s, load {fig['load_avg_1m']:.2f}")
    medians = {c: {f: statistics.median(r[f] for r in runs if r["client"] == c)
                   for f in FIGURES} for c in CLIENTS}
    ratios = {f: medians["loadgen"][f] / medians["stdlib"][f]
              for f in FIGURES if medians["stdlib"][f]}
    paired = {f: statistics.median(_paired(runs, k, f) for k in range(args.rounds))
              for f in FIGURES if all(_paired(runs, k, f) is not None
                                      for k in range(args.rounds))}
    table = Table(title=f"loadgen vs stdlib, medians of {args.rounds} runs each "
                        f"(concurrency {args.concurrency}, {args.num_requests} x "
                        f"{args.prompt_tokens} in / {args.output_tokens} out)")
    for column in ("figure", *CLIENTS, "loadgen/stdlib", "paired median"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for f in FIGURES:
        table.add_row(f, *(f"{medians[c][f]:.4g}" for c in CLIENTS),
                      f"{ratios[f]:.3f}" if f in ratios else "-",
                      f"{paired[f]:.3f}" if f in paired else "-")
    console.print(table)
    config = {**vars(args), "model_id": model, "server_args": list(server_args),
              "max_tokens_per_request": [r.max_tokens for r in base]}
    path = write_record("loadgen_vs_stdlib", config,
                        {"medians": medians, "ratios": ratios, "paired_ratio_medians": paired,
                         "runs": runs,
                         "load_avg_start": load_start, "load_avg_end": os.getloadavg()})
    console.print(f"record: {path}")


if __name__ == "__main__":
    main()
