"""``kvmap serve`` rejects bad options with exit code 2 and a message naming them,
before loading any weights."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvmap.cli import app


@pytest.mark.parametrize("args,message", [
    (["--kv", "bogus"], "unknown KV spec part 'bogus'"),
    (["--adaptive", "/no/such/policy.yaml"], "does not exist"),
    (["--port", "0"], "port=0 must be in 1..65535"),
    (["--max-queue", "0"], "max_queue=0 must be"),
    (["--dtype", "fp64"], "dtype='fp64'"),
    (["--model", "no-such-model"], "no-such-model"),
])
def test_bad_options_exit_2(args, message):
    result = CliRunner().invoke(app, ["serve", "--model", "dummy:tiny", *args])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in result.output


def test_every_server_setting_is_declared_once_with_its_help():
    """``ServerArgs`` holds every limit and setting (``ServerLimits`` + the server's
    own); ``kvmap serve`` offers them by name, each with the field's help."""
    from dataclasses import fields

    from kvmap.server.args import ServerArgs
    from kvmap.server.command import SERVE_FLAGS, SERVE_OPTIONS
    declared = {f.name: f for f in fields(ServerArgs)}
    assert all(f.metadata.get("help") for f in declared.values())
    assert set(SERVE_OPTIONS) <= set(declared)
    result = CliRunner().invoke(app, ["serve", "--help"], terminal_width=200)
    for name in SERVE_OPTIONS:
        assert SERVE_FLAGS.get(name, "--" + name.replace("_", "-")) in result.output


def test_the_queue_bound_gives_the_concurrency_default():
    from kvmap.server.args import REQUEST_MARGIN, ServerArgs
    assert ServerArgs(max_queue=10).limits(4).max_concurrent_requests == 14 + REQUEST_MARGIN
    assert ServerArgs(max_queue=10, max_concurrent_requests=3).limits(4) \
        .max_concurrent_requests == 3
    assert ServerArgs(max_queue=None).limits(4).max_concurrent_requests is None
    with pytest.raises(ValueError, match="max_stop_strings=0 must be an integer >= 1"):
        ServerArgs(max_stop_strings=0)
