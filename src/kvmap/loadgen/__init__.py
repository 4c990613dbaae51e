"""``kvmap loadgen``: an HTTP load generator for any OpenAI-compatible server.

    client.py     one streaming request, timed chunk by chunk; failures by kind
    stream.py     reading the response: SSE events, content chunks, usage, error bodies
    prompts.py    the workload (preset or trace) as text prompts, and the tokenizer
    summary.py    the table of a load run, from its cell records
    schedule.py   load levels (rate, concurrency, step load) and the plan of one run
    runner.py     drive a plan with asyncio, bounded in count and in time
    results.py    raw results -> vLLM-defined metrics and run-store rows
    server_metrics.py  scrape the server's Prometheus /metrics, histogram deltas
    scenario.py   what a loadgen run is, for the run store (fingerprint, metadata)
    sweep.py      run every level into a run directory (one cell per level or phase)
    command.py    the ``kvmap loadgen`` command

``docs/loadgen.md`` is the user's guide.
"""
