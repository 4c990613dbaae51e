"""The server's Prometheus metrics: vLLM's names and buckets where vLLM has the metric,
``kvmap:`` names for what it lacks (tiers, evictions, the active KV configuration,
process resources, adaptive switches).

All metrics live in one ``CollectorRegistry`` per server (tests build several servers in
one process). Label ``model_name`` (and ``engine``, always "0") as vLLM v1 has them.

Who writes what: the engine thread observes per-token and per-request histograms as it
publishes outputs, and calls ``update_engine_state`` after each step with the cumulative
counters of every engine it runs; engines are replaced by the adaptive controller, so
counters advance by each engine's own delta and never go down. Process RSS and CPU are
read from psutil when scraped. The page is built in a worker thread
(``render_off_loop``), off the event loop that streams tokens.
"""
from __future__ import annotations

import asyncio
import os

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvmap.hardware.process import proc_io
from kvmap.metrics import percentile
from kvmap.server.engine_state import engine_state, tier_windows

# vLLM v1 (vllm/v1/metrics/loggers.py) bucket boundaries, seconds
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                             40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
SUCCESS_REASONS = ("stop", "length")       # aborted requests are not successes
LABELS = ("model_name", "engine")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class _ProcessCollector:
    """kvmap:process_* from psutil, read at scrape time."""

    def __init__(self):
        self.process = psutil.Process(os.getpid())

    def collect(self):
        with self.process.oneshot():
            rss = self.process.memory_info().rss
            cpu = self.process.cpu_times()
            threads = self.process.num_threads()
        yield GaugeMetricFamily("kvmap:process_resident_memory_bytes",
                                "Resident set size of the server process.", value=rss)
        yield CounterMetricFamily("kvmap:process_cpu_seconds",
                                  "User + system CPU time of the server process.",
                                  value=cpu.user + cpu.system)
        yield GaugeMetricFamily("kvmap:process_threads", "Threads of the server process.",
                                value=threads)
        io = proc_io()                   # disk IO of the process; absent off Linux
        if io:
            yield CounterMetricFamily("kvmap:process_disk_read_bytes",
                                      "Bytes the server process read from storage.",
                                      value=io["disk_read_bytes"])
            yield CounterMetricFamily("kvmap:process_disk_written_bytes",
                                      "Bytes the server process wrote to storage.",
                                      value=io["disk_write_bytes"])


class _TierPercentileCollector:
    """kvmap:kv_tier_read_p99_seconds, computed when scraped from the windows the last
    tick handed over (``windows``: tier -> the latency deques of every live engine)."""

    def __init__(self, labels: tuple[str, str]):
        self.labels = labels
        self.windows: dict[str, list] = {}

    def collect(self):
        family = GaugeMetricFamily("kvmap:kv_tier_read_p99_seconds",
                                   "P99 block read latency of a tier (recent reads).",
                                   labels=[*LABELS, "tier"])
        for tier, deques in sorted(self.windows.items()):
            p99s = [percentile(_snapshot(d), 99) for d in deques]
            finite = [p for p in p99s if p is not None and p == p]
            family.add_metric([*self.labels, tier], max(finite, default=0.0))
        yield family


def _snapshot(window) -> list[float]:
    """A copy of a deque another thread appends to (``list(deque)`` copies in C under the
    GIL; the retry is for interpreters where it would not)."""
    for _ in range(3):
        try:
            return list(window)
        except RuntimeError:
            continue
    return []


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int):
        self.registry = r = CollectorRegistry()
        self.labels = (model_name, "0")
        lv = self.labels

        def counter(name, doc, extra=()):
            return Counter(name, doc, LABELS + tuple(extra), registry=r)

        def gauge(name, doc, extra=()):
            return Gauge(name, doc, LABELS + tuple(extra), registry=r)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r).labels(*lv)

        self._add_vllm_metrics(counter, gauge, histogram, max_model_len)
        self._add_kvmap_metrics(counter, gauge)
        r.register(_ProcessCollector())
        self._seen: dict[tuple[int, str], float] = {}   # (engine id, counter) -> last value
        self._configs: set[str] = set()

    def _add_vllm_metrics(self, counter, gauge, histogram, max_model_len: int) -> None:
        """vLLM v1's names, help texts and buckets."""
        lv = self.labels
        self.num_running = gauge("vllm:num_requests_running",
                                 "Number of requests in model execution batches.").labels(*lv)
        self.num_waiting = gauge("vllm:num_requests_waiting",
                                 "Number of requests waiting to be processed.").labels(*lv)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.").labels(*lv)
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried "
                                      "tokens.").labels(*lv)
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached "
                                   "tokens.").labels(*lv)
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.").labels(*lv)
        self.prompt_tokens = counter("vllm:prompt_tokens",
                                     "Number of prefill tokens processed.").labels(*lv)
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.").labels(*lv)
        success = counter("vllm:request_success", "Count of successfully processed requests.",
                          ("finished_reason",))
        self.success = {reason: success.labels(*lv, reason) for reason in SUCCESS_REASONS}
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens",
                                               "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.",
                                                   token_buckets)
        self.request_max_tokens = histogram("vllm:request_params_max_tokens",
                                            "Histogram of the max_tokens request parameter.",
                                            token_buckets)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS_S)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              ITL_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS_S)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    REQUEST_LATENCY_BUCKETS_S)
        self.inference_time = histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.",
                                        REQUEST_LATENCY_BUCKETS_S)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.",
                                      REQUEST_LATENCY_BUCKETS_S)
        self.decode_time = histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.",
                                     REQUEST_LATENCY_BUCKETS_S)

    def _add_kvmap_metrics(self, counter, gauge) -> None:
        """What vLLM lacks: tiers, evictions, the KV configuration, faults."""
        lv, r = self.labels, self.registry
        self.aborted = counter("kvmap:request_aborted",
                               "Requests aborted before finishing (client disconnect, "
                               "server shutdown).").labels(*lv)
        self.rejected = counter("kvmap:request_rejected",
                                "Requests refused before reaching the engine, by HTTP status.",
                                ("status",))
        self.resident_bytes = gauge("kvmap:kv_resident_bytes",
                                    "KV bytes resident per tier (pool = the paged pool of "
                                    "all engines).", ("tier",))
        self.capacity_bytes = gauge("kvmap:kv_capacity_bytes",
                                    "KV capacity in bytes per tier.", ("tier",))
        self.tier_hits = counter("kvmap:kv_tier_hits", "Block lookups found in a tier.",
                                 ("tier",))
        self.tier_misses = counter("kvmap:kv_tier_misses", "Block lookups missed in a tier.",
                                   ("tier",))
        self.tier_io = counter("kvmap:kv_tier_io_seconds",
                               "Wall seconds spent reading and writing a tier.", ("tier",))
        self.tier_bytes_read = counter("kvmap:kv_tier_read_bytes", "Bytes read from a tier.",
                                       ("tier",))
        self.tier_bytes_written = counter("kvmap:kv_tier_written_bytes",
                                          "Bytes written to a tier.", ("tier",))
        self.waste_bytes = gauge("kvmap:kv_waste_bytes", "KV slots allocated but holding no "
                                 "token (partly filled last blocks), in bytes.").labels(*lv)
        self.tier_read_p99 = _TierPercentileCollector(self.labels)
        r.register(self.tier_read_p99)
        self.evicted_tokens = counter("kvmap:kv_evicted_tokens",
                                      "Tokens dropped from the KV cache by a selection "
                                      "policy.").labels(*lv)
        self.kv_config = gauge("kvmap:kv_config_info",
                               "The KV configuration new requests get (1) and others seen (0).",
                               ("kv",))
        self.switches = counter("kvmap:kv_config_switches",
                                "Adaptive KV configuration switches.").labels(*lv)
        self.engines = gauge("kvmap:engines", "Engines alive (active + draining after an "
                             "adaptive switch).").labels(*lv)
        self.failed = counter("kvmap:request_failed",
                              "Requests failed by a fault pinned on them in the engine "
                              "(the server went on).").labels(*lv)
        self.timeouts = counter("kvmap:request_timeouts",
                                "Requests aborted at the server's request timeout.").labels(*lv)
        self.engine_restarts = counter("kvmap:engine_restarts",
                                       "Engines rebuilt over the same weights after an "
                                       "internal fault.").labels(*lv)

    # ---- engine thread ------------------------------------------------------------------
    def set_active_config(self, spec: str) -> None:
        for old in self._configs:
            self.kv_config.labels(*self.labels, old).set(0)
        self._configs.add(spec)
        self.kv_config.labels(*self.labels, spec).set(1)

    def _advance(self, engine_id: int, key: str, value: float, metric) -> None:
        last = self._seen.get((engine_id, key), 0)
        if value > last:
            metric.inc(value - last)
        self._seen[(engine_id, key)] = max(value, last)

    def forget_engine(self, engine_id: int) -> None:
        self._seen = {k: v for k, v in self._seen.items() if k[0] != engine_id}

    def update_engine_state(self, engines: list, num_waiting: int) -> None:
        """``engines``: every live ``Engine``; reads their counters (``engine_state``,
        engine thread only) and hands the tier latency windows to the scrape-time
        percentile collector. ``num_waiting``: requests not yet scheduled, queue
        included."""
        running = resident = capacity = waste = 0
        usage_of_active = 0.0
        tiers: dict[str, list[int]] = {}
        windows: dict[str, list] = {}
        for i, engine in enumerate(engines):
            u = engine_state(engine)
            eid = id(engine)
            running += u.num_running
            resident += u.resident_bytes
            capacity += u.capacity_bytes
            waste += u.waste_bytes
            if i == 0:
                usage_of_active = u.usage
            block = engine.kv.block_size
            self._advance(eid, "preemptions", u.num_preemptions, self.preemptions)
            self._advance(eid, "prefix_queries", u.prefix_cache_queries * block,
                          self.prefix_queries)
            self._advance(eid, "prefix_hits", u.prefix_cache_hits * block, self.prefix_hits)
            self._advance(eid, "evicted", u.num_evicted_tokens, self.evicted_tokens)
            for tier, t in u.tiers.items():
                agg = tiers.setdefault(tier, [0, 0])
                agg[0] += t.resident_bytes
                agg[1] += t.capacity_bytes
                lv = (*self.labels, tier)
                self._advance(eid, f"{tier}.hits", t.num_hits, self.tier_hits.labels(*lv))
                self._advance(eid, f"{tier}.misses", t.num_misses,
                              self.tier_misses.labels(*lv))
                self._advance(eid, f"{tier}.io", t.io_s, self.tier_io.labels(*lv))
                self._advance(eid, f"{tier}.read", t.bytes_read,
                              self.tier_bytes_read.labels(*lv))
                self._advance(eid, f"{tier}.written", t.bytes_written,
                              self.tier_bytes_written.labels(*lv))
            for tier, window in tier_windows(engine).items():
                windows.setdefault(tier, []).append(window)
        self.waste_bytes.set(waste)
        self.num_running.set(running)
        self.num_waiting.set(num_waiting)
        self.kv_usage.set(usage_of_active)
        self.engines.set(len(engines))
        self.resident_bytes.labels(*self.labels, "pool").set(resident)
        self.capacity_bytes.labels(*self.labels, "pool").set(capacity)
        for tier, (tier_resident, tier_capacity) in tiers.items():
            lv = (*self.labels, tier)
            self.resident_bytes.labels(*lv).set(tier_resident)
            self.capacity_bytes.labels(*lv).set(tier_capacity)
        self.tier_read_p99.windows = windows

    def observe_tokens(self, num_new_tokens: int, itls_s: list[float],
                       ttft_s: float | None, num_prompt_tokens: int = 0) -> None:
        """New tokens of one request: with its first token, its TTFT and its prompt
        tokens; the inter-token latencies of the others. (vLLM counts prompt and
        generation tokens as they are processed, aborted requests included.)"""
        self.generation_tokens.inc(num_new_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            self.prompt_tokens.inc(num_prompt_tokens)
        for itl in itls_s:
            self.itl.observe(itl)

    def observe_finished(self, metrics, finish_reason: str, max_tokens: int) -> None:
        """A finished request's ``RequestMetrics``; aborted ones count only as aborted."""
        if finish_reason not in SUCCESS_REASONS:
            self.aborted.inc()
            return
        m = metrics
        n_out = m.num_output_tokens
        self.success[finish_reason].inc()
        self.request_prompt_tokens.observe(m.num_prompt_tokens)
        self.request_generation_tokens.observe(n_out)
        self.request_max_tokens.observe(max_tokens)
        if m.finished_s is not None:
            self.e2e.observe(m.finished_s - m.arrival_s)
        if m.first_scheduled_s is not None:
            self.queue_time.observe(m.first_scheduled_s - m.arrival_s)
            if m.finished_s is not None:
                self.inference_time.observe(m.finished_s - m.first_scheduled_s)
            if m.token_times_s:
                self.prefill_time.observe(m.token_times_s[0] - m.first_scheduled_s)
        if n_out > 1:
            decode_s = m.token_times_s[-1] - m.token_times_s[0]
            self.decode_time.observe(decode_s)
            self.tpot.observe(decode_s / (n_out - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def render_off_loop(self) -> bytes:
        """``render`` in a worker thread: building the page (every family, the psutil
        and tier-percentile collectors) takes milliseconds that on the event loop would
        delay the token streams it also serves. The metrics are already written from
        the engine thread, under prometheus_client's own locks."""
        return await asyncio.to_thread(self.render)
