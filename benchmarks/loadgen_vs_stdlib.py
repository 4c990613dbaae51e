"""Can the loadgen client be trusted? ``kvmap loadgen``'s asyncio client against a plain
stdlib client (threads + ``http.client``, ``benchmarks/stdlib_client.py``) on one server.

    python benchmarks/loadgen_vs_stdlib.py [--server kvmap|paced] [--rounds 8]
                                           [--model dummy:tiny]

``--server kvmap`` (default) starts ``kvmap serve`` (the embedded model, bf16, unless
``--model``) on loopback; ``--server paced`` starts a server whose timing is known
exactly (this file, ``--serve-paced``: first token ``--paced-ttft-ms`` after the request,
then one every ``--paced-itl-ms``, on absolute deadlines, with a ``/metrics`` page of
``kvmap serve``'s size), so each client's figures can be set against the truth.

Then rounds of one run of each client, in ABBA order (round k: loadgen first when k is
even), each run closed loop at ``--concurrency`` (4), ``--num-requests`` (16) of
``--output-tokens`` (64). Both clients are warmed the same way before every run (one
unrecorded request on one connection of the run's own transport) and send the same
requests in the same order; every run's prompts carry their own tag at the start, so no
run gains from another's prefix cache. The loadgen arm runs a level exactly as
``kvmap loadgen`` does (``sweep.warm_up`` + ``sweep.measure_level``: ``/metrics``
scraped before, once a second during, and after), so what it measures is the command's
path. Both clients' results go through the same ``load_metrics``.

Prints medians, the ratios of medians and the median (and range) of the per-round
paired ratios (loadgen / stdlib; the two runs of a round ran back to back), and writes a
JSON record under ``benchmarks/results/`` with every run, its 1-minute load average and
the client CPU time.
"""
from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402
from serve_load import Server  # noqa: E402

from kvmap.loadgen import prompts  # noqa: E402
from kvmap.loadgen.client import Endpoint  # noqa: E402
from stdlib_client import connect, run_reference, send_one  # noqa: E402
from kvmap.loadgen.results import load_metrics  # noqa: E402
from kvmap.loadgen.runner import LoadRun, open_session, run_plan  # noqa: E402
from kvmap.loadgen.schedule import Level, make_plan  # noqa: E402
from kvmap.loadgen.sweep import measure_level, warm_up  # noqa: E402

CLIENTS = ("loadgen", "stdlib", "bare")     # bare: run_plan alone, no /metrics scrapes
FIGURES = ("output_tokens_per_s", "ttft_p50_s", "e2e_p50_s", "tbt_p50_s", "tbt_p99_s",
           "client_cpu_s", "client_cpu_share", "first_sends_spread_s", "turnaround_p50_s")
VERDICT = ("output_tokens_per_s", "ttft_p50_s")          # the two figures, +-10%


def tagged(requests, tag: str):
    return [replace(r, prompt=f"[{tag}] {r.prompt}") for r in requests]


async def _loadgen(endpoint: Endpoint, requests, concurrency: int, warmup, scrape: bool,
                   at_start):
    """As ``kvmap loadgen`` runs one level: warm-up on the session, then the level
    (``scrape=False``: the load alone, ``run_plan`` without ``measure_level``'s scrapes)."""
    async with open_session(endpoint) as session:
        if warmup is not None:
            await warm_up(session, endpoint, warmup, 1)
        level = Level(concurrency=concurrency)
        plan = make_plan(requests, level)
        if not scrape:
            at_start()
            return await run_plan(endpoint, plan, session=session), 0
        measured = await measure_level(session, endpoint, plan, level, at_start=at_start)
        return measured.run, len(measured.timeline)


def run_client(client: str, endpoint: Endpoint, requests, concurrency: int,
               warmup, at_start=lambda: None) -> tuple[LoadRun, int]:
    """One closed-loop run of ``client`` (and how many ``/metrics`` scrapes it made);
    ``at_start`` is called just before its first send."""
    if client == "stdlib":
        at_start()
        return run_reference(endpoint, requests, concurrency, warmup=warmup), 0
    return asyncio.run(_loadgen(endpoint, requests, concurrency, warmup,
                                scrape=client == "loadgen", at_start=at_start))


def _timed_run(client: str, endpoint: Endpoint, requests, concurrency: int, barrier) -> dict:
    """One run of ``client`` in a worker process, started when every arm of the round is
    at ``barrier`` (the loadgen arm after its scrape before the level), so that all arms
    send their first wave to the same server at the same time."""
    run, num_scrapes = run_client(client, endpoint, requests, concurrency, None,
                                  lambda: barrier.wait(timeout=300))
    return {"num_scrapes": num_scrapes, **figures(run, concurrency)}


def run_concurrent(args, endpoint: Endpoint, base, console) -> list[dict]:
    """``--mode concurrent``: each round runs every arm at once, each in its own process
    with its own tagged requests at ``--concurrency`` (the server holds arms x
    concurrency), so the server's state and the machine's load are common to the arms of
    a round; one unrecorded round first warms every process and its client the same way.
    The throughput of arms that run side by side is near equal by construction; what
    this mode compares is latency under one shared noise."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    ctx = multiprocessing.get_context("spawn")
    runs: list[dict] = []
    with ctx.Manager() as manager, ProcessPoolExecutor(len(args.arms), mp_context=ctx) as pool:
        for k in range(-1, args.rounds):
            barrier = manager.Barrier(len(args.arms))
            work = base if k >= 0 else [replace(r, max_tokens=4) for r in base[:args.concurrency]]
            # arm j starts (j + k)/n of the way into the list: the same requests, not the
            # same lengths in lockstep (whose slots would free at the same step and race
            # for the next prefill), and every arm gets every start in turn, since which
            # requests make the first wave moves the TTFT P50 of 16 requests a lot
            n = len(args.arms)
            shift = [((j + k) % n) * len(work) // n for j in range(n)]
            reqs = {c: tagged(work[s:] + work[:s], f"{k}-{c}")
                    for c, s in zip(args.arms, shift)}
            futures = {c: pool.submit(_timed_run, c, endpoint, reqs[c], args.concurrency,
                                      barrier) for c in args.arms}
            for client, future in futures.items():
                fig = future.result()
                if k >= 0:
                    runs.append({"round": k, "client": client, **fig})
                    _say(console, k, client, fig)
    return runs


def run_interleaved(args, endpoint: Endpoint, base, console) -> list[dict]:
    """``--mode interleaved``: each round runs the arms one after another, in an order
    that rotates each round (ABBA... for two), each after one warm-up request of its own."""
    runs: list[dict] = []
    for k in range(args.rounds):
        for client in args.arms[k % len(args.arms):] + args.arms[:k % len(args.arms)]:
            reqs = tagged(base, f"{k}-{client}")
            run, num_scrapes = run_client(client, endpoint, reqs, args.concurrency,
                                          replace(reqs[-1], request_id="warmup"))
            fig = figures(run, args.concurrency)
            runs.append({"round": k, "client": client, "num_scrapes": num_scrapes, **fig})
            _say(console, k, client, fig)
    return runs


def _say(console, k: int, client: str, fig: dict) -> None:
    console.print(f"round {k} {client}: {fig['output_tokens_per_s']:.1f} tok/s, "
                  f"TTFT p50 {fig['ttft_p50_s'] * 1000:.0f} ms, "
                  f"cpu {fig['client_cpu_s']:.2f} s, load {fig['load_avg_1m']:.2f}")


def figures(run: LoadRun, concurrency: int) -> dict:
    m = load_metrics(run.sent, run.t0_s, run.duration_s)
    sends = sorted(s.result.sent_s for s in run.sent if s.result.sent_s is not None)
    first = sends[:concurrency]
    ends = sorted(s.result.end_s for s in run.sent if s.result.end_s is not None)
    # how soon the closed loop refills a slot: each later send after the last end before it
    turnaround = [t - max((e for e in ends if e <= t), default=t) for t in sends[concurrency:]]
    return {"output_tokens_per_s": m["output_tokens_per_s"],
            "ttft_p50_s": (m["ttft_s"] or {}).get("p50"),
            "e2e_p50_s": (m["e2e_s"] or {}).get("p50"),
            "tbt_p50_s": (m["tbt_s"] or {}).get("p50"),
            "tbt_p99_s": (m["tbt_s"] or {}).get("p99"),
            "duration_s": run.duration_s, "num_completed": m["num_completed"],
            "num_failed": m["num_failed"], "num_output_tokens": m["num_output_tokens"],
            "client_cpu_s": run.client_cpu_s, "client_cpu_share": run.client_cpu_share,
            "first_send_after_s": first[0] - run.t0_s if first else None,
            "first_sends_spread_s": first[-1] - first[0] if first else None,
            "turnaround_p50_s": statistics.median(turnaround) if turnaround else None,
            "load_avg_1m": os.getloadavg()[0]}


def paced_truth(max_tokens: list[int], concurrency: int, ttft_s: float,
                itl_s: float) -> dict:
    """What a client with no overhead of its own measures on the paced server: each
    request takes ``ttft + (n - 1) * itl``; the closed loop hands the next request to
    the first slot that frees."""
    slots = [0.0] * concurrency
    for n in max_tokens:
        heapq.heappush(slots, heapq.heappop(slots) + ttft_s + (n - 1) * itl_s)
    return {"output_tokens_per_s": sum(max_tokens) / max(slots), "ttft_p50_s": ttft_s,
            "tbt_p50_s": itl_s}


def _paired(runs: list[dict], k: int, arm: str, figure: str) -> float | None:
    """Round ``k``'s ``arm`` / stdlib ratio of ``figure`` (the two ran in one round)."""
    a, b = (next(r[figure] for r in runs if r["round"] == k and r["client"] == c)
            for c in (arm, "stdlib"))
    return a / b if a is not None and b else None


def summarize(runs: list[dict], arms: list[str], rounds: int) -> dict:
    """Medians per arm; per arm but stdlib, the ratio of medians and the paired ratios
    (median, range, every value) against stdlib, and whether the paired medians of the
    issue's two figures are within 10%."""
    medians = {c: {f: _median([r[f] for r in runs if r["client"] == c]) for f in FIGURES}
               for c in arms}
    ratios, paired, within = {}, {}, {}
    for arm in (a for a in arms if a != "stdlib"):
        ratios[arm] = {f: medians[arm][f] / medians["stdlib"][f] for f in FIGURES
                       if medians[arm][f] is not None and medians["stdlib"][f]}
        paired[arm] = {}
        for f in FIGURES:
            values = [_paired(runs, k, arm, f) for k in range(rounds)]
            if all(v is not None for v in values):
                paired[arm][f] = {"median": statistics.median(values), "min": min(values),
                                  "max": max(values), "values": values}
        within[arm] = {f: f in paired[arm] and abs(paired[arm][f]["median"] - 1.0) <= 0.10
                       for f in VERDICT}
    return {"medians": medians, "ratios": ratios, "paired_ratios": paired,
            "within_10pct_paired": within}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---- the paced server ------------------------------------------------------------------

def serve_paced(port: int, ttft_s: float, itl_s: float, metrics_samples: int) -> None:
    """A completions server with exact timing (see the module docstring); runs forever."""
    from aiohttp import web
    page = "".join(f'kvmap:paced_gauge{{i="{i}"}} {i}.0\n' for i in range(metrics_samples))

    async def complete(request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):                  # absolute deadlines: a late wake-up catches up
            await asyncio.sleep(max(0.0, t0 + ttft_s + i * itl_s - time.perf_counter()))
            choice = {"index": 0, "text": f" t{i}",
                      "finish_reason": "length" if i == n - 1 else None}
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        usage = {"prompt_tokens": len(body.get("prompt", "")), "completion_tokens": n}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                         "data: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "paced"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PacedServer:
    """``serve_paced`` in a child process (its own interpreter, as a real server is)."""

    def __init__(self, ttft_s: float, itl_s: float, metrics_samples: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-paced",
                                      str(self.port), "--paced-ttft-ms", str(ttft_s * 1e3),
                                      "--paced-itl-ms", str(itl_s * 1e3),
                                      "--paced-metrics-samples", str(metrics_samples)])
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("the paced server did not answer within 30 s")

    def __enter__(self) -> PacedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ---- the benchmark ---------------------------------------------------------------------

def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", choices=("kvmap", "paced"), default="kvmap")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--mode", choices=("interleaved", "concurrent"), default="interleaved")
    ap.add_argument("--arms", default="loadgen,stdlib",
                    help="comma list of loadgen, stdlib, bare (stdlib is always run)")
    ap.add_argument("--model", default=None, help="kvmap serve --model (default: embedded)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--paced-ttft-ms", type=float, default=200.0)
    ap.add_argument("--paced-itl-ms", type=float, default=20.0)
    ap.add_argument("--paced-metrics-samples", type=int, default=300)
    ap.add_argument("--serve-paced", type=int, default=None, metavar="PORT",
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds={args.rounds} must be >= 1")
    args.arms = list(dict.fromkeys(["stdlib", *args.arms.split(",")]))
    bad = [a for a in args.arms if a not in CLIENTS]
    if bad:
        ap.error(f"--arms {bad} not among {CLIENTS}")
    args.arms = [a for a in CLIENTS if a in args.arms]
    return args


def _start(args):
    if args.server == "paced":
        return PacedServer(args.paced_ttft_ms / 1e3, args.paced_itl_ms / 1e3,
                           args.paced_metrics_samples)
    return Server("--dtype", "bf16", *(("--model", args.model) if args.model else ()))


def main() -> None:
    from rich.console import Console
    args = _args()
    if args.serve_paced is not None:
        return serve_paced(args.serve_paced, args.paced_ttft_ms / 1e3,
                           args.paced_itl_ms / 1e3, args.paced_metrics_samples)
    console = Console()
    tokenizer = prompts.load_tokenizer("bytes" if args.server == "paced" or
                                       (args.model or "").startswith("dummy:") else "smollm2")
    spec = prompts.workload_spec("throughput", None, prompt_tokens=args.prompt_tokens,
                                 output_tokens=args.output_tokens)
    base = prompts.build(spec, tokenizer, args.num_requests)
    load_start, t_start = os.getloadavg(), time.perf_counter()
    with _start(args) as server:
        with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as r:
            model = json.loads(r.read())["data"][0]["id"]
        endpoint = Endpoint(server.url, model, request_timeout_s=600.0)
        send_one(connect(endpoint), endpoint, replace(tagged(base, "server-warmup")[0],
                                                        request_id="warmup"))
        runs = (run_concurrent if args.mode == "concurrent" else run_interleaved)(
            args, endpoint, base, console)
    summary = summarize(runs, args.arms, args.rounds)
    if args.server == "paced":
        truth = paced_truth([r.max_tokens for r in base], args.concurrency,
                            args.paced_ttft_ms / 1e3, args.paced_itl_ms / 1e3)
        summary["truth"] = truth
        summary["vs_truth"] = {c: {f: summary["medians"][c][f] / v for f, v in truth.items()}
                               for c in args.arms}
    _print(console, args, summary)
    config = {**vars(args), "model_id": model,
              "max_tokens_per_request": [r.max_tokens for r in base]}
    path = write_record("loadgen_vs_stdlib", config, {
        **summary, "runs": runs, "wall_s": time.perf_counter() - t_start,
        "load_avg_start": load_start, "load_avg_end": os.getloadavg()})
    console.print(f"record: {path}")


def _print(console, args, summary: dict) -> None:
    from rich.table import Table
    others = [a for a in args.arms if a != "stdlib"]
    table = Table(title=f"{', '.join(others)} vs stdlib ({args.server} server, {args.mode}), "
                        f"medians of "
                        f"{args.rounds} runs each (concurrency {args.concurrency}, "
                        f"{args.num_requests} x {args.prompt_tokens} in / "
                        f"{args.output_tokens} out)")
    table.add_column("figure")
    for column in (*args.arms, *(f"{a}/stdlib paired [min, max]" for a in others)):
        table.add_column(column, justify="right")
    med, paired = summary["medians"], summary["paired_ratios"]
    for f in FIGURES:
        cells = ["-" if med[c][f] is None else f"{med[c][f]:.4g}" for c in args.arms]
        for a in others:
            p = paired[a].get(f)
            cells.append(f"{p['median']:.3f} [{p['min']:.2f}, {p['max']:.2f}]" if p else "-")
        table.add_row(f, *cells)
    console.print(table)
    console.print(f"within 10% (paired medians): {summary['within_10pct_paired']}")
    if "vs_truth" in summary:
        console.print("each client's median / the paced server's truth: "
                      + json.dumps({c: {f: round(v, 3) for f, v in d.items()}
                                    for c, d in summary["vs_truth"].items()}))


if __name__ == "__main__":
    main()
