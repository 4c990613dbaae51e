"""Serving under load, on loopback: ``kvmap loadgen`` against ``kvmap serve``.

    python benchmarks/serve_load.py [--part loopback|step|all] [--quick]

Part ``loopback``: the real embedded model (SmolLM2-135M at ``--dtype``, default the
machine's ``auto``: fp32 without native bf16) served by ``kvmap serve``
in a child process; the load generator at three Poisson rates; per rate the client's
TTFT/TBT/E2E/throughput and the server's own mean TTFT from its
``vllm:time_to_first_token_seconds`` histogram (the two should agree within 10%; the
offset is the HTTP path the server's clock does not see).

Part ``step``: one step-load run (low rate, a high-rate step, low again) against
``kvmap serve --adaptive examples/adaptive-cpu.yaml`` and against a fixed server (KV in the
model's dtype) with
the same KV byte budget; per phase the client's P99 TBT and the adaptive server's KV
configuration switches (``kvmap:kv_config_switches_total`` and the active
``kvmap:kv_config_info`` over time, scraped from ``/metrics``).

Prints tables and writes one JSON record under ``benchmarks/results/``; the run
directories (``kvmap report`` reads them) go under ``runs/``. Timings from a shared,
loaded machine: the record keeps the load average.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402

from kvmap.hardware.threads import policy_env  # noqa: E402
from kvmap.runs.record import as_dicts  # noqa: E402
from kvmap.loadgen import prompts  # noqa: E402
from kvmap.loadgen.client import Endpoint  # noqa: E402
from kvmap.loadgen.scenario import LoadgenScenario  # noqa: E402
from kvmap.loadgen.schedule import Level, parse_steps  # noqa: E402
from kvmap.loadgen.summary import summary_table  # noqa: E402
from kvmap.loadgen.sweep import run_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVE = ("import sys, typer\n"
         "from kvmap.server.command import register\n"
         "app = typer.Typer()\n"
         "app.callback()(lambda: None)\n"
         "register(app)\n"
         "app(['serve', *sys.argv[1:]])\n")


class Server:
    """``kvmap serve ARGS`` in a child process on a free port. ``wait_policy``: its
    ``OMP_WAIT_POLICY`` (PASSIVE by default: a client shares the CPUs; ``default`` leaves
    it unset, as ``kvmap serve`` runs for a user); ``threads``: its ``OMP_NUM_THREADS``
    (default: torch's, one per CPU)."""

    def __init__(self, *args: str, timeout_s: float = 300.0, wait_policy: str = "PASSIVE",
                 threads: int | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        env = policy_env(wait_policy)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE, *args, "--port",
                                      str(self.port)], env=env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.time() + timeout_s
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvmap serve {' '.join(args)} exited: "
                                   f"{self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.close()
        raise RuntimeError(f"kvmap serve {' '.join(args)} did not start in {timeout_s} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _load(server: Server, levels: tuple[Level, ...], out: Path, *, num_requests: int | None,
          prompt_tokens: int, output_tokens: int, tokenizer, slo: dict | None = None,
          label: str | None = None, request_timeout_s: float = 300.0):
    scenario = LoadgenScenario(url=server.url, model="?", levels=levels,
                               num_requests=num_requests, prompt_tokens=prompt_tokens,
                               output_tokens=output_tokens, tokenizer="smollm2", slo=slo,
                               label=label, request_timeout_s=request_timeout_s,
                               drain_timeout_s=120.0)
    with urllib.request.urlopen(f"{server.url}/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    scenario = replace(scenario, model=model)
    endpoint = Endpoint(server.url, model, request_timeout_s=request_timeout_s)
    return asyncio.run(run_sweep(scenario, endpoint, tokenizer, out,
                                 command=[sys.argv[0], *sys.argv[1:]]))


def loopback(args, tokenizer, console: Console, stamp: str) -> dict:
    rates = (0.5, 1.0, 2.0)
    n = 6 if args.quick else 12
    out = ROOT / "runs" / f"serve-load-loopback-{stamp}"
    with Server("--dtype", args.dtype) as server:
        result = _load(server, tuple(Level(rate_per_s=r) for r in rates), out,
                       num_requests=n, prompt_tokens=512, output_tokens=32,
                       tokenizer=tokenizer, slo={"ttft_s": 2.0, "tpot_s": 0.25})
    console.print(summary_table(result.cells, title="loopback: kvmap loadgen -> kvmap serve "
                                                   f"(SmolLM2-135M {args.dtype}, 512+32 tokens)"))
    rows = []
    for c in as_dicts(result.cells):
        m = c["metrics"]
        rows.append({"rate_per_s": c["params"]["rate_per_s"], "num_completed":
                     m["num_completed"], "num_failed": m["num_failed"],
                     "requests_per_s": m["requests_per_s"],
                     "output_tokens_per_s": m["output_tokens_per_s"],
                     "ttft_mean_s": (m["ttft_s"] or {}).get("mean"),
                     "ttft_p99_s": (m["ttft_s"] or {}).get("p99"),
                     "server_ttft_mean_s": (m["server"] or {}).get("ttft_mean_s"),
                     "ttft_ratio_loadgen_over_server": m["ttft_vs_server"]["ratio"],
                     "ttft_offset_s": m["ttft_vs_server"]["offset_s"],
                     "tbt_p50_s": (m["tbt_s"] or {}).get("p50"),
                     "tbt_p99_s": (m["tbt_s"] or {}).get("p99"),
                     "tpot_mean_s": (m["tpot_s"] or {}).get("mean"),
                     "e2e_p50_s": (m["e2e_s"] or {}).get("p50"),
                     "goodput_requests_per_s": m["goodput_requests_per_s"]})
    return {"run_dir": str(out), "levels": rows}


def step(args, tokenizer, console: Console, stamp: str) -> dict:
    steps = "0.3@10s,1.5@15s,0.3@15s" if args.quick else "0.3@20s,1.5@30s,0.3@30s"
    phases = parse_steps(steps)
    policy = Path(args.policy)
    runs = {}
    for name, server_args in ((f"fixed-{args.dtype}", ("--kv", args.dtype)),
                              ("adaptive", ("--adaptive", str(policy)))):
        out = ROOT / "runs" / f"serve-load-step-{name}-{stamp}"
        with Server("--dtype", args.dtype, "--kv-memory", args.kv_memory,
                    *server_args) as server:
            result = _load(server, (Level(phases=phases),), out, num_requests=None,
                           prompt_tokens=256, output_tokens=48, tokenizer=tokenizer,
                           label=name, request_timeout_s=240.0)
        cells = as_dicts(result.cells)
        timeline = cells[0]["details"].get("server_timeline") or []
        phase_rows = []
        for c in cells:
            m = c["metrics"]
            server_view = m["server"] or {}
            k = c["params"]["phase"]
            start_s = sum(p.duration_s for p in phases[:k])
            end_s = start_s + phases[k].duration_s if k + 1 < len(phases) else float("inf")
            window = [pt for pt in timeline if start_s <= pt["t_s"] < end_s]
            phase_rows.append({
                "phase": c["params"]["phase"], "rate_per_s": c["params"]["rate_per_s"],
                "duration_s": c["params"]["phase_duration_s"],
                "num_completed": m["num_completed"], "num_failed": m["num_failed"],
                "tbt_p50_s": (m["tbt_s"] or {}).get("p50"),
                "tbt_p99_s": (m["tbt_s"] or {}).get("p99"),
                "ttft_p99_s": (m["ttft_s"] or {}).get("p99"),
                "output_tokens_per_s": m["output_tokens_per_s"],
                "delivered_tokens_per_s": m.get("output_chunks_per_s_in_window"),
                "switches": (server_view.get("kvmap_counters") or {}).get(
                    "kvmap:kv_config_switches_total", 0.0),
                "max_num_waiting": _max(pt.get("num_requests_waiting") for pt in window),
                "max_kv_usage": _max(pt.get("kv_cache_usage_perc") for pt in window),
                "kv_at_end": server_view.get("kv")})
        kv_changes = []
        for point in timeline:
            if point.get("kv") and (not kv_changes or kv_changes[-1][1] != point["kv"]):
                kv_changes.append((point["t_s"], point["kv"]))
        runs[name] = {"run_dir": str(out), "phases": phase_rows, "kv_over_time": kv_changes}
    table = Table(title=f"step load {steps} (SmolLM2-135M, kv_memory {args.kv_memory}, "
                        "256+48 tokens): P99 TBT per phase")
    for column in ("server", "phase", "rate/s", "ok/fail", "TBT p50 ms", "TBT p99 ms",
                   "TTFT p99 ms", "tok/s delivered", "max waiting", "max KV use", "switches",
                   "KV at phase end"):
        table.add_column(column)
    for name, run in runs.items():
        for p in run["phases"]:
            table.add_row(name, str(p["phase"]), f"{p['rate_per_s']:g}",
                          f"{p['num_completed']}/{p['num_failed']}",
                          _ms(p["tbt_p50_s"]), _ms(p["tbt_p99_s"]), _ms(p["ttft_p99_s"]),
                          f"{p['delivered_tokens_per_s'] or 0:.1f}",
                          "-" if p["max_num_waiting"] is None else f"{p['max_num_waiting']:g}",
                          "-" if p["max_kv_usage"] is None else f"{p['max_kv_usage']:.0%}",
                          f"{p['switches']:g}", str(p["kv_at_end"]))
    console.print(table)
    console.print("adaptive KV over time (s into the run, active config): "
                  + ", ".join(f"{t:.0f}s {kv}" for t, kv in runs["adaptive"]["kv_over_time"]))
    return {"steps": steps, "kv_memory": args.kv_memory, "policy": str(policy), **runs}


def _max(values) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("loopback", "step", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="fewer requests, shorter steps")
    parser.add_argument("--kv-memory", default="16MiB",
                        help="KV byte budget of each step-load server (small, so that "
                             "memory binds under the high step)")
    parser.add_argument("--policy", default=str(ROOT / "examples" / "adaptive-cpu.yaml"),
                        help="adaptive policy file of the step-load run")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bf16", "fp32"),
                        help="the servers' compute dtype (auto: this machine's fastest "
                             "exact one; the fixed server's KV is the same dtype)")
    args = parser.parse_args()
    from kvmap.hardware import resolve_dtype
    args.dtype = resolve_dtype(args.dtype)
    console = Console(width=200)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    tokenizer = prompts.load_tokenizer("smollm2")
    load_start = os.getloadavg()[0]
    metrics = {}
    if args.part in ("loopback", "all"):
        metrics["loopback"] = loopback(args, tokenizer, console, stamp)
    if args.part in ("step", "all"):
        metrics["step"] = step(args, tokenizer, console, stamp)
    metrics["load_avg_1m"] = {"start": load_start, "end": os.getloadavg()[0]}
    path = write_record("serve_load", {"part": args.part, "quick": args.quick,
                                       "kv_memory": args.kv_memory, "policy": args.policy},
                        metrics)
    console.print(f"record: {path}  (machine load average {load_start:.1f} -> "
                  f"{os.getloadavg()[0]:.1f}: timings are from a shared, loaded machine)")


if __name__ == "__main__":
    main()
