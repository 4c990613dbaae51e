"""The trade-off map: readers of a stored run (``kvmap.runs.store.RunStore``) that draw
the report, pick the sweet spot for an SLA and fill the pre-launch checklist.

    load_run(run_dir)        -> Run           (loader.py: records and per-request rows)
    summarize(run)           -> [ConfigSummary] (configs.py: one per KV configuration)
    recommend(configs, ...)  -> Recommendation  (recommend.py)
    checklist(configs, ...)  -> {kv: [CheckItem]} (checklist.py)
    write_report(run_dir)    -> report.html     (html.py, plots.py, interactive.py, templates/)

Beside them: loadcurve.py (load curves, SLA capacity), tasks.py and samples.py (accuracy
with its interval, negative-sample rate, length inflation), noise.py (throughput
intervals, parts that never acted, simplicity), slo.py (SLA keys read from request rows).

Nothing here runs a model or measures anything: every figure comes from the run store.
"""
