"""A Redis password given in a KV spec never appears in anything a run writes or prints:
run.json, scenario.yaml, the index, the Parquet parts, logs, cell ids (file names), the
HTML report, the terminal output and spec error messages."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kvmap.bench.command import register
from kvmap.report.command import bench_tradeoff_map
from kvmap.kv.redact import redact_spec

PASSWORD = "Sup3rSecretPw-4711"


def test_redact_spec_strips_user_info_only():
    assert redact_spec("int8+tiers(redis=redis://u:pw@h:1/0, host=1MiB)") == \
        "int8+tiers(redis=redis://h:1/0, host=1MiB)"
    assert redact_spec("rediss://:p%40ss@h/0 and redis://h:2/0") == \
        "rediss://h/0 and redis://h:2/0"
    assert redact_spec("no url here, a@b") == "no url here, a@b"


def app() -> typer.Typer:
    a = typer.Typer()
    a.callback()(lambda: None)
    register(a, tradeoff_map=bench_tradeoff_map)
    return a


@pytest.mark.redis
def test_the_password_is_in_no_file_and_no_output(redis_server, tmp_path):
    import redis
    redis.Redis(port=redis_server.port).config_set("requirepass", PASSWORD)
    url = f"redis://:{PASSWORD}@127.0.0.1:{redis_server.port}/0"
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(f"""
        name: secret
        models: [dummy:tiny]
        engine: {{kv_memory: 16KiB, block_size: 4, max_num_batched_tokens: 64}}
        kv: ["fp32+tiers(redis={url},fetch=always)"]
        workloads:
          - {{name: tp, kind: synthetic, num_requests: 8, prompt_len: 24, output_len: 2}}
        """))
    out = tmp_path / "run"
    result = CliRunner().invoke(app(), ["bench", str(path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout.strip().splitlines()[-1])["cells"]
    redis_usage = row["metrics"]["tiers"]["redis"]
    assert redis_usage["num_puts"] > 0 and row["metrics"]["tier_errors"] == 0  # it logged in
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {"run.json", "scenario.yaml", "index.sqlite", "requests.parquet",
            "report.html"} <= {p.name for p in files} and any(out.glob("logs/*.log"))
    for p in files:
        assert PASSWORD.encode() not in p.read_bytes(), p
        assert PASSWORD not in str(p.relative_to(out))
    assert PASSWORD not in result.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("fetch=always", "evict=nope"))
    result = CliRunner().invoke(app(), ["bench", str(bad), "--out", str(tmp_path / "r2")])
    assert result.exit_code == 2 and "evict" in result.output
    assert PASSWORD not in result.output
