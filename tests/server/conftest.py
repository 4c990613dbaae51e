"""A real uvicorn server on a free loopback port, in a thread of the test process.

``start_server(**options)`` builds the app with ``kvmap.server.command.build_server``
(default: the tiny random-weight Llama in fp32, served as "tiny") and returns a
``RunningServer`` with its base ``url``, its ``loop`` (the ``EngineLoop``) and ``call``
(run a function in the engine thread, e.g. to read the pool's free blocks).
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from kvmap.server.header_timeout import header_timeout_protocol
from kvmap.server.limits import DEFAULT_HEADER_TIMEOUT_S

TINY = dict(model="dummy:tiny", kv="fp32", dtype="fp32", num_blocks=256, block_size=4,
            max_num_batched_tokens=64, served_model_name="tiny")


class RunningServer:
    def __init__(self, app, loop):
        self.app, self.loop = app, loop
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # the HTTP protocol of ``kvmap serve`` (a deadline on header blocks)
        self.server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning",
            http=header_timeout_protocol(DEFAULT_HEADER_TIMEOUT_S)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 60), **kwargs)

    def call(self, fn):
        """``fn(engine_loop)`` in the engine thread; its result."""
        event_loop = self.server.servers[0].get_loop()     # uvicorn's loop, in self.thread
        return asyncio.run_coroutine_threadsafe(self.loop.call(fn),
                                                event_loop).result(timeout=30)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def build_tiny(**options):
    """``build_server`` over ``TINY`` and ``options`` (``EngineArgs`` and ``ServerArgs``
    fields): ``(app, loop)``."""
    from dataclasses import fields

    from kvmap.config import EngineArgs
    from kvmap.server.args import ServerArgs
    from kvmap.server.command import build_server
    kwargs = {**TINY, **options}
    engine = EngineArgs(**{f.name: kwargs.pop(f.name) for f in fields(EngineArgs)
                           if f.name in kwargs})
    server = ServerArgs(**kwargs)           # a keyword of neither is a TypeError here
    return build_server(engine, server)


def start_server(**options) -> RunningServer:
    """``options``: ``EngineArgs`` and ``ServerArgs`` fields."""
    return RunningServer(*build_tiny(**options))


@contextmanager
def held_engine(server: RunningServer, max_hold_s: float = 30.0):
    """The engine thread is held in a ``call`` (nothing is scheduled) inside the block."""
    entered, gate = threading.Event(), threading.Event()

    def hold(loop):
        entered.set()
        gate.wait(max_hold_s)
    blocker = threading.Thread(target=server.call, args=(hold,))
    blocker.start()
    try:
        assert entered.wait(10)
        yield
    finally:
        gate.set()
        blocker.join()


def metric(server: RunningServer, name: str, **labels) -> float | None:
    """The first sample of ``name`` on ``/metrics`` whose labels include ``labels``."""
    with server.client() as c:
        text = c.get("/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def aborted_count(server: RunningServer) -> float:
    return metric(server, "kvmap:request_aborted_total") or 0.0


def free_blocks(server: RunningServer) -> int:
    return server.call(lambda loop: sum(e.kv.pool.num_free for e in loop.engines))


@pytest.fixture(scope="module")
def tiny_server():
    server = start_server()
    yield server
    server.close()
