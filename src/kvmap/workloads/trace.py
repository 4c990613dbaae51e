"""Replay a request trace from JSONL.

One JSON object per line (blank lines are skipped, unknown fields ignored)::

    {"arrival_s": 0.25, "prompt": "Summarize ...", "max_tokens": 128}
    {"arrival_s": 0.90, "prompt_tokens": 1500, "max_tokens": 64}

- ``arrival_s``: seconds from the start of the run, finite and >= 0.
- exactly one of ``prompt`` (non-empty text) or ``prompt_tokens`` (an integer >= 1: the
  bench fills it with that many tokens of corpus text, as for the synthetic workloads).
- ``max_tokens``: integer >= 1.

Entries come back sorted by ``arrival_s`` (stable, so equal times keep file order); each
remembers its line number. Every error is a ``ValueError`` naming the file, the line and
the field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kvmap.workloads.files import jsonl_records, require_file


@dataclass(frozen=True)
class TraceEntry:
    line_no: int
    arrival_s: float
    max_tokens: int
    prompt: str | None = None
    prompt_tokens: int | None = None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_entry(record: object, where: str, line_no: int) -> TraceEntry:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "arrival_s" not in record:
        raise ValueError(f"{where}: missing field 'arrival_s'")
    arrival_s = record["arrival_s"]
    if not isinstance(arrival_s, (int, float)) or isinstance(arrival_s, bool) \
            or not math.isfinite(arrival_s) or arrival_s < 0:
        raise ValueError(f"{where}: field 'arrival_s'={arrival_s!r} must be a finite "
                         "number of seconds >= 0")
    if "max_tokens" not in record:
        raise ValueError(f"{where}: missing field 'max_tokens'")
    max_tokens = record["max_tokens"]
    if not _is_int(max_tokens) or max_tokens < 1:
        raise ValueError(f"{where}: field 'max_tokens'={max_tokens!r} must be an integer >= 1")
    has_prompt, has_tokens = "prompt" in record, "prompt_tokens" in record
    if has_prompt == has_tokens:
        raise ValueError(f"{where}: needs exactly one of the fields 'prompt' or "
                         "'prompt_tokens'")
    prompt = record.get("prompt")
    if has_prompt and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError(f"{where}: field 'prompt' must be a non-empty string")
    prompt_tokens = record.get("prompt_tokens")
    if has_tokens and (not _is_int(prompt_tokens) or prompt_tokens < 1):
        raise ValueError(f"{where}: field 'prompt_tokens'={prompt_tokens!r} must be an "
                         "integer >= 1")
    return TraceEntry(line_no, float(arrival_s), max_tokens, prompt, prompt_tokens)


def parse_trace_lines(lines: Iterable[str], source: str = "<trace>") -> list[TraceEntry]:
    """Parse JSONL lines (``source`` names them in errors); sorted by arrival."""
    entries = []
    locate = lambda n: f"{source} line {n}"  # noqa: E731
    for line_no, record in jsonl_records(lines, locate):
        entries.append(_parse_entry(record, locate(line_no), line_no))
    if not entries:
        raise ValueError(f"trace {source!r} has no requests")
    return sorted(entries, key=lambda e: e.arrival_s)


def load_trace(path: str | Path) -> list[TraceEntry]:
    """Read and validate a JSONL trace file; see the module docstring for the format."""
    path = require_file(path, "trace file")
    with path.open(encoding="utf-8") as f:
        return parse_trace_lines(f, source=str(path))
