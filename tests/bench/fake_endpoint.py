"""A misbehaving OpenAI-compatible server for the endpoint fault tests (stdlib only).

    python tests/bench/fake_endpoint.py --port P --mode MODE

    ok           /health 200, /v1/models lists "fake", completions streamed as SSE
    nostream     answers a streamed completion with one JSON body, not Server-Sent Events
    nologprobs   completions work, but never carry log-probabilities
    vllmlogprobs refuses echo (400) but answers vLLM's prompt_logprobs: log p = -0.5 - 0.01 id
                 for the prompt's token (string "t<id>"), -9 for id 99999 (string "x")
    othermodel   /v1/models lists only "other-model"; completions 404 for "fake"
    notext       completions answer a choice without ``text`` (a chat-style ``message``)
    error        completions answer HTTP 500
    unhealthy    /health and /v1/models answer 503 forever
    exit         prints a line and exits with code 3 at once
    metrics      as ok, each streamed token 0.25 s apart, plus /metrics:
                 vllm:kv_cache_usage_perc = 0.1 x completions answered so far (at most 1)
                 and kvmap:fake_scrapes_total, the pages served
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = "ok"
COUNTS = {"completions": 0, "scrapes": 0}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if MODE == "unhealthy":
            return self._json(503, {"error": "loading"})
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if self.path == "/metrics" and MODE == "metrics":
            with LOCK:
                COUNTS["scrapes"] += 1
                usage = min(1.0, 0.1 * COUNTS["completions"])
                text = (f"vllm:kv_cache_usage_perc {usage}\n"
                        f"kvmap:fake_scrapes_total {COUNTS['scrapes']}\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return None
        if self.path == "/v1/models":
            ids = ["other-model"] if MODE == "othermodel" else ["fake"]
            return self._json(200, {"object": "list", "data": [{"id": i} for i in ids]})
        return self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if MODE == "othermodel":
            return self._json(404, {"error": {"message": f"model {body.get('model')!r} "
                                                         "not found"}})
        if MODE == "error":
            return self._json(500, {"error": {"message": "fake endpoint: out of memory"}})
        n = int(body.get("max_tokens") or 1)
        if MODE == "notext" and not body.get("stream"):
            return self._json(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"content": "7"}}]})
        choice = {"index": 0, "text": " 7" * n, "finish_reason": "length"}
        if MODE == "vllmlogprobs" and body.get("echo"):
            return self._json(400, {"error": {"message": "echo is not supported"}})
        if MODE == "vllmlogprobs" and "prompt_logprobs" in body:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": -0.5 - 0.01 * t, "rank": 1, "decoded_token": f"t{t}"},
                 "99999": {"logprob": -9.0, "rank": 2, "decoded_token": "x"}}
                for t in body["prompt"][1:]]
        usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
        if not body.get("stream") or MODE == "nostream":
            return self._json(200, {"choices": [choice], "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            event = {"choices": [{"index": 0, "text": " 7",
                                  "finish_reason": "length" if i == n - 1 else None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            if MODE == "metrics":
                self.wfile.flush()
                time.sleep(0.25)
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        with LOCK:
            COUNTS["completions"] += 1


def main() -> int:
    global MODE
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="ok")
    args = parser.parse_args()
    MODE = args.mode
    if MODE == "exit":
        print("fake endpoint: exiting on purpose", flush=True)
        return 3
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
