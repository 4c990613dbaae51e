"""Fixtures for the tier tests: dedicated redis-server processes on loopback ports.

Each server is a child process of the test run (no persistence, no daemonizing), so a
test can kill, pause and restart it. Tests that need one are marked ``redis`` and are
skipped, with the reason, when no redis-server binary is on PATH
(``scripts/redis.sh start`` installs one).
"""
from __future__ import annotations

import importlib.util
import shutil
import signal
import socket
import subprocess
import time

import pytest

REDIS_SERVER = shutil.which("redis-server")
SKIP_REASON = (
    "no redis-server on PATH; install it with `scripts/redis.sh start`"
    if REDIS_SERVER is None else
    "redis-py is not installed; `pip install redis`"
    if importlib.util.find_spec("redis") is None else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server child on 127.0.0.1:``port``; start/kill/pause/resume it."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 5.0) -> "RedisServer":
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case it is paused
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture(scope="session")
def redis_url():
    """A redis-server shared by the tier matrix; each tier uses its own key prefix."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    server = RedisServer().start()
    yield server.url
    server.kill()


@pytest.fixture
def redis_server():
    """A redis-server of the test's own, which the test may kill and restart."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    server = RedisServer().start()
    yield server
    server.kill()
