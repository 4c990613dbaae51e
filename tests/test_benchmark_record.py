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

import pytest

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


def _record_class():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import record_class
    finally:
        sys.path.remove(str(BENCHMARKS))
    return record_class


def test_every_record_names_its_machine_class_and_dtype():
    """A figure is true on the class it was measured on: each record says which, and
    how it knows (its own profile, the date rule, or a simulator's modelled hardware)."""
    rc = _record_class()
    records = sorted((BENCHMARKS / "results").glob("*.json"))
    assert records, "no records under benchmarks/results/"
    sources = {rc.MEASURED, rc.FORCED, rc.INFERRED, rc.SIMULATED}
    bad = {}
    for path in records:
        record = json.loads(path.read_text())
        if not (isinstance(record.get("machine_class"), str) and isinstance(record.get("dtype"), str)):
            bad[path.name] = "no machine_class/dtype"
        elif record.get("machine_class_source") not in sources:
            bad[path.name] = f"machine_class_source={record.get('machine_class_source')!r}"
        elif (record["machine_class_source"] == rc.INFERRED) != (record.get("inferred") is True):
            bad[path.name] = "an inferred class must say inferred: true, a measured one not"
        hardware = (record.get("environment") or {}).get("hardware") or {}
        if hardware.get("machine_class") not in (None, record.get("machine_class")):
            bad[path.name] = f"class {record.get('machine_class')!r} != profile's"
    assert not bad, bad


def test_back_fill_takes_the_profile_else_the_date_rule():
    rc = _record_class()
    hw = {"machine_class": "x86-amx", "auto_dtype_cpu": "bf16"}
    measured = rc.back_fill("x-20261204-000000", {"environment": {"hardware": hw},
                                                  "config": {"dtype": "fp32"}})
    assert (measured["machine_class"], measured["dtype"], measured.get("inferred")) == \
        ("x86-amx", "fp32", None)
    assert rc.back_fill("x", {"environment": {"hardware": hw}, "config": {}})["dtype"] == "bf16"
    gpu = {**hw, "auto_dtype_cpu": "fp32", "cuda": [{"capability": [7, 5]}, {"capability": [9, 0]}]}
    assert rc.fields_from_profile(gpu, {"device": "cuda"})["dtype"] == "fp16"
    assert rc.fields_from_profile(gpu, {"device": "cuda:1"})["dtype"] == "bf16"
    with pytest.raises(ValueError, match="cuda:2"):
        rc.fields_from_profile(gpu, {"device": "cuda:2"})
    old = rc.back_fill("x-20261201-120000", {"time": "2026-12-01T12:00:00Z", "config": {}})
    assert (old["machine_class"], old["dtype"], old["inferred"]) == ("x86-avx512-bf16", "bf16", True)
    later = rc.back_fill("x-20261203-232436", {"config": {}})
    assert (later["machine_class"], later["dtype"]) == ("x86-avx512", "fp32")
    assert measured["machine_class_source"] == rc.MEASURED
    forced = rc.fields_from_profile({**hw, "native_bf16_forced": True}, {})
    assert forced["machine_class_source"] == rc.FORCED, forced
    done = {"machine_class": "a", "dtype": "b"}
    assert rc.back_fill("x", done) is done
    with pytest.raises(ValueError, match="nodate"):
        rc.back_fill("nodate", {})


def test_write_record_names_the_class_and_dtype(tmp_path, monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import common
    finally:
        sys.path.remove(str(BENCHMARKS))
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    hw = {"machine_class": "x86-avx2", "auto_dtype_cpu": "fp32"}
    monkeypatch.setattr(common, "environment", lambda: {"hardware": hw})
    record = json.loads(common.write_record("p", {"dtype": "bf16"}, {}).read_text())
    assert (record["machine_class"], record["dtype"]) == ("x86-avx2", "bf16")
    assert json.loads(common.write_record("q", {}, {}).read_text())["dtype"] == "fp32"
