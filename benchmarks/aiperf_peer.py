"""The aiperf arm of ``loadtool_check.py``: the same requests as a ``single_turn`` custom
dataset, one ``aiperf profile`` run per level, and its exports read back
(``loadtool_compare.tool_figures``). aiperf runs from its own venv
(``scripts/loadtool.sh``); nothing here imports it.

What is set so that both tools send the same requests: streamed ``completions`` with
the prompt text, ``max_tokens`` per request from the dataset (``output_length``),
``ignore_eos`` and ``temperature: 0`` as extra inputs (loadgen sends both), the usage
chunk (aiperf asks for it on every stream) and ``--use-server-token-count``, so output
tokens are the server's ``usage.completion_tokens`` as loadgen counts them rather than
aiperf's re-tokenization of the text. One warm-up request before the measured ones
(loadgen sends one too). Its GPU telemetry and ``/metrics`` collection are off: there
is no GPU, and on two cores its services are load on the server under test.
"""
from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path

import loadtool_compare as cmp


def export_tokenizer(out: Path) -> Path:
    """The embedded SmolLM2's tokenizer as a HF tokenizer directory (aiperf loads one to
    size its own datasets; with ``--use-server-token-count`` it counts nothing with it)."""
    from transformers import AutoTokenizer
    from kvmap.model.loader import embedded_model_path
    gguf = embedded_model_path()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def version(aiperf: Path) -> str | None:
    python = aiperf.parent / "python"
    probe = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                            "print(m.version('aiperf'))"], capture_output=True, text=True)
    return probe.stdout.strip() or None


def write_dataset(requests, path: Path) -> Path:
    """``single_turn`` JSONL: one ``{"text", "output_length"}`` line per request, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": r.prompt, "output_length": r.max_tokens}) + "\n"
                            for r in requests))
    return path


def command(aiperf: Path, url: str, model: str, dataset: Path, level, num_requests: int,
            tokenizer_dir: Path, artifacts: Path, seed: int) -> list[str]:
    """The ``aiperf profile`` command line of one level (``level``: kvmap's ``Level``)."""
    if level.concurrency is not None:
        load = ["--concurrency", str(level.concurrency)]
    elif level.rate_per_s is not None:
        load = ["--request-rate", f"{level.rate_per_s:g}", "--arrival-pattern", "poisson"]
    else:
        raise ValueError(f"level {level.name!r}: aiperf runs a rate or a concurrency only")
    return [str(aiperf), "profile", "--model", model, "--url", url,
            "--endpoint-type", "completions", "--streaming",
            "--input-file", str(dataset), "--custom-dataset-type", "single_turn",
            *load, "--request-count", str(num_requests),
            "--warmup-request-count", "1", "--random-seed", str(seed),
            "--tokenizer", str(tokenizer_dir), "--use-server-token-count",
            "--extra-inputs", json.dumps({"ignore_eos": True, "temperature": 0.0}),
            "--artifact-dir", str(artifacts), "--ui-type", "none",
            "--no-gpu-telemetry", "--no-server-metrics", "--workers-max", "1"]


def read_exports(artifacts: Path) -> tuple[list[dict], dict]:
    """The per-request records (warm-up and profiling) and the aggregate summary of the
    profiling phase, at the top of ``artifacts``."""
    records, summary = artifacts / "profile_export.jsonl", artifacts / "profile_export_aiperf.json"
    if not records.is_file() or not summary.is_file():
        found = sorted(p.name for p in artifacts.rglob("*"))
        raise RuntimeError(f"aiperf wrote no profile_export.jsonl / profile_export_aiperf."
                           f"json under {artifacts} (found {found})")
    return cmp.read_records(records), json.loads(summary.read_text())


def run(aiperf: Path, endpoint, requests, level, tokenizer_dir: Path, work: Path,
        seed: int = 0) -> dict:
    """One aiperf run of ``requests`` at ``level`` against ``endpoint``: its figures
    (``loadtool_compare.tool_figures``) and wall time; raises with its log's tail when
    it fails."""
    work = work.resolve()
    dataset = write_dataset(requests, work / "dataset.jsonl")
    artifacts = work / "artifacts"
    argv = command(aiperf.resolve(), endpoint.root, endpoint.model, dataset, level, len(requests),
                   tokenizer_dir, artifacts, seed)
    t0 = time.perf_counter()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=work)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (work / "aiperf.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"aiperf exited with {done.returncode}: "
                           f"{(done.stdout + done.stderr)[-3000:]}")
    records, summary = read_exports(artifacts)
    return {**cmp.tool_figures(records, summary), "aiperf_wall_s": time.perf_counter() - t0,
            "client_cpu_s": (after.ru_utime + after.ru_stime) - (used.ru_utime + used.ru_stime),
            "command": argv}
