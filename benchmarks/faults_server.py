"""The server's part of the fault benchmark: what the fault tests assert, measured.

    python benchmarks/faults_server.py [--quick] [--model M]

Against ``kvmap serve`` in a child process (default: the embedded SmolLM2-135M; with
``--quick`` the random-weight ``dummy:tiny``):

- **overload**: 10x the queue bound (``--max-queue``) of concurrent requests at once;
  counts per status (503 expected, no other 5xx), whether every admitted request got
  all its tokens, and the server's RSS (sampled every 50 ms) before and at its peak;
- **hostile**: one streaming client runs while hostile bodies (huge stop lists, huge
  prompts, token ids out of range, deep JSON, wrong types) are sent; its largest gap
  between chunks, against the same stream's largest gap with no other traffic;
- **expensive**: the same stream while *valid* bodies that cost the most one request may
  (issue 28) are admitted: a long prompt scored with ``echo`` + ``logprobs: 20``, stop
  token ids and stop strings at their limits on long generations, a chat of
  ``--max-messages`` messages. Its largest gap is bounded by a step of the engine
  (prompts are prefilled in chunks of ``--max-num-batched-tokens`` between the stream's
  decode steps), not by the size of a request. To compare, ``step_probe`` prefills the
  same expensive prompts in-process, alone, with the server's engine settings, and
  records the longest engine step (``expensive.probe_longest_step_s``) and the test's
  bound, 3 x that + 1 s (``expensive.gap_bound_s``);
- **lockout** (issue 38): half-open connections (one header line, held) at twice the
  server's request limit, then ``/health`` and a completion: any non-200 is a lockout;
  and how many of those sockets the header timeout closed;
- **refused**: thousands of requests refused for a lone surrogate (in ``cache_salt``,
  the prompt, a chat message): the parameters their 400s named, the 5xx, and the
  server's RSS before and after (a leak would grow it by ~9 KB a request).
  The hostile bodies include lone surrogates too.

Prints a table and writes one JSON record under ``benchmarks/results/``
(``faults_server-*.json``; metrics keys: ``overload.*``, ``hostile.*``, ``expensive.*``,
``lockout.*``, ``refused.*``, ``requests_sent``, ``num_5xx``, ``num_wrong``,
``num_lockouts``). The fault tests themselves
(``tests/server/test_faults.py``, ``test_expensive_bodies.py``) assert correctness and
one generous, self-calibrated gap bound; the figures live here.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import aiohttp
import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402
from serve_load import Server  # noqa: E402


class RssSampler:
    def __init__(self, pid: int, interval_s: float = 0.05):
        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.process.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


async def complete(session, url: str, body: dict) -> tuple[int, dict | None]:
    """(status, JSON body or None: uvicorn's own 503 past ``limit_concurrency`` is
    plain text)."""
    async with session.post(f"{url}/v1/completions", json=body) as r:
        text = await r.text()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, None


async def stream_gaps(session, url: str, max_tokens: int) -> tuple[bool, float, int]:
    """(completed, largest gap between chunks in s, number of chunks)."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "return_token_ids": True}   # a chunk a token
    times, done = [], False
    async with session.post(f"{url}/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: "):
                times.append(time.perf_counter())
                done = done or line.strip() == b"data: [DONE]"
    gaps = [b - a for a, b in zip(times, times[1:])]
    return done, max(gaps, default=0.0), len(times)


def hostile_bodies() -> list[tuple[str, bytes]]:
    nested = "[" * 50_000 + "]" * 50_000
    bodies = [{"prompt": "hi", "stop": ["s"] * 10_000}, {"prompt": "hi", "stop": "x" * 10**5},
              {"prompt": "a" * (3 * 2**20)}, {"prompt": [2**40, 1]}, {"prompt": [-1]},
              {"prompt": "hi", "max_tokens": "many"}, {"prompt": {"a": [1]}}]
    out = [("/v1/completions", json.dumps(b).encode()) for b in bodies]
    out.append(("/v1/completions", ('{"prompt": ' + nested + "}").encode()))
    out.append(("/v1/chat/completions", json.dumps({"messages": [
        {"role": "user", "content": "z" * (3 * 2**20)}]}).encode()))
    return out + [(path, json.dumps(body).encode()) for path, body, _ in LONE_SURROGATES]


# bodies with a lone surrogate, and the parameter their 400 must name (issue 38)
LONE_SURROGATES = [
    ("/v1/completions", {"prompt": "Once upon", "cache_salt": "tenant-\ud800"},
     "cache_salt"),
    ("/v1/completions", {"prompt": "Once \udfff upon"}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \udc00"}]},
     "messages.0.content"),
    ("/tokenize", {"prompt": "\ud83d"}, "prompt"),
]
HALF_A_REQUEST = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"   # no blank line


def expensive_bodies(prompt_tokens: int, vocab: int = 40_000, num_messages: int = 1024
                     ) -> list[tuple[str, dict]]:
    """Valid bodies at this server's limits (its defaults: 64 stop token ids, 16 stop
    strings of 256 characters, 1,024 messages)."""
    long_prompt = [(7 * i) % (vocab - 3) + 3 for i in range(prompt_tokens)]
    return [
        ("/v1/completions", {"prompt": long_prompt, "max_tokens": 1, "echo": True,
                             "logprobs": 20, "temperature": 0}),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 64, "ignore_eos": True,
                             "stop_token_ids": list(range(vocab - 64, vocab))}),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 64, "ignore_eos": True,
                             "stop": [f"{i}" + "~" * 250 for i in range(16)]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]
                                  * num_messages, "max_tokens": 4}),
    ]


async def expensive(url: str, max_tokens: int, prompt_tokens: int, quick: bool) -> dict:
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        quiet = await stream_gaps(session, url, max_tokens)
        task = asyncio.ensure_future(stream_gaps(session, url, max_tokens))
        statuses, scored = Counter(), None
        start_s = time.perf_counter()
        for path, body in (expensive_bodies(prompt_tokens, 256, 16) if quick
                           else expensive_bodies(prompt_tokens)):
            async with session.post(f"{url}{path}", json=body) as r:
                statuses[r.status] += 1
                out = await r.json(content_type=None)
                if body.get("echo") and r.status == 200:
                    scored = len(out["choices"][0]["logprobs"]["token_logprobs"])
        bodies_s = time.perf_counter() - start_s
        busy = await task
    return {"requests_sent": sum(statuses.values()), "statuses": dict(statuses),
            "num_5xx": sum(v for k, v in statuses.items() if k >= 500),
            "scored_prompt_tokens": prompt_tokens, "scored_positions": scored,
            "bodies_s": bodies_s, "stream_completed": busy[0],
            "quiet_largest_gap_s": quiet[1], "largest_gap_s": busy[1],
            "num_chunks": busy[2]}


def step_probe(model: str | None, dtype: str, prompt_tokens: int, quick: bool) -> dict:
    """The longest ``Engine.step`` while the expensive bodies' two long prompts (the
    scored one, the chat) are prefilled in-process, one at a time, with the server's
    engine settings (``kvmap serve`` defaults: bf16 KV, 256 MiB, 512-token steps)."""
    from kvmap import LLM, SamplingParams
    llm = LLM(model, dtype=dtype, kv="fp32" if quick else "bf16", max_num_seqs=8,
              max_num_batched_tokens=512)
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))      # warm-up, not timed
    engine, steps = llm.engine, []
    step = engine.step

    def timed():
        start_s = time.perf_counter()
        try:
            return step()
        finally:
            steps.append(time.perf_counter() - start_s)
    engine.step = timed
    bodies = expensive_bodies(prompt_tokens, 256, 16) if quick else \
        expensive_bodies(prompt_tokens)
    scored, chat = bodies[0][1], bodies[3][1]
    llm.generate([scored["prompt"]], SamplingParams(max_tokens=1, logprobs=20,
                                                    prompt_logprobs=20))
    if llm.tokenizer is not None:           # a dummy model has no chat template here
        llm.chat([{"role": m["role"], "content": m["content"]} for m in chat["messages"]],
                 SamplingParams(max_tokens=chat["max_tokens"]))
    return {"probe_longest_step_s": max(steps), "probe_num_steps": len(steps),
            "gap_bound_s": 3 * max(steps) + 1.0}


async def overload(url: str, max_queue: int, max_tokens: int) -> dict:
    n = 10 * max_queue
    body = {"prompt": "The quick brown fox", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        results = await asyncio.gather(*(complete(session, url, body) for _ in range(n)))
    statuses = Counter(status for status, _ in results)
    wrong = sum(1 for status, out in results if status == 200
                and out["usage"]["completion_tokens"] != max_tokens)
    return {"requests_sent": n, "statuses": dict(statuses),
            "num_5xx_other_than_503": sum(v for k, v in statuses.items()
                                          if k >= 500 and k != 503),
            "num_admitted": statuses.get(200, 0), "num_admitted_wrong": wrong}


async def hostile(url: str, max_tokens: int) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        quiet = await stream_gaps(session, url, max_tokens)
        task = asyncio.ensure_future(stream_gaps(session, url, max_tokens))
        statuses = Counter()
        while not task.done():
            for path, raw in hostile_bodies():
                async with session.post(f"{url}{path}", data=raw,
                                        headers={"content-type": "application/json"}) as r:
                    statuses[r.status] += 1
                    await r.read()
                if task.done():
                    break
        busy = await task
    return {"requests_sent": sum(statuses.values()), "statuses": dict(statuses),
            "num_5xx": sum(v for k, v in statuses.items() if k >= 500),
            "stream_completed": busy[0], "quiet_largest_gap_s": quiet[1],
            "largest_gap_s": busy[1], "num_chunks": busy[2]}


def lockout(url: str, port: int, limit: int, header_timeout_s: float) -> dict:
    """Half-open sockets at 2 x ``limit``; then a probe and a completion."""
    import httpx
    socks = []
    for _ in range(2 * limit):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(HALF_A_REQUEST)
        socks.append(sock)
    try:
        time.sleep(0.5)                  # the server has accepted them all
        with httpx.Client(base_url=url, timeout=60) as c:
            health = c.get("/health").status_code
            completion = c.post("/v1/completions", json={"prompt": "Once upon a time",
                                                         "max_tokens": 4}).status_code
        deadline = time.monotonic() + header_timeout_s + 10
        closed = 0
        for sock in socks:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                closed += sock.recv(1) == b""
            except OSError:
                closed += 1
    finally:
        for sock in socks:
            sock.close()
    return {"half_open": 2 * limit, "limit": limit, "health_status": health,
            "completion_status": completion,
            "num_lockouts": (health != 200) + (completion != 200),
            "closed_by_header_timeout": closed}


async def refused(url: str, num: int) -> dict:
    statuses, params = Counter(), Counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        async def one(i: int) -> None:
            path, body, _ = LONE_SURROGATES[i % 3]
            async with session.post(f"{url}{path}", data=json.dumps(body).encode(),
                                    headers={"content-type": "application/json"}) as r:
                statuses[r.status] += 1
                out = await r.json(content_type=None)
                params[(out.get("error") or {}).get("param")] += 1
        for start in range(0, num, 64):
            await asyncio.gather(*(one(i) for i in range(start, min(num, start + 64))))
    named_right = sum(params[p] for _, _, p in LONE_SURROGATES[:3])
    return {"requests_sent": num, "statuses": dict(statuses),
            "params_named": {str(k): v for k, v in params.items()},
            "num_misnamed": num - named_right,
            "num_5xx": sum(v for k, v in statuses.items() if k >= 500)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-queue", type=int, default=8)
    parser.add_argument("--dtype", default="fp32", help="fp32: this CPU has no native "
                        "bf16 (docs: CALIBRATION); the server's own default otherwise")
    parser.add_argument("--prompt-tokens", type=int, default=2000,
                        help="the scored prompt of the expensive case")
    parser.add_argument("--refused", type=int, default=8000,
                        help="requests refused for a lone surrogate (the leak case)")
    args = parser.parse_args()
    model = args.model or ("dummy:tiny" if args.quick else None)
    max_tokens = 16 if args.quick else 32
    prompt_tokens = 400 if args.quick else args.prompt_tokens
    serve_args = ["--max-queue", str(args.max_queue), "--max-num-seqs", "8",
                  "--dtype", args.dtype]
    if model:
        serve_args += ["--model", model] + (["--kv", "fp32"]
                                            if model.startswith("dummy") else [])
    else:     # the 1,024-message chat (~6,200 tokens) must fit the pool in fp32 KV too
        serve_args += ["--kv-memory", "512MiB"]
    with Server(*serve_args) as server:
        with RssSampler(server.proc.pid) as rss:
            load = asyncio.run(overload(server.url, args.max_queue, max_tokens))
        load["rss_start_bytes"], load["rss_peak_bytes"] = rss.samples[0], max(rss.samples)
        rough = asyncio.run(hostile(server.url, max_tokens * 4))
        limit = args.max_queue + 8 + 64       # kvmap serve's default --limit-concurrency
        locked = lockout(server.url, server.port, limit, 10.0)
        process = psutil.Process(server.proc.pid)
        rss_before = process.memory_info().rss
        refusals = asyncio.run(refused(server.url, args.refused))
        refusals.update(rss_before_bytes=rss_before, rss_after_bytes=process.memory_info().rss)
        costly = asyncio.run(expensive(server.url, 400 if args.quick else max_tokens * 48,
                                       prompt_tokens,
                                       args.quick))
    costly.update(step_probe(model, args.dtype, prompt_tokens, args.quick))
    metrics = {"overload": load, "hostile": rough, "expensive": costly, "lockout": locked,
               "refused": refusals,
               "requests_sent": load["requests_sent"] + rough["requests_sent"]
               + costly["requests_sent"] + refusals["requests_sent"],
               "num_5xx": load["num_5xx_other_than_503"] + rough["num_5xx"]
               + costly["num_5xx"] + refusals["num_5xx"],
               "num_wrong": load["num_admitted_wrong"],
               "num_lockouts": locked["num_lockouts"]}
    table = Table(title="kvmap serve under faults")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in (("overload: requests", load["requests_sent"]),
                       ("overload: statuses", load["statuses"]),
                       ("overload: admitted with wrong token count",
                        load["num_admitted_wrong"]),
                       ("overload: RSS start / peak MiB",
                        f"{load['rss_start_bytes'] / 2**20:.0f} / "
                        f"{load['rss_peak_bytes'] / 2**20:.0f}"),
                       ("hostile: requests", rough["requests_sent"]),
                       ("hostile: statuses", rough["statuses"]),
                       ("hostile: stream completed", rough["stream_completed"]),
                       ("stream largest chunk gap quiet / hostile ms",
                        f"{rough['quiet_largest_gap_s'] * 1e3:.0f} / "
                        f"{rough['largest_gap_s'] * 1e3:.0f}"),
                       ("expensive: statuses", costly["statuses"]),
                       ("expensive: prompt scored (positions)",
                        f"{costly['scored_prompt_tokens']} ({costly['scored_positions']})"),
                       ("expensive: bodies took s", f"{costly['bodies_s']:.1f}"),
                       ("stream largest chunk gap quiet / expensive ms",
                        f"{costly['quiet_largest_gap_s'] * 1e3:.0f} / "
                        f"{costly['largest_gap_s'] * 1e3:.0f}"),
                       ("in-process longest step of those prompts ms; the test's "
                        "bound (3x + 1 s)",
                        f"{costly['probe_longest_step_s'] * 1e3:.0f}; "
                        f"{costly['gap_bound_s'] * 1e3:.0f}"),
                       ("lockout: half-open sockets (2 x limit)", locked["half_open"]),
                       ("lockout: /health, completion status",
                        f"{locked['health_status']}, {locked['completion_status']}"),
                       ("lockout: sockets closed by the header timeout",
                        locked["closed_by_header_timeout"]),
                       ("refused: requests, statuses", f"{refusals['requests_sent']}, "
                                                       f"{refusals['statuses']}"),
                       ("refused: params named", refusals["params_named"]),
                       ("refused: RSS before / after MiB",
                        f"{refusals['rss_before_bytes'] / 2**20:.0f} / "
                        f"{refusals['rss_after_bytes'] / 2**20:.0f}"),
                       ("5xx seen (503 of the queue bound excluded)", metrics["num_5xx"])):
        table.add_row(key, str(value))
    Console().print(table)
    path = write_record("faults_server", {"model": model or "smollm2",
                                          "max_queue": args.max_queue, "dtype": args.dtype,
                                          "max_tokens": max_tokens,
                                          "max_num_batched_tokens": 512,
                                          "prompt_tokens": prompt_tokens}, metrics)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
