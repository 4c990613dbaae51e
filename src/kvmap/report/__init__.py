"""The trade-off map: readers of a stored run (``kvmap.bench.store.RunStore``) that draw
the report, pick the sweet spot for an SLA and fill the pre-launch checklist.

    load_run(run_dir)        -> Run           (loader.py: records and per-request rows)
    summarize(run)           -> [ConfigSummary] (configs.py: one per KV configuration)
    recommend(configs, ...)  -> Recommendation  (recommend.py)
    checklist(configs, ...)  -> {kv: [CheckItem]} (checklist.py)
    write_report(run_dir)    -> report.html     (html.py, plots.py, templates/)

Nothing here runs a model or measures anything: every figure comes from the run store.
"""
