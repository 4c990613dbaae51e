"""A benchmark record names the code that ran (``benchmarks/common.code_state``): the
kvmap it imported -- a checkout on PYTHONPATH may not be the script's own -- that
checkout's commit, and its tracked files under src/ and benchmarks/ with uncommitted
changes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _git(repo: Path, *args: str) -> str:
    return subprocess.check_output(["git", "-c", "user.email=t@example.invalid",
                                    "-c", "user.name=t", *args], cwd=repo, text=True).strip()


def test_record_names_the_imported_checkout_and_its_changes(tmp_path):
    repo = tmp_path / "other"
    pkg = repo / "src" / "kvmap"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (repo / "README").write_text("x\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "c")
    head = _git(repo, "rev-parse", "HEAD")
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import common; "
             "print(json.dumps(common.code_state()))")

    def state() -> dict:
        out = subprocess.check_output([sys.executable, "-c", probe, str(BENCHMARKS)],
                                      env=dict(os.environ, PYTHONPATH=str(repo / "src")),
                                      text=True, cwd=tmp_path)
        return json.loads(out)

    clean = state()
    assert clean == {"kvmap_path": str(pkg.resolve()), "git_sha": head, "uncommitted": []}
    (pkg / "__init__.py").write_text("X = 1\n")        # tracked, under src/: named
    (repo / "README").write_text("y\n")                  # tracked, elsewhere: not
    (pkg / "new.py").write_text("")                      # untracked: not
    assert state()["uncommitted"] == ["src/kvmap/__init__.py"]


def test_record_keeps_the_code_of_the_start(tmp_path, monkeypatch):
    """A commit that lands while a benchmark runs does not rename its record's code:
    ``git_sha`` / ``code`` are the start's, ``code_at_write`` says what changed."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import common
    finally:
        sys.path.remove(str(BENCHMARKS))
    start = {"git_sha": "a" * 40, "code": {"kvmap_path": "/x", "git_sha": "a" * 40,
                                          "uncommitted": []}}
    monkeypatch.setattr(common, "_AT_IMPORT", start)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    later = {"kvmap_path": "/x", "git_sha": "b" * 40, "uncommitted": []}
    monkeypatch.setattr(common, "code_state", lambda: later)
    record = json.loads(common.write_record("probe", {}, {}).read_text())
    assert record["git_sha"] == "a" * 40 and record["code"] == start["code"]
    assert record["code_at_write"] == later
    monkeypatch.setattr(common, "code_state", lambda: start["code"])
    assert "code_at_write" not in json.loads(common.write_record("p2", {}, {}).read_text())
