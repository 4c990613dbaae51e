"""The type checker in the test command: ``mypy --strict`` over the packages whose types are
the record's (``runs/``: the cell record and the typed views of its payloads, the run
store, the search's rules) and its reader (``report/``: 254 errors at 0d7f628, most of
them reads of payloads as dicts, before the views). A package is added here once it
checks clean."""
from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[1]
STRICT = ["src/kvmap/runs", "src/kvmap/report"]


def test_strict_packages_type_check(tmp_path):
    out, err, status = api.run(["--strict", "--follow-imports=silent",
                                "--ignore-missing-imports", "--no-error-summary",
                                "--cache-dir", str(tmp_path / "mypy"),
                                *(str(ROOT / p) for p in STRICT)])
    assert status == 0, out + err
