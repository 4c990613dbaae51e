"""``kvmap serve`` rejects bad options with exit code 2 and a message naming them,
before loading any weights."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvmap.cli import app


@pytest.mark.parametrize("args,message", [
    (["--kv", "bogus"], "unknown KV spec part 'bogus'"),
    (["--adaptive", "/no/such/policy.yaml"], "does not exist"),
    (["--port", "0"], "--port=0"),
    (["--max-queue", "0"], "--max-queue=0"),
    (["--dtype", "fp64"], "dtype='fp64'"),
    (["--model", "no-such-model"], "no-such-model"),
])
def test_bad_options_exit_2(args, message):
    result = CliRunner().invoke(app, ["serve", "--model", "dummy:tiny", *args])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output
