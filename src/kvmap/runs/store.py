"""The run directory: everything a report needs, and nothing it has to recompute.

    <run_dir>/
      run.json            run metadata: schema, scenario (as parsed) and its fingerprint,
                          seed, git sha, package versions, machine, command, timestamps
      scenario.yaml       the scenario file as given (built-in ones included)
      index.sqlite        the run index: table ``run`` (key -> JSON value, as run.json)
                          and table ``cells`` (one row per cell: status, model, kv,
                          workload/task, error, and the full cell record as JSON)
      requests.parquet    every per-request row of every finished workload cell
      parts/<cell>.parquet  the same rows, one file per cell (written as cells finish;
                          ``requests.parquet`` is rebuilt from them)
      logs/<cell>.log     the cell process's output
      .work/              a running cell's spec and result files (removed when the cell
                          ends, and every stale one when a run starts or resumes: a run
                          killed with -9 leaves its cell's files there)

A cell record is written in one SQLite transaction after its Parquet part, so an
interrupted run never holds half a cell; ``completed_ids()`` is what a resumed run skips.
Readers use ``RunStore(run_dir).cells()`` (``CellRecord``s), ``.requests()`` and
``.metadata()``.

What is stored never holds a credential: every string of run.json, the index, the Parquet
rows and the scenario copy goes through ``kvmap.kv.redact``. A run directory is locked
(``.lock``, ``fcntl.flock``) by the run writing it, so a second run on the same ``--out``
stops at once, naming the holder. The files the scenario names are fingerprinted
(``inputs.py``); a resume after one of them changed is refused.
"""
from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import platform
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kvmap.runs.inputs import changed_files, input_files
from kvmap.runs.record import CellRecord, JSONObject
from kvmap.kv.redact import redact_obj, redact_spec

RUN_SCHEMA = "kvmap.bench.run/1"
LOCK_NAME = ".lock"
REQUEST_SCHEMA = pa.schema([
    ("cell_id", pa.string()), ("model", pa.string()), ("kv", pa.string()),
    ("workload", pa.string()), ("request_id", pa.string()),
    ("conversation_id", pa.string()), ("turn", pa.int32()),
    ("scheduled_arrival_s", pa.float64()),      # the workload's offset (None: closed loop)
    ("arrival_s", pa.float64()), ("first_scheduled_s", pa.float64()),
    ("finished_s", pa.float64()), ("token_times_s", pa.list_(pa.float64())),
    ("num_prompt_tokens", pa.int64()), ("num_cached_prompt_tokens", pa.int64()),
    ("num_output_tokens", pa.int64()), ("num_preemptions", pa.int64()),
    ("max_tokens", pa.int64()),
    ("ttft_s", pa.float64()), ("tpot_s", pa.float64()), ("e2e_s", pa.float64()),
    ("queue_s", pa.float64()), ("tbt_max_s", pa.float64()),
    ("finish_reason", pa.string()), ("failed", pa.bool_()), ("error", pa.string()),
    ("expected", pa.string()), ("correct", pa.bool_()), ("needle_depth", pa.float64()),
    ("output_text", pa.string()),
])
_MODEL_TEXT = ("output_text", "expected")    # what the model wrote is stored as written
_CELL_COLUMNS = ("cell_id", "ordinal", "status", "kind", "model", "dtype", "kv", "workload",
                 "task", "started_at", "duration_s", "error", "record")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment() -> JSONObject:
    """Git sha, package versions and the machine (with its hardware profile: class, ISA,
    native bf16, measured rates), for the run's metadata."""
    import kvmap
    from kvmap.hardware import record_summary
    src = Path(kvmap.__file__).resolve().parent
    sha = _git(["rev-parse", "HEAD"], src)
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], src)
    try:
        import psutil
        memory_bytes = psutil.virtual_memory().total
    except ImportError:
        memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu = None
    try:
        import torch
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {
        "git": {"sha": sha, "dirty": bool(dirty) if sha else None},
        "versions": {"python": platform.python_version(),
                     **{p: _version(p) for p in ("kvmap", "torch", "numpy", "pyarrow",
                                                  "tokenizers", "gguf", "transformers")}},
        "machine": {"platform": platform.platform(), "arch": platform.machine(),
                    "cpu": _cpu_model(), "num_cpus": os.cpu_count(),
                    "memory_bytes": memory_bytes, "gpu": gpu,
                    "hostname": platform.node()},
        "hardware": record_summary(measure_if_missing=True),
    }


class RunStore:
    """Reads and writes one run directory (see the module docstring)."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)

    # ---- paths ---------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.dir / "run.json"

    @property
    def index_path(self) -> Path:
        return self.dir / "index.sqlite"

    @property
    def requests_path(self) -> Path:
        return self.dir / "requests.parquet"

    def part_path(self, cell_id: str) -> Path:
        return self.dir / "parts" / f"{cell_id}.parquet"

    def log_path(self, cell_id: str) -> Path:
        return self.dir / "logs" / f"{cell_id}.log"

    @property
    def work_dir(self) -> Path:
        return self.dir / ".work"

    def clear_work(self) -> int:
        """Remove what a killed run left in ``.work/`` (run under the run's lock, before
        any cell starts); the number of files removed."""
        removed = 0
        if self.work_dir.is_dir():
            for path in self.work_dir.iterdir():
                if path.is_file() or path.is_symlink():
                    path.unlink(missing_ok=True)
                    removed += 1
        return removed

    # ---- creating and resuming ---------------------------------------------------------
    @classmethod
    def open_for(cls, run_dir: str | Path, scenario: Any, scenario_text: str,
                 command: list[str] | None = None) -> tuple[RunStore, bool]:
        """Create ``run_dir`` for ``scenario`` (a ``bench.cellspec.Scenario``: typed
        ``Any``, runs stands below the bench), or reopen it to resume the same scenario.

        Returns ``(store, resumed)``. Raises ``ValueError`` when the directory holds a
        different scenario or something that is not a kvmap run.
        """
        store = cls(run_dir)
        fingerprint = scenario.fingerprint()
        files = input_files(scenario)
        if store.run_json.is_file():
            meta = store.metadata()
            if meta.get("fingerprint") != fingerprint:
                raise ValueError(
                    f"run directory {str(store.dir)!r} holds scenario "
                    f"{meta.get('scenario', {}).get('name')!r} (fingerprint "
                    f"{meta.get('fingerprint')}), not this one ({fingerprint}): give another "
                    "--out, or the same scenario to resume it")
            changed = changed_files(meta.get("input_files") or {}, files)
            if "input_files" in meta and changed:
                raise ValueError(
                    f"run directory {str(store.dir)!r}: file(s) the scenario reads changed "
                    f"since the run started ({', '.join(changed[:5])}); its results would "
                    "not be comparable: give another --out to run it afresh")
            meta.setdefault("resumed_at", []).append(_now())
            store._write_metadata(meta)
            return store, True
        if store.dir.exists() and any(p.name != LOCK_NAME for p in store.dir.iterdir()):
            raise ValueError(f"--out {str(store.dir)!r} exists and is not a kvmap run "
                             "directory; give a new or empty directory")
        (store.dir / "parts").mkdir(parents=True, exist_ok=True)
        (store.dir / "logs").mkdir(exist_ok=True)
        (store.dir / "scenario.yaml").write_text(redact_spec(scenario_text))
        meta = {"schema": RUN_SCHEMA, "run_id": store.dir.resolve().name,
                "created_at": _now(), "seed": scenario.seed, "fingerprint": fingerprint,
                "input_files": files,
                "scenario": scenario.to_dict(), "command": command or list(sys.argv),
                **environment()}
        store._write_metadata(meta)
        return store, False

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.index_path)
        conn.execute("CREATE TABLE IF NOT EXISTS run (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("CREATE TABLE IF NOT EXISTS cells (cell_id TEXT PRIMARY KEY, "
                     "ordinal INTEGER, status TEXT, kind TEXT, model TEXT, dtype TEXT, "
                     "kv TEXT, workload TEXT, task TEXT, started_at TEXT, duration_s REAL, "
                     "error TEXT, record TEXT)")
        return conn

    def _write_metadata(self, meta: JSONObject) -> None:
        meta = redact_obj(json.loads(json.dumps(meta, default=str)))
        tmp = self.run_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2, default=str))
        os.replace(tmp, self.run_json)
        with self._connect() as conn:
            conn.executemany("INSERT OR REPLACE INTO run VALUES (?, ?)",
                             [(k, json.dumps(v, default=str)) for k, v in meta.items()])
        conn.close()

    def update_metadata(self, **fields: Any) -> None:
        self._write_metadata({**self.metadata(), **fields})

    # ---- cells ---------------------------------------------------------------------
    def write_cell(self, cell: CellRecord, rows: list[JSONObject], ordinal: int) -> None:
        """Store one finished cell: its rows (Parquet part) first, then its record.
        Strings are redacted (``kvmap.kv.redact``) on the way in, except the model's
        own text (``output_text``, ``expected``)."""
        record = redact_obj(cell.to_dict())
        rows = [{k: v if k in _MODEL_TEXT else redact_obj(v) for k, v in row.items()}
                for row in rows]
        part = self.part_path(record["cell_id"])
        if rows:
            part.parent.mkdir(parents=True, exist_ok=True)
            tmp = part.with_suffix(".tmp")
            pq.write_table(requests_table(rows), tmp)
            os.replace(tmp, part)
        elif part.exists():
            part.unlink()
        values = {**{k: record.get(k) for k in _CELL_COLUMNS}, "ordinal": ordinal,
                  "record": json.dumps(record)}
        with self._connect() as conn:
            conn.execute(f"INSERT OR REPLACE INTO cells ({', '.join(_CELL_COLUMNS)}) "
                         f"VALUES ({', '.join('?' for _ in _CELL_COLUMNS)})",
                         [values[c] for c in _CELL_COLUMNS])
        conn.close()

    def cells(self) -> list[CellRecord]:
        """Every stored cell record, in scenario order."""
        if not self.index_path.exists():
            return []
        conn = self._connect()
        try:
            rows = conn.execute("SELECT record FROM cells ORDER BY ordinal").fetchall()
        finally:
            conn.close()
        return [CellRecord.from_dict(json.loads(r[0])) for r in rows]

    def write_log(self, cell_id: str, text: str) -> None:
        path = self.log_path(cell_id)
        path.parent.mkdir(exist_ok=True)
        path.write_text(redact_spec(text))

    def completed_ids(self) -> set[str]:
        return {c.cell_id for c in self.cells() if c.ok}

    def metadata(self) -> JSONObject:
        meta: JSONObject = json.loads(self.run_json.read_text())
        return meta

    # ---- per-request rows --------------------------------------------------------------
    def finalize(self, **fields: Any) -> None:
        """Rebuild ``requests.parquet`` from the stored cells' parts; update run.json."""
        ids = [c.cell_id for c in self.cells()]
        tables = [pq.read_table(self.part_path(i), schema=REQUEST_SCHEMA)
                  for i in ids if self.part_path(i).exists()]
        table = pa.concat_tables(tables) if tables else REQUEST_SCHEMA.empty_table()
        tmp = self.requests_path.with_suffix(".tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, self.requests_path)
        cells = self.cells()
        self.update_metadata(updated_at=_now(),
                             num_cells_ok=sum(c.ok for c in cells),
                             num_cells_failed=sum(not c.ok for c in cells),
                             **fields)

    def rows(self, cell_id: str) -> list[JSONObject]:
        """One stored cell's per-request rows ([] when it stored none)."""
        part = self.part_path(cell_id)
        return pq.read_table(part).to_pylist() if part.exists() else []

    def requests(self) -> pa.Table:
        """Every per-request row (``REQUEST_SCHEMA``) as a ``pyarrow.Table``."""
        if not self.requests_path.exists():
            return REQUEST_SCHEMA.empty_table()
        return pq.read_table(self.requests_path)

    def timeseries(self, cell_id: str) -> pa.Table | None:
        """The cell's system time series (``kvmap.bench.timeseries``), None if absent."""
        path = self.dir / "timeseries" / f"{cell_id}.parquet"
        return pq.read_table(path) if path.exists() else None


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.lock`` for the lifetime of a run (released
    by the kernel if the process dies). ValueError naming the holder when taken."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(f"run directory {str(self.path.parent)!r} is in use by another "
                             f"run ({holder}); wait for it, or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()} since {_now()}".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        try:                         # a run refused before storing leaves no directory
            if [p.name for p in self.path.parent.iterdir()] == [LOCK_NAME]:
                self.path.unlink()
                self.path.parent.rmdir()
        except OSError:
            pass
        os.close(self._fd)           # closing the descriptor releases the lock
        self._fd = None



def requests_table(rows: list[JSONObject]) -> pa.Table:
    """Rows as a table of ``REQUEST_SCHEMA`` (missing fields are null, extras dropped)."""
    names = REQUEST_SCHEMA.names
    return pa.Table.from_pylist([{k: row.get(k) for k in names} for row in rows],
                                schema=REQUEST_SCHEMA)
