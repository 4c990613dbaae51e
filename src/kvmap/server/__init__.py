"""OpenAI-compatible HTTP serving: ``kvmap serve``.

- ``protocol``: request/response models with vLLM's field names.
- ``errors``: the ``{"error": {...}}`` shape and the status of each failure.
- ``limits``: what one request may ask (body, prompt, stop list, timeout).
- ``security``: the API key and the loopback Host check.
- ``context`` and ``routes/``: the endpoints (completions, chat, models, health and
  metrics, tokenize), their shared checks, tokenization off the event loop.
- ``logprobs``: completions' log-probabilities, scored on an engine of their own.
- ``detokenize``: streaming text deltas that never split a character or leak a stop string.
- ``messages``, ``request_stream``: what crosses between the event loop and the engine
  thread (one frozen dataclass per command; a deadline on every wait).
- ``engine_loop``, ``publisher``, ``engine_faults``, ``engine_state``: the engine(s)
  stepping in a background thread, the requests they serve, what a fault means
  (fail a request, or restart the engine), what the metrics read each tick.
- ``adaptive``, ``adaptive_switch``: the policy file, the hysteresis controller, a switch.
- ``metrics``: the Prometheus registry (``vllm:`` names and buckets, ``kvmap:`` extras).
- ``transport``: body limit, SSE, collecting a request's deltas.
- ``app``: the FastAPI app factory; ``command``: the CLI.
"""
