"""llama.cpp's own C++ server as a peer of the single-request benchmarks.

``scripts/llamacpp.sh`` builds ``llama-server`` into a scratch directory; nothing here
builds it. ``llama_server_binary()`` looks at ``$KVMAP_LLAMA_SERVER``, then at the
script's default location, and returns None when neither exists (the caller's row then
says "not built"). ``LlamaServer`` starts it on a GGUF with one slot and ``-t``/``-tb``
equal to the benchmark's thread count, and ``complete`` sends one completion at a time
(greedy, EOS ignored, prompt cache off so every prompt is processed again) and returns
the server's own ``timings``:

    prompt_per_second     prompt tokens / (time from the request's start to the end of
                          prompt processing, first token sampled)  -- llama.cpp's TTFT rate
    predicted_per_second  (generated tokens - 1) / (time from the first generated token
                          to the last)  -- the first token comes from the prompt's logits

(``server-common.h``, ``n_prompt_tps`` and ``n_gen_tps``): the server's clock, with no
HTTP or JSON time, the same definitions as kvmap's TTFT-based prefill rate and
tokens-after-the-first decode rate.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from kvmap.bench.endpoint_launch import free_port, is_healthy, log_tail, stop

LLAMACPP_VERSION = "0.3.36"
DEFAULT_BINARY = (Path.home() / ".cache" / "kvmap" / "llamacpp" / LLAMACPP_VERSION
                  / "build" / "bin" / "llama-server")
STARTUP_TIMEOUT_S = 60.0


def llama_server_binary() -> Path | None:
    """The built ``llama-server``, or None when it has not been built."""
    env = os.environ.get("KVMAP_LLAMA_SERVER")
    for path in ([Path(env)] if env else []) + [DEFAULT_BINARY]:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


class LlamaServer:
    """``with LlamaServer(binary, gguf, threads, ctx_tokens) as server:`` one slot by
    default (``slots`` for concurrent load; ``alias`` names the model in its OpenAI API).

    Where it dies of a signal while starting (on an x86-amx machine its AMX kernels, taken
    for the weights it repacks, raise SIGILL -- SIGSEGV in another sandbox -- on the first
    ``tilezero`` when the kernel has not granted the process the tile state), it starts
    once more with ``--no-repack``: the weights stay in the GGUF's layout on the AVX-512
    kernels, and ``notes`` says so for the record."""

    def __init__(self, binary: Path, gguf: Path, threads: int, ctx_tokens: int = 4096,
                 log_path: Path = Path("/tmp/kvmap-llama-server.log"), slots: int = 1,
                 alias: str | None = None):
        self.port = free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1",
                     "--port", str(self.port), "-t", str(threads), "-tb", str(threads),
                     "-c", str(ctx_tokens), "-np", str(slots), "--no-webui"]
        if alias is not None:
            self.argv += ["--alias", alias]
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.notes: list[str] = []       # how it had to be started, for the record
        self.exit_code: int | None = None   # of a start that failed by itself

    def __enter__(self) -> "LlamaServer":
        if not self._start() and (self.exit_code or 0) < 0:
            died = signal.Signals(-self.exit_code).name
            self.argv.append("--no-repack")
            self.notes.append(f"started again with --no-repack: it died of {died} while "
                              "starting with its weights repacked (AMX kernels)")
            if self._start():
                return self
        if self.process.poll() is None:
            return self
        raise RuntimeError(f"llama-server did not start (exit {self.exit_code}, None: not "
                           f"healthy in {STARTUP_TIMEOUT_S:.0f} s): "
                           f"{log_tail(self.log_path)}")

    def _start(self) -> bool:
        """Start it and wait until healthy (True), or until it exits or times out (False)."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not is_healthy(self.root, {}):
            self.exit_code = self.process.poll()       # None: timed out, stopped by us
            if self.exit_code is not None or time.monotonic() > deadline:
                stop(self.process)
                return False
            time.sleep(0.2)
        return True

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            stop(self.process)

    def complete(self, prompt_ids: list[int], num_new_tokens: int) -> dict:
        """One greedy completion of ``num_new_tokens``; the response's ``timings``."""
        body = json.dumps({"prompt": prompt_ids, "n_predict": num_new_tokens,
                           "ignore_eos": True, "cache_prompt": False, "temperature": 0.0,
                           "stream": False}).encode()
        request = urllib.request.Request(f"{self.root}/completion", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            timings = json.loads(response.read())["timings"]
        if timings.get("predicted_n") != num_new_tokens:
            raise RuntimeError(f"llama-server generated {timings.get('predicted_n')} "
                               f"tokens, asked for {num_new_tokens}")
        return timings
