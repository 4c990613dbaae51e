"""No pre-auth lockout (issue 38): the server's limit counts admitted requests, not
sockets. Sockets that send half a header block and wait hold no place, and are closed
after the header timeout; ``/health`` and ``/metrics`` are never refused by the limit;
a request without the API key is a 401 and holds no place; past the limit a request
gets a 503 with ``Retry-After``. All against ``serve_app`` (what ``kvmap serve`` runs)
on loopback, with a small limit and short timeouts."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from tests.server.test_api import assert_error
from tests.server.test_request_faults import run_serve_app

KEY = "admission-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HALF_A_REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"   # no blank line


@contextmanager
def served(**options):
    loop, thread, result = run_serve_app(api_key=KEY, **options)
    try:
        yield loop, result
    finally:
        result["server"].should_exit = True
        thread.join(30)


def open_connections(result) -> int:
    return len(result["server"].server_state.connections)


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def half_open(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(HALF_A_REQUEST)
        socks.append(s)
    return socks


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1024) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_half_open_sockets_at_twice_the_limit_lock_nobody_out():
    limit = 4
    with served(max_concurrent_requests=limit, header_timeout_s=60) as (_, result):
        socks = half_open(result["port"], 2 * limit)
        try:
            assert wait_until(lambda: open_connections(result) >= 2 * limit)
            with httpx.Client(base_url=result["url"], timeout=30) as c:
                assert c.get("/health").status_code == 200
                assert c.get("/metrics", headers=AUTH).status_code == 200
                ok = c.post("/v1/completions", headers=AUTH,
                            json={"prompt": "hi", "max_tokens": 2})
                assert ok.status_code == 200, ok.text
                assert_error(c.post("/v1/completions", json={"prompt": "hi"}), 401)
            assert open_connections(result) >= 2 * limit      # still held, harmlessly
        finally:
            for s in socks:
                s.close()


def test_a_header_block_not_complete_in_time_is_closed():
    with served(header_timeout_s=0.3) as (_, result):
        port = result["port"]
        [stalled] = half_open(port, 1)
        assert closed_by_server(stalled, 10)
        trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
        closed = False
        for byte in HALF_A_REQUEST * 4:           # a byte every 50 ms: no more time
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
        assert closed or closed_by_server(trickle, 10)
        # a kept-alive connection: its first request is served, a half-sent second closed
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200")
            s.sendall(HALF_A_REQUEST)
            assert closed_by_server(s, 10)
        with httpx.Client(base_url=result["url"], timeout=30) as c:
            assert c.get("/health").status_code == 200
        stalled.close()
        trickle.close()


@contextmanager
def engine_held(loop, result, max_hold_s: float = 30.0):
    entered, gate = threading.Event(), threading.Event()

    def hold(_):
        entered.set()
        gate.wait(max_hold_s)
    event_loop = result["server"].servers[0].get_loop()
    future = asyncio.run_coroutine_threadsafe(loop.call(hold), event_loop)
    try:
        assert entered.wait(10)
        yield
    finally:
        gate.set()
        future.result(30)


def test_requests_past_the_limit_get_503_but_probes_and_scrapes_do_not():
    limit = 2
    with served(max_concurrent_requests=limit) as (loop, result):
        url, statuses = result["url"], []

        def complete():
            statuses.append(httpx.post(url + "/v1/completions", headers=AUTH, timeout=30,
                                       json={"prompt": "hi", "max_tokens": 2}).status_code)
        threads = [threading.Thread(target=complete) for _ in range(limit)]
        with engine_held(loop, result):
            for t in threads:
                t.start()
            assert wait_until(lambda: loop._num_queued >= limit)
            with httpx.Client(base_url=url, timeout=30) as c:
                past = c.post("/v1/completions", headers=AUTH, json={"prompt": "hi"})
                assert_error(past, 503)
                assert past.headers["retry-after"] == "1"
                assert "limit-concurrency" in past.json()["error"]["message"]
                assert_error(c.get("/v1/models"), 401)        # no key: no place taken
                assert c.get("/health").status_code == 200
                assert c.get("/metrics", headers=AUTH).status_code == 200
        for t in threads:
            t.join(30)
        assert statuses == [200] * limit


@pytest.mark.parametrize("limit", [0, -1, 2.5])
def test_a_bad_limit_is_refused(limit):
    from kvmap.server.admission import AdmissionMiddleware
    with pytest.raises(ValueError, match="limit"):
        AdmissionMiddleware(None, limit)
