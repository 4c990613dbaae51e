"""A fake OpenAI-compatible server for the load generator's tests.

``fake_server(**behaviour)`` (a fixture) starts an aiohttp server on a free loopback port
in a background thread and returns its base URL. Each request streams ``max_tokens``
tokens: the first after ``ttft_s``, then one every ``itl_s`` (asyncio sleeps, so tests
allow a few ms of slack; ``done_tail_s`` delays the body's end after ``[DONE]``).
``mode`` picks a misbehaviour:

    ok             a well-formed stream with a usage chunk (if asked for) and [DONE]
    no_usage       never sends usage, even when asked
    multi          two tokens per chunk (usage still counts tokens)
    preamble       chat: a role-only first chunk before any content (at once)
    http_400 / http_500   an OpenAI error body with that status
    hang           headers and one chunk, then silence
    bad_json       one event that is not JSON
    cut            a few chunks, then the connection closes without [DONE]
    stream_error   an {"error": ...} event inside the 200 stream
    long_line      one SSE line over aiohttp's line limit (a 1 MiB ``data:`` line)
    choices_dict   ``choices`` an object, not a list (streamed or not)
    choices_int    ``choices`` a number

``server.requests`` lists the JSON bodies received; ``server.metrics_times_s`` when each
``GET /metrics`` arrived.
"""
from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from aiohttp import web

# the stdlib reference client lives with the benchmark that compares against it
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


class FakeServer:
    def __init__(self, mode: str = "ok", ttft_s: float = 0.05, itl_s: float = 0.02,
                 metrics_text: str = "", models: tuple[str, ...] = ("fake-model",),
                 done_tail_s: float = 0.0):
        self.mode, self.ttft_s, self.itl_s = mode, ttft_s, itl_s
        self.done_tail_s = done_tail_s
        self.metrics_text, self.models = metrics_text, models
        self.requests: list[dict] = []
        self.metrics_times_s: list[float] = []         # perf_counter of each GET /metrics
        self.in_flight = 0
        self.max_in_flight = 0
        self.loop = asyncio.new_event_loop()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> FakeServer:
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())
        pending = asyncio.all_tasks(self.loop)          # handlers of hung streams
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    # ---- routes ------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": "test"} for m in self.models]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_times_s.append(time.perf_counter())
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        chat = request.path.endswith("chat/completions")
        if self.mode in ("http_400", "http_500"):
            status = int(self.mode[-3:])
            return web.json_response({"error": {"message": f"fake {status}", "type": "x",
                                                "param": None, "code": status}},
                                     status=status)
        n = int(body.get("max_tokens", 16))
        if not body.get("stream") and self.mode.startswith("choices_"):
            return web.json_response({"choices": {"0": {"text": "x"}} if self.mode ==
                                      "choices_dict" else 5})
        if not body.get("stream"):
            await asyncio.sleep(self.ttft_s + self.itl_s * (n - 1))
            text = "".join(f"t{i} " for i in range(n))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"choices": [choice], "usage": {
                "prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await self._stream(resp, body, chat, n)
        finally:
            self.in_flight -= 1
        return resp

    async def _stream(self, resp, body, chat: bool, n: int) -> None:
        async def send(obj) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        def chunk(text: str, finish=None) -> dict:
            choice = ({"index": 0, "delta": {"content": text}, "finish_reason": finish}
                      if chat else {"index": 0, "text": text, "finish_reason": finish})
            return {"object": "chunk", "choices": [choice]}

        if chat and self.mode == "preamble":
            await send({"choices": [{"index": 0, "delta": {"role": "assistant",
                                                           "content": ""}}]})
        await asyncio.sleep(self.ttft_s)
        if self.mode == "bad_json":
            await send("{not json")
            return
        if self.mode == "stream_error":
            await send({"error": {"message": "engine died", "code": 500}})
            return
        if self.mode == "long_line":
            await send({"choices": [{"index": 0, "text": "x" * 2**20}]})
            await send("[DONE]")
            return
        if self.mode.startswith("choices_"):
            await send({"choices": {"0": {"text": "x"}} if self.mode == "choices_dict"
                        else 5})
            await send("[DONE]")
            return
        per_chunk = 2 if self.mode == "multi" else 1
        sent = 0
        while sent < n:
            k = min(per_chunk, n - sent)
            sent += k
            await send(chunk("".join(f"t{i} " for i in range(sent - k, sent)),
                             "length" if sent == n else None))
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode == "cut" and sent >= 3:
                resp.force_close()
                raise ConnectionResetError("fake cut")
            if sent < n:
                await asyncio.sleep(self.itl_s)
        opts = body.get("stream_options") or {}
        if opts.get("include_usage") and self.mode != "no_usage":
            await send({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n,
                                                 "total_tokens": 7 + n}})
        await send("[DONE]")
        await asyncio.sleep(self.done_tail_s)        # the body's end comes this much later


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_server():
    servers = []

    def start(**kwargs) -> FakeServer:
        server = FakeServer(**kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def wait_until(predicate, timeout_s: float = 5.0) -> bool:
    end = time.time() + timeout_s
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


# ---- a real ``kvmap serve`` in a subprocess --------------------------------------------

SERVE_SNIPPET = (
    "import sys, typer\n"
    "from kvmap.server.command import register\n"
    "app = typer.Typer()\n"
    "app.callback()(lambda: None)\n"
    "register(app)\n"
    "app(['serve', *sys.argv[1:]])\n")


class ServeProcess:
    """``kvmap serve ARGS --port P`` as a child process (the CLI's own code path)."""

    def __init__(self, *args: str, timeout_s: float = 180.0):
        import os
        import subprocess
        import sys
        import urllib.request
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE_SNIPPET, *args,
                                      "--port", str(self.port)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        end = time.time() + timeout_s
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvmap serve exited: {self.proc.stdout.read().decode()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError(f"kvmap serve did not become healthy in {timeout_s} s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def kvmap_serve():
    """A factory: ``kvmap_serve(*args)`` starts ``kvmap serve ARGS`` (closed at the end)."""
    servers = []

    def start(*args: str) -> ServeProcess:
        server = ServeProcess(*args)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
