"""A plain reference client: threads + ``http.client``, streaming SSE, closed loop.

``run_reference(endpoint, requests, concurrency)`` sends the same bodies as the asyncio
client (``Endpoint.body``) in the same order, ``concurrency`` threads each keeping one
request in flight over its own keep-alive connection, and returns a ``LoadRun`` whose
``RawResult``s are filled the way ``kvmap.loadgen.client`` fills them (send time, one
time per content chunk, usage), so ``kvmap.loadgen.results.load_metrics`` derives the
same metrics from both. Its transport and SSE parsing are its own (no aiohttp, no code
from ``stream.py``): it is what ``benchmarks/loadgen_vs_stdlib.py`` checks the asyncio
client against. It handles only the completions API and a healthy server; a failure is
recorded as ``disconnected`` with the exception, nothing finer.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

from kvmap.loadgen.endpoint import Endpoint, RawResult
from kvmap.loadgen.runner import LoadRun, Sent
from kvmap.workloads.spec import WorkloadRequest


def connect(endpoint: Endpoint) -> http.client.HTTPConnection:
    """A connection to ``endpoint``'s server (not opened until the first request)."""
    parts = urlsplit(endpoint.root)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=endpoint.request_timeout_s)


def _read_sse(response: http.client.HTTPResponse, result: RawResult) -> None:
    pieces = []
    while True:
        line = response.readline()
        if not line:
            break
        if not line.startswith(b"data:"):
            continue
        now = time.perf_counter()
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        obj = json.loads(data)
        choices = obj.get("choices") or []
        text = (choices[0].get("text") or "") if choices else ""
        if text:
            result.chunk_times_s.append(now)
            pieces.append(text)
        if choices and choices[0].get("finish_reason"):
            result.finish_reason = choices[0]["finish_reason"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            result.num_prompt_tokens = usage.get("prompt_tokens")
            result.num_output_tokens = usage.get("completion_tokens")
    response.read()                            # the chunked body's end: keep-alive reuse
    result.end_s = time.perf_counter()
    result.output_text = "".join(pieces)


def send_one(conn: http.client.HTTPConnection, endpoint: Endpoint,
             request: WorkloadRequest) -> RawResult:
    """POST ``request`` on ``conn`` and read its stream into a ``RawResult``."""
    if endpoint.api != "completions" or not endpoint.stream:
        raise ValueError(f"the reference client streams completions only, not "
                         f"api={endpoint.api!r} stream={endpoint.stream!r}")
    result = RawResult(request.request_id)
    body = json.dumps(endpoint.body(request)).encode()
    headers = {"Content-Type": "application/json", **endpoint.headers()}
    try:
        result.sent_s = time.perf_counter()
        conn.request("POST", urlsplit(endpoint.url).path, body=body, headers=headers)
        response = conn.getresponse()
        result.http_status = response.status
        if response.status >= 400:
            kind = "http_4xx" if response.status < 500 else "http_5xx"
            result.fail(kind, f"HTTP {response.status}: {response.read(4096)!r}")
            result.end_s = time.perf_counter()
            return result
        _read_sse(response, result)
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.fail("disconnected", f"{type(e).__name__}: {e}")
        conn.close()
    return result


def run_reference(endpoint: Endpoint, requests: list[WorkloadRequest], concurrency: int,
                  *, warmup: WorkloadRequest | None = None) -> LoadRun:
    """Send ``requests`` in order, ``concurrency`` in flight (see the module docstring);
    ``warmup``, when given, is sent first on the first thread's connection, unrecorded
    (as ``kvmap loadgen``'s warm-up request warms one connection of its session)."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency={concurrency!r} must be an integer >= 1")
    run, lock, queue = LoadRun(), threading.Lock(), list(reversed(requests))
    conns = [connect(endpoint) for _ in range(concurrency)]
    if warmup is not None:
        send_one(conns[0], endpoint, warmup)

    def worker(conn: http.client.HTTPConnection) -> None:
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    request = queue.pop()
                result = send_one(conn, endpoint, request)
                with lock:
                    run.sent.append(Sent(request, 0, None, result))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in conns]
    cpu0_s = time.process_time()
    run.t0_s = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.end_s = time.perf_counter()
    run.client_cpu_s = time.process_time() - cpu0_s
    run.sent.sort(key=lambda s: s.result.sent_s if s.result.sent_s is not None else 0.0)
    return run
