"""OpenAI-compatible HTTP serving: ``kvmap serve``.

- ``protocol``: request/response models with vLLM's field names.
- ``errors``: the ``{"error": {...}}`` shape and the status of each failure.
- ``detokenize``: streaming text deltas that never split a character or leak a stop string.
- ``engine_loop``: the engine(s) stepping in a background thread, per-request asyncio queues.
- ``adaptive``: the policy file and the hysteresis controller that picks a KV configuration.
- ``metrics``: the Prometheus registry (``vllm:`` names and buckets, ``kvmap:`` extras).
- ``app``: the FastAPI app factory; ``command``: the CLI.
"""
