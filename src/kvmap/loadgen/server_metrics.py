"""What the server says about itself: its Prometheus ``/metrics`` and ``/v1/models``.

A ``Scrape`` is one read of ``/metrics`` (``{(name, labels): value}``); the difference of
two scrapes taken around a load level gives the server's own view of that level: the mean
of each latency histogram (``_sum`` / ``_count`` deltas, summed over label sets) and the
increase of counters. Names are vLLM's (``vllm:time_to_first_token_seconds`` ...); a
server without ``/metrics`` (or with other names) just yields ``None`` there.

The server's histogram starts its clock when the request reaches the engine and stops it
when the token leaves the engine; the load generator's clock also holds the HTTP request,
the JSON parsing and the SSE write and read, so its TTFT is a little longer (the offset is
reported as ``ttft_mean_offset_s``).
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
_KV_LABELS = ("kv", "kv_config", "config")


@dataclass(frozen=True)
class Scrape:
    """One parsed ``/metrics`` page: sample (name, sorted label items) -> value."""

    samples: dict

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
        return cls(samples)

    def total(self, name: str) -> float | None:
        """The sum of ``name`` over all its label sets; None when absent."""
        values = [v for (n, _), v in self.samples.items() if n == name]
        return sum(values) if values else None

    def labelled(self, name: str) -> dict[tuple, float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}

    def kv_config(self) -> str | None:
        """The active KV configuration, from an info-style sample with a ``kv`` label
        (``kvmap:kv_config_info{kv="int8"} 1``) set to a non-zero value."""
        for (name, labels), value in sorted(self.samples.items()):
            if not name.startswith("kvmap:") or not value:
                continue
            found = dict(labels)
            for key in _KV_LABELS:
                if found.get(key):
                    return found[key]
        return None


def _delta(before: Scrape, after: Scrape, name: str) -> float | None:
    a, b = after.total(name), before.total(name)
    if a is None:
        return None
    return a - (b or 0.0)


def histogram_mean(before: Scrape, after: Scrape, metric: str) -> tuple[float | None, int]:
    """``(mean, count)`` of the observations a histogram got between two scrapes."""
    for name in HISTOGRAMS[metric]:
        count = _delta(before, after, f"{name}_count")
        total = _delta(before, after, f"{name}_sum")
        if count is not None and total is not None:
            return (total / count if count > 0 else None), int(count)
    return None, 0


def server_view(before: Scrape | None, after: Scrape | None) -> dict | None:
    """The server's own numbers for what happened between ``before`` and ``after``:
    histogram means and counts, finished requests by reason, and every ``kvmap:``
    counter that grew (``*_total``). None when either scrape is missing."""
    if before is None or after is None:
        return None
    view: dict = {}
    for metric in HISTOGRAMS:
        mean, count = histogram_mean(before, after, metric)
        view[f"{metric}_mean_s"], view[f"num_{metric}_observations"] = mean, count
    finished = {}
    for labels, value in after.labelled("vllm:request_success_total").items():
        grown = value - before.labelled("vllm:request_success_total").get(labels, 0.0)
        reason = dict(labels).get("finished_reason", "")
        finished[reason] = finished.get(reason, 0) + int(grown)
    view["num_finished_by_reason"] = finished
    grown_counters = {}
    for name in sorted(after.names()):
        if name.startswith("kvmap:") and name.endswith("_total"):
            delta = _delta(before, after, name)
            if delta:
                grown_counters[name] = delta
    view["kvmap_counters"] = grown_counters
    view["kv"] = after.kv_config()
    return view


def agreement(loadgen_mean_s: float | None, server_mean_s: float | None) -> dict:
    """How the client's mean compares with the server's: ratio and offset (client - server)."""
    if loadgen_mean_s is None or server_mean_s is None or not server_mean_s > 0 \
            or not math.isfinite(loadgen_mean_s):
        return {"ratio": None, "offset_s": None}
    return {"ratio": loadgen_mean_s / server_mean_s,
            "offset_s": loadgen_mean_s - server_mean_s}


async def fetch_metrics(session: aiohttp.ClientSession, root: str, timeout_s: float = 5.0,
                        *, path: str = "/metrics", headers: dict | None = None) -> str | None:
    """The text of ``<root><path>``; None when the server has none (or cannot say)."""
    try:
        async with session.get(f"{root}{path}", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


def parse_metrics(text: str | None) -> Scrape | None:
    """``Scrape.parse(text)``; None for no text or text that is not Prometheus."""
    if text is None:
        return None
    try:
        return Scrape.parse(text)
    except ValueError:
        return None


async def scrape(session: aiohttp.ClientSession, root: str, timeout_s: float = 5.0, *,
                 path: str = "/metrics", headers: dict | None = None) -> Scrape | None:
    """Read and parse ``<root><path>``; None when the server has none (or it is not
    Prometheus). The parse runs in a worker thread, off the event loop; during a load
    level the sweep only fetches (``fetch_metrics``) and parses after the level."""
    text = await fetch_metrics(session, root, timeout_s, path=path, headers=headers)
    return None if text is None else await asyncio.to_thread(parse_metrics, text)


async def served_models(session: aiohttp.ClientSession, root: str, timeout_s: float = 10.0,
                        *, headers: dict | None = None) -> list[dict] | None:
    """The ``data`` list of ``<root>/v1/models``; None when unreachable or not that shape.

    ``aiohttp.ClientConnectorError`` propagates: the caller says the server is down."""
    try:
        async with session.get(f"{root}/v1/models", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return None
            obj = await resp.json(content_type=None)
    except aiohttp.ClientConnectorError:
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    data = obj.get("data") if isinstance(obj, dict) else None
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else None
