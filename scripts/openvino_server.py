"""OpenVINO GenAI's continuous-batching pipeline behind the small OpenAI-compatible API
the bench's endpoints speak: ``/v1/completions`` (streamed or not, ``echo`` + ``logprobs``
for prompt log-probabilities, ``return_token_ids``, ``stop``, ``ignore_eos``),
``/v1/models``, ``/health`` and a Prometheus ``/metrics``.

OpenVINO GenAI ships no HTTP server of its own (OpenVINO Model Server is a separate
product), so this wrapper is the peer's front door: stdlib HTTP, one engine thread that
owns the ``ContinuousBatchingPipeline`` -- it adds requests, calls ``step()``, reads
each handle's new tokens and decodes them -- and hands text to the request threads.
It runs in the peer's own venv (``scripts/openvino.sh``), never imports kvmap, and is
started by a scenario's ``launch:`` (examples/peers.yaml).

    python scripts/openvino_server.py --model SmolLM2.gguf --port 8080 \
        --kv-precision u8 --num-kv-blocks 256 [--eviction 32,128,512]

``/metrics``: ``openvino:kv_cache_usage_ratio`` (the scheduler's cache usage, 0..1),
``openvino:kv_cache_size_bytes`` (what the pool holds: blocks x bytes per block at the
KV precision), ``openvino:requests_running``.
"""
from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import openvino as ov
import openvino_genai as og

PRECISIONS = ("u8", "u4", "bf16", "f16", "f32")


class Job:
    """One request in flight: what the engine thread pushes to the HTTP thread."""

    def __init__(self, prompt, config: og.GenerationConfig, echo: bool):
        self.prompt, self.config, self.echo = prompt, config, echo
        self.events: queue.Queue = queue.Queue()   # ("text", delta) | ("done", summary)


class Engine(threading.Thread):
    """Owns the pipeline; every OpenVINO call happens on this thread."""

    def __init__(self, pipe: og.ContinuousBatchingPipeline):
        super().__init__(daemon=True)
        self.pipe, self.tokenizer = pipe, pipe.get_tokenizer()
        self.incoming: queue.Queue = queue.Queue()
        self.active: dict[int, tuple] = {}
        self.next_id = 0
        self.metrics = {"usage": 0.0, "bytes": 0, "running": 0}

    def run(self) -> None:
        while True:
            self._admit(block=not self.active)
            if self.pipe.has_non_finished_requests():
                self.pipe.step()
            self._drain()
            m = self.pipe.get_metrics()
            self.metrics = {"usage": m.cache_usage / 100.0,
                            "bytes": m.kv_cache_size_in_bytes, "running": m.requests}

    def _admit(self, block: bool) -> None:
        while True:
            try:
                job = self.incoming.get(timeout=0.5) if block else self.incoming.get_nowait()
            except queue.Empty:
                return
            block = False
            ids = job.prompt if isinstance(job.prompt, list) else \
                [int(t) for t in self.tokenizer.encode(job.prompt).input_ids.data[0]]
            tensor = ov.Tensor(np.array([ids], dtype=np.int64))
            handle = self.pipe.add_request(self.next_id, tensor, job.config)
            self.active[self.next_id] = (job, handle, ids, [], [], "")
            self.next_id += 1

    def _drain(self) -> None:
        for rid in list(self.active):
            job, handle, ids, out, logprobs, text = self.active[rid]
            if handle.can_read():
                for output in handle.read().values():
                    new = list(output.generated_ids)
                    lps = list(output.generated_log_probs)
                    if job.echo and not out and not logprobs and len(new) > len(ids):
                        logprobs.extend([None] + lps[1:len(ids)])   # the prompt's own
                        new, lps = new[len(ids):], lps[len(ids):]
                    out.extend(new)
                    logprobs.extend(lps)
                full = self.tokenizer.decode(out) if out else ""
                if full.endswith("\ufffd") and not _finished(handle):
                    full = full[:len(text)]                     # wait for the whole char
                if len(full) > len(text):
                    job.events.put(("text", full[len(text):]))
                    text = full
                self.active[rid] = (job, handle, ids, out, logprobs, text)
            if _finished(handle):
                finish = "length" if len(out) >= job.config.max_new_tokens else "stop"
                job.events.put(("done", {"ids": ids, "out": out, "logprobs": logprobs,
                                         "text": text, "finish": finish}))
                del self.active[rid]


def _finished(handle) -> bool:
    return handle.get_status().name in ("FINISHED", "STOP", "CANCEL", "DROPPED_BY_PIPELINE",
                                        "DROPPED_BY_HANDLE", "IGNORED")


def generation_config(body: dict) -> og.GenerationConfig:
    config = og.GenerationConfig()
    config.max_new_tokens = int(body.get("max_tokens") or 16)
    config.do_sample = float(body.get("temperature", 0.0) or 0.0) > 0.0
    if config.do_sample:
        config.temperature = float(body["temperature"])
    config.ignore_eos = bool(body.get("ignore_eos", False))
    stop = body.get("stop")
    if stop:
        config.stop_strings = set([stop] if isinstance(stop, str) else stop)
    if body.get("echo"):
        config.echo, config.logprobs = True, max(1, int(body.get("logprobs") or 1))
    return config


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    model_name: str
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:        # no line per request
        pass

    def _json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.model_name,
                                                         "object": "model"}]})
        elif self.path == "/metrics":
            m = self.engine.metrics
            text = (f"openvino:kv_cache_usage_ratio {m['usage']}\n"
                    f"openvino:kv_cache_size_bytes {m['bytes']}\n"
                    f"openvino:requests_running {m['running']}\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            prompt = body["prompt"]
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            job = Job(prompt, generation_config(body), bool(body.get("echo")))
        except (ValueError, KeyError, TypeError) as e:
            self._json(400, {"error": {"message": f"bad request: {e}"}})
            return
        self.engine.incoming.put(job)
        if body.get("stream"):
            self._stream(job, body)
        else:
            self._whole(job, body)

    def _whole(self, job: Job, body: dict) -> None:
        while (event := job.events.get())[0] != "done":
            pass
        d = event[1]
        choice = {"index": 0, "text": d["text"], "finish_reason": d["finish"],
                  "token_ids": d["out"]}
        if job.echo:
            choice["logprobs"] = {"token_logprobs": d["logprobs"]}
        self._json(200, {"id": "cmpl-ov", "object": "text_completion", "model":
                         self.model_name, "choices": [choice], "usage": _usage(d)})

    def _stream(self, job: Job, body: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

        def send(obj) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()
        while True:
            kind, value = job.events.get()
            if kind == "text":
                send({"object": "text_completion", "model": self.model_name, "choices":
                      [{"index": 0, "text": value, "finish_reason": None}]})
                continue
            send({"object": "text_completion", "model": self.model_name, "choices":
                  [{"index": 0, "text": "", "finish_reason": value["finish"]}]})
            if (body.get("stream_options") or {}).get("include_usage"):
                send({"object": "text_completion", "choices": [], "usage": _usage(value)})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            return


def _usage(d: dict) -> dict:
    return {"prompt_tokens": len(d["ids"]), "completion_tokens": len(d["out"]),
            "total_tokens": len(d["ids"]) + len(d["out"])}


def build_pipeline(args) -> og.ContinuousBatchingPipeline:
    sc = og.SchedulerConfig()
    sc.num_kv_blocks = args.num_kv_blocks
    sc.max_num_seqs = args.max_num_seqs
    sc.max_num_batched_tokens = args.max_num_batched_tokens
    sc.enable_prefix_caching = args.prefix_caching
    if args.eviction:
        start, recent, most = (int(x) for x in args.eviction.split(","))
        sc.use_cache_eviction = True
        sc.cache_eviction_config = og.CacheEvictionConfig(
            start, recent, most, og.AggregationMode.NORM_SUM)
    properties = {"KV_CACHE_PRECISION": args.kv_precision,
                  "INFERENCE_NUM_THREADS": args.threads}
    if args.kv_precision == "f32":       # the CPU plugin pairs an f32 cache with f32 math
        properties["INFERENCE_PRECISION_HINT"] = "f32"
    return og.ContinuousBatchingPipeline(args.model, sc, "CPU", properties)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a GGUF file or an OpenVINO IR directory")
    p.add_argument("--served-model-name", default="smollm2")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--kv-precision", choices=PRECISIONS, default="u8")
    p.add_argument("--num-kv-blocks", type=int, default=256, help="blocks of the paged cache")
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--eviction", default=None,
                   help="START,RECENT,MAX tokens kept by OpenVINO's cache eviction (NORM_SUM)")
    args = p.parse_args()
    started = time.perf_counter()
    engine = Engine(build_pipeline(args))
    engine.start()
    Handler.engine, Handler.model_name = engine, args.served_model_name
    print(f"openvino_server: {args.model} kv={args.kv_precision} blocks={args.num_kv_blocks}"
          f" eviction={args.eviction} loaded in {time.perf_counter() - started:.1f} s; "
          f"listening on {args.host}:{args.port}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
