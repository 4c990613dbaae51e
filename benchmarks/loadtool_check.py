"""An independent load tool against ``kvmap serve``: ``kvmap loadgen`` and aiperf at the
same load, on the same prompts, and their TTFT / TBT / TPOT percentiles and output
tokens/s side by side (class and dtype in the record).

    PYTHONPATH=src .venv/bin/python benchmarks/loadtool_check.py
        [--levels c1,c4 | r0.5,...] [--num-requests 24] [--prompt-tokens 128]
        [--output-tokens 64] [--rounds 1] [--omp-wait-policy default|PASSIVE]
        [--server-threads N]
        [--aiperf .venv-loadtool/bin/aiperf]

``kvmap serve`` runs the embedded SmolLM2-135M at bf16 in a child process on loopback
(``serve_load.Server``). The requests are loadgen's ``throughput`` workload with fixed
lengths (``--prompt-tokens`` in, ``--output-tokens`` out, ``ignore_eos``, temperature 0,
streamed completions); the tool gets the same prompt texts as a ``single_turn`` custom
dataset (``benchmarks/aiperf_peer.py``), with the same ``max_tokens`` and
``ignore_eos``. Each arm's prompts carry their own tag at the start, so no arm is served
from another's prefix cache. A level is ``cN`` (closed loop, N in flight) or ``rR``
(open loop, Poisson at R requests/s; each tool draws its own arrival times).

Per level and round the two arms run one after the other (loadgen first in even rounds,
the tool first in odd ones), each after one unrecorded warm-up request. The loadgen arm
is ``kvmap loadgen``'s own path (``sweep.warm_up`` + ``level.measure_level``); the tool
arm is the ``aiperf profile`` command, read back from its exports.
``benchmarks/loadtool_compare.py`` says which figure pairs with which, and why.

The server's ``OMP_WAIT_POLICY`` is unset by default, as a user runs ``kvmap serve``.
Under ``PASSIVE`` its torch threads sleep at every barrier, and a decode step then costs
more when the CPUs idle between steps -- as they do beside loadgen's one process, and do
not beside aiperf's busy ones: the tools disagree because the server ran at two speeds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402
from serve_load import Server  # noqa: E402
import aiperf_peer  # noqa: E402
import loadtool_compare as cmp  # noqa: E402

from kvmap.loadgen import prompts  # noqa: E402
from kvmap.loadgen.client import Endpoint  # noqa: E402
from kvmap.loadgen.level import measure_level  # noqa: E402
from kvmap.loadgen.results import load_metrics  # noqa: E402
from kvmap.loadgen.runner import open_session  # noqa: E402
from kvmap.loadgen.schedule import Level, make_plan  # noqa: E402
from kvmap.loadgen.sweep import warm_up  # noqa: E402
from kvmap.workloads.lengths import Fixed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def parse_level(text: str) -> Level:
    """``c4`` -> closed loop of 4; ``r0.5`` -> Poisson at 0.5 requests/s."""
    try:
        if text.startswith("c"):
            return Level(concurrency=int(text[1:]))
        if text.startswith("r"):
            return Level(rate_per_s=float(text[1:]))
    except ValueError as e:
        raise ValueError(f"level {text!r}: {e}") from None
    raise ValueError(f"level {text!r} must be cN (closed loop) or rR (requests/s)")


def build_requests(num_requests: int, prompt_tokens: int, output_tokens: int, seed: int):
    """Loadgen's ``throughput`` requests with fixed prompt and output lengths."""
    spec = prompts.workload_spec("throughput", None, seed=seed)
    spec = replace(spec, num_requests=num_requests, prompt_len=Fixed(prompt_tokens),
                   output_len=Fixed(output_tokens))
    return prompts.build(spec, prompts.load_tokenizer("smollm2"), None)


def tagged(requests, tag: str):
    return [replace(r, prompt=f"[{tag}] {r.prompt}") for r in requests]


async def _loadgen(endpoint: Endpoint, requests, level: Level) -> dict:
    async with open_session(endpoint) as session:
        await warm_up(session, endpoint, replace(requests[-1], request_id="warmup"), 1)
        measured = await measure_level(session, endpoint, make_plan(requests, level),
                                       level)
    run = measured.run
    return {**cmp.loadgen_figures(load_metrics(run.sent, run.t0_s, run.duration_s)),
            "duration_s": run.duration_s, "client_cpu_s": run.client_cpu_s}


def run_loadgen(endpoint: Endpoint, requests, level: Level) -> dict:
    return asyncio.run(_loadgen(endpoint, requests, level))


def run_round(args, endpoint: Endpoint, base, level: Level, k: int, tokenizer_dir: Path,
              work: Path) -> dict:
    """Both arms at ``level`` (order by round parity); the figures and their comparison."""
    out: dict = {}
    order = ("loadgen", "aiperf") if k % 2 == 0 else ("aiperf", "loadgen")
    for arm in order:
        reqs = tagged(base, f"{level.name}-{k}-{arm}")
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        if arm == "loadgen":
            out[arm] = run_loadgen(endpoint, reqs, level)
        else:
            out[arm] = aiperf_peer.run(args.aiperf, endpoint, reqs, level, tokenizer_dir,
                                       work / f"{level.name}-{k}", seed=args.seed + k)
        out[arm].update(wall_s=time.perf_counter() - t0, load_avg_1m=load)
        print(f"{level.name} round {k} {arm:7s} {out[arm]['output_tokens_per_s'] or 0:7.1f} "
              f"tok/s  TTFT p50 {(out[arm]['ttft_p50_s'] or 0) * 1e3:7.1f} ms  "
              f"load {load:.2f}  client CPU {out[arm].get('client_cpu_s') or 0:.1f} s",
              flush=True)
    return {"level": level.name, "round": k, "order": list(order), **out,
            "rows": cmp.compare(out["loadgen"], out["aiperf"])}


def _fmt(v, figure: str) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if figure == "output tok/s" else f"{v * 1e3:.1f} ms"


def print_table(rounds: list[dict]) -> None:
    print(f"\n{'level':16s} {'rnd':>3s} {'figure':13s} {'loadgen':>11s} {'aiperf':>11s} "
          f"{'ratio':>6s}  within 10%  definition")
    for r in rounds:
        for row in r["rows"]:
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
            print(f"{r['level']:16s} {r['round']:3d} {row['figure']:13s} "
                  f"{_fmt(row['loadgen'], row['figure']):>11s} "
                  f"{_fmt(row['tool'], row['figure']):>11s} {ratio:>6s}  "
                  f"{str(row['within']):10s}  {row['definition']}")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="c1,c4")
    ap.add_argument("--num-requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--omp-wait-policy", choices=("default", "PASSIVE"), default="default",
                    help="the server's OMP_WAIT_POLICY (default: unset, as a user runs it; "
                         "PASSIVE makes its step depend on whether the client keeps the "
                         "CPUs awake)")
    ap.add_argument("--server-threads", type=int, default=None,
                    help="the server's torch threads (default: one per CPU; 1 leaves a "
                         "core to the client, whose own CPU use then cannot change the "
                         "server's speed)")
    ap.add_argument("--aiperf", type=Path, default=Path(os.environ.get(
        "KVMAP_LOADTOOL_VENV", ROOT / ".venv-loadtool")) / "bin" / "aiperf")
    args = ap.parse_args()
    try:
        args.level_list = [parse_level(t) for t in args.levels.split(",")]
    except ValueError as e:
        ap.error(str(e))
    if args.server_threads is not None and args.server_threads < 1:
        ap.error(f"--server-threads={args.server_threads} must be >= 1")
    if args.rounds < 1 or args.num_requests < 1:
        ap.error(f"--rounds={args.rounds} and --num-requests={args.num_requests} must be >= 1")
    if not args.aiperf.exists():
        ap.error(f"aiperf is not installed at {args.aiperf}: run scripts/loadtool.sh "
                 "(its own venv, .venv-loadtool)")
    return args


def main() -> None:
    args = _args()
    base = build_requests(args.num_requests, args.prompt_tokens, args.output_tokens,
                          args.seed)
    load_start, started = os.getloadavg(), time.perf_counter()
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, Server("--dtype", args.dtype,
                                                         wait_policy=args.omp_wait_policy,
                                                         threads=args.server_threads) \
            as server:
        tokenizer_dir = aiperf_peer.export_tokenizer(Path(tmp) / "tokenizer")
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        endpoint = Endpoint(server.url, model, request_timeout_s=600.0)
        for level in args.level_list:
            for k in range(args.rounds):
                rounds.append(run_round(args, endpoint, base, level, k, tokenizer_dir,
                                        Path(tmp)))
    print_table(rounds)
    config = {k: v for k, v in vars(args).items() if k != "level_list"}
    config.update(aiperf=str(args.aiperf), aiperf_version=aiperf_peer.version(args.aiperf),
                  model_id=model, dtype=args.dtype,
                  model="SmolLM2-135M-Instruct (embedded GGUF), kvmap serve",
                  definitions={name: meaning for name, _, _, meaning in cmp.PAIRS})
    path = write_record("loadtool_check", config, {
        "rounds": rounds, "wall_s": time.perf_counter() - started,
        "load_avg_start": load_start, "load_avg_end": os.getloadavg()})
    print(f"record: {path}")


if __name__ == "__main__":
    main()
