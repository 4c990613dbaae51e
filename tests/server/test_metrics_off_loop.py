"""``GET /metrics`` builds its page in a worker thread, not on the event loop that streams
tokens, and the page is the one ``ServerMetrics.render`` builds."""
from __future__ import annotations

import asyncio
import threading

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import random_prompts
from tests.server.conftest import start_server


def samples(text: str) -> dict:
    """(name, labels) -> value, without the process gauges (they move on their own)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if not s.name.startswith("kvmap:process_")}


def test_the_page_is_built_off_the_event_loop_and_unchanged():
    server = start_server()
    try:
        metrics = server.loop.metrics
        with server.client() as c:
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": random_prompts([8])[0],
                                                "max_tokens": 3})
            assert r.status_code == 200, r.text
        # the engine's counters reach the metrics on the loop's 0.1 s tick: take them
        # now, so that a tick between the two renders changes nothing
        server.call(lambda loop: loop.metrics.update_engine_state(loop.engines, 0))
        want = samples(metrics.render().decode())
        where = []
        real_render = metrics.render

        def render():
            try:
                asyncio.get_running_loop()
                on_loop = True
            except RuntimeError:
                on_loop = False
            where.append((on_loop, threading.current_thread().name))
            return real_render()

        metrics.render = render
        with server.client() as c:
            r = c.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert len(where) == 1 and where[0][0] is False, where
        got = samples(r.text)
        assert got == want
        assert got[("vllm:generation_tokens_total", (("engine", "0"), ("model_name", "tiny")))] \
            >= 3
    finally:
        server.close()
