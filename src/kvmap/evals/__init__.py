"""Accuracy tasks: each KV configuration against the full-precision full cache.

    evaluate("ppl", ["int8", "kivi(bits=2)"], EvalOptions(context_tokens=(1536,)))
    -> {"task": "ppl", "baseline": {"kv": "bf16", "metrics": {...}, "per_sample": [...]},
        "results": [{"kv": "int8", "metrics": {...}, "per_sample": [...]}, ...],
        "options": {...}, ...}

Tasks, one module each, registered in ``TASKS`` (``base.py``) when imported here
(``docs/evals.md`` says exactly what each measures): ``ppl`` (perplexity, KL, top-1 under
teacher forcing), ``passkey`` and ``needle`` (retrieval over a context-length x depth
grid), ``prompt_ppl`` (perplexity from prompt log-probabilities in one prefill, what an
OpenAI-compatible server returns), ``generation`` (greedy output stability),
``chat_generation`` (output-length inflation of answers that stop on their own), ``mc``
(multiple choice by log-likelihood from a JSONL file), ``qa`` (extractive QA scored by
exact match and token F1). Adding a task is one file with ``@TASKS.register``, one
import line below, and one test row.

The baseline is the model's own dtype as the KV codec (``bf16`` for a bf16 model) with
no selection policy; every result carries paired per-sample comparisons with it
(``stats``).
"""
from kvmap.evals.base import TASK_KINDS, TASKS, Column, EvalOptions, Task, TaskRun, get_task
from kvmap.evals import (chat_generation, generation, mc, needle, passkey,  # noqa: F401
                         ppl, prompt_ppl, qa)                    # -- fill TASKS
from kvmap.evals.evaluation import evaluate

__all__ = ["Column", "EvalOptions", "TASKS", "TASK_KINDS", "Task", "TaskRun", "evaluate",
           "get_task"]
