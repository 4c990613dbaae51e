"""Secrets by structure (issues 16 and 28): a Redis password never appears in anything a
run writes or prints -- run.json, scenario.yaml, the index, the Parquet parts, logs, cell
ids (file names), the HTML report, the terminal, error messages, the fingerprint -- also
after a ``kill -9`` of the run. The password holds characters a pattern-based redaction
missed (``@ { | ^ " < >`` and a space); it comes only from the environment, and a spec
that writes one inline is refused with an error that says how to pass it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import typer
from typer.testing import CliRunner

from kvmap.bench.command import register
from kvmap.kv.config import KVConfig
from kvmap.report.command import bench_tradeoff_map
from kvmap.kv.redact import redact_spec

PASSWORD = 'Sup3r@{|^"<> Secret-4711'
URL_ENV = "KVMAP_TEST_SECRET_REDIS_URL"
SRC = Path(__import__("kvmap").__file__).resolve().parents[1]   # the kvmap under test


def test_redact_spec_strips_user_info_whatever_its_characters():
    assert redact_spec("int8+tiers(redis=redis://u:pw@h:1/0, host=1MiB)") == \
        "int8+tiers(redis=redis://h:1/0, host=1MiB)"
    assert redact_spec("rediss://:p%40ss@h/0 and redis://h:2/0") == \
        "rediss://h/0 and redis://h:2/0"
    assert redact_spec("no url here, a@b") == "no url here, a@b"
    for text in (f"tiers(redis=redis://:{PASSWORD}@127.0.0.1:1/0,fetch=always)",
                 f"error: redis://user:{PASSWORD}@h:1/0 refused\nnext line a@b",
                 f"two redis://:{PASSWORD}@a:1/0 and rediss://x:{PASSWORD}@b:2/0"):
        out = redact_spec(text)
        assert not any(part in out for part in (PASSWORD, "Secret", "{|^")), out
    assert redact_spec("line one redis://h:1/0\nline two a@b") == \
        "line one redis://h:1/0\nline two a@b"       # an @ on another line is left alone


@pytest.mark.parametrize("url", [f"redis://:{PASSWORD}@127.0.0.1:1/0",
                                 "redis://:plain@127.0.0.1:1/0",
                                 "redis://user:a,b)c@127.0.0.1:1/0"])
def test_an_inline_password_is_refused_saying_how_to_pass_it(url):
    with pytest.raises(ValueError) as err:
        KVConfig.parse(f"fp32+tiers(redis={url},fetch=always)")
    message = str(err.value)
    assert "KVMAP_REDIS_PASSWORD" in message and "env:NAME" in message
    secret = url.split("//", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    assert secret not in message and "127.0.0.1:1/0" in message
    KVConfig.parse("fp32+tiers(redis=redis://user@127.0.0.1:1/0)")    # a user name is fine


def test_the_fingerprint_hashes_redacted_fields_only():
    from dataclasses import replace
    from kvmap.bench.scenario import load_scenario
    base = load_scenario("builtin:quick")
    with_pw = [replace(base, kv=(f"fp32+tiers(redis=redis://:{pw}@h:1/0)",))
               for pw in ("one-password", "another-one")]
    plain = replace(base, kv=("fp32+tiers(redis=redis://h:1/0)",))
    assert with_pw[0].fingerprint() == with_pw[1].fingerprint() == plain.fingerprint()


def test_tune_writes_its_path_through_the_same_redaction(tmp_path):
    from kvmap.tune.path import Step, write_path
    spec = f"fp32+tiers(redis=redis://:{PASSWORD}@h:1/0)"
    step = Step(1, spec, f"tried {spec}", "ok", ("screen",), 1)
    write_path(tmp_path, [step], space={"kv": [spec]}, objective=spec)
    assert {p.name for p in tmp_path.iterdir()} == {"tune.json", "tune.md"}
    assert_nowhere(tmp_path)
    assert "redis://h:1/0" in (tmp_path / "tune.md").read_text()


def app() -> typer.Typer:
    a = typer.Typer()
    a.callback()(lambda: None)
    register(a, tradeoff_map=bench_tradeoff_map)
    return a


def secret_redis(redis_server) -> str:
    """Give ``redis_server`` the password; its URL with the password in it."""
    import redis
    redis.Redis(port=redis_server.port).config_set("requirepass", PASSWORD)
    return f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{redis_server.port}/0"


def scenario(tmp_path, kv: str, extra: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""
        name: secret
        models: [dummy:tiny]
        engine: {{kv_memory: 16KiB, block_size: 4, max_num_batched_tokens: 64}}
        kv: ["{kv}"]
        workloads:
          - {{name: tp, kind: synthetic, num_requests: 8, prompt_len: 24, output_len: 2}}
        """) + textwrap.dedent(extra))
    return path


def assert_nowhere(root: Path, *outputs: str) -> None:
    forms = (PASSWORD, quote(PASSWORD, safe=""), quote(PASSWORD), "Secret-4711")
    files = [p for p in root.rglob("*") if p.is_file()]
    for p in files:
        data = p.read_bytes()
        assert not any(f.encode() in data for f in forms), p
        assert "Secret" not in str(p.relative_to(root))
    for out in outputs:
        assert not any(f in out for f in forms)


@pytest.mark.redis
def test_the_password_is_in_no_file_and_no_output(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv(URL_ENV, secret_redis(redis_server))
    path = scenario(tmp_path, f"fp32+tiers(redis=env:{URL_ENV},fetch=always)")
    out = tmp_path / "run"
    result = CliRunner().invoke(app(), ["bench", str(path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout.strip().splitlines()[-1])["cells"]
    redis_usage = row["metrics"]["tiers"]["redis"]
    assert redis_usage["num_puts"] > 0 and row["metrics"]["tier_errors"] == 0  # it logged in
    files = {p.name for p in out.rglob("*") if p.is_file()}
    assert {"run.json", "scenario.yaml", "index.sqlite", "requests.parquet",
            "report.html"} <= files and any(out.glob("logs/*.log"))
    assert_nowhere(out, result.output)

    inline = scenario(tmp_path, f"fp32+tiers(redis={os.environ[URL_ENV]},fetch=always)")
    result = CliRunner().invoke(app(), ["bench", str(inline), "--out", str(tmp_path / "r2")])
    assert result.exit_code == 2 and "KVMAP_REDIS_PASSWORD" in result.output
    assert not (tmp_path / "r2").exists()          # refused before anything is written
    assert_nowhere(out, result.output)


TASKS_PY = '''
import os, time

def slow(llm):
    if os.environ.get("KVMAP_TEST_HANG"):
        time.sleep(600)
    return {"ok": 1}
'''


@pytest.mark.redis
def test_kill_9_leaves_no_password_and_a_resume_clears_stale_work_files(
        redis_server, tmp_path):
    """``kill -9`` of ``kvmap bench`` while a cell runs with the password in its
    environment: no file of the run holds it; the resumed run first removes what the
    killed one left in ``.work/``."""
    url = secret_redis(redis_server)
    (tmp_path / "tasks.py").write_text(TASKS_PY)
    path = scenario(tmp_path, f"fp32+tiers(redis=env:{URL_ENV},fetch=always)",
                    'tasks:\n  - {name: slow, task: "tasks.py:slow"}\n')
    out = tmp_path / "run"
    env = {**os.environ, URL_ENV: url,
           "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "kvmap.cli", "bench", str(path),
                             "--out", str(out)], env={**env, "KVMAP_TEST_HANG": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not any((out / ".work").glob("*slow*.cell.json")):
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.stdout.read().decode(errors="replace")[-2000:]
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(1.0)                            # the cell dies with its parent
    assert_nowhere(out)
    assert any((out / ".work").glob("*slow*.cell.json"))       # what -9 left behind
    stale = out / ".work" / "stale-from-an-older-run.cell.json"
    stale.write_text("{}")
    result = subprocess.run([sys.executable, "-m", "kvmap.cli", "bench", str(path),
                             "--out", str(out)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert not stale.exists()
    assert not (out / ".work").exists() or not any((out / ".work").iterdir())
    assert_nowhere(out, result.stdout, result.stderr)


def test_every_child_log_line_goes_through_the_redaction():
    """``bench/log_pump.py`` is the one writer of a child's log (cells, launched
    endpoint servers): a line that carries a URL with a password -- a child printing its
    resolved environment, say -- reaches the log without it, and ``take`` keeps its
    lines out of the log."""
    import io

    from kvmap.bench.log_pump import pump_lines
    source = io.StringIO(f"connecting to redis://user:{PASSWORD}@127.0.0.1:6390/0\n"
                         "@@progress 0.5\nplain line\n")
    log, taken = io.StringIO(), []
    pump_lines(source, log, lambda line: line.startswith("@@") and not taken.append(line)
               ).join(timeout=5)
    assert PASSWORD not in log.getvalue() and "redis://127.0.0.1:6390/0" in log.getvalue()
    assert "plain line" in log.getvalue() and taken == ["@@progress 0.5\n"]
    assert "@@progress" not in log.getvalue()
