"""How every ``kvmap`` subcommand rejects a bad argument: a message on stderr, exit code 2
(or the code a command gives a failure of its own, e.g. 1 for an unreachable server).

A module of its own, below ``cli.py`` and the feature packages' ``command.py`` files, so
that they all import it downward (``cli.py`` imports those commands to wire them).
"""
from __future__ import annotations

from typing import NoReturn

import typer


class ScenarioError(ValueError):
    """A scenario file that cannot run (``kvmap bench``'s, ``kvmap simulate``'s); the
    message lists every problem found."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` to stderr and exit with ``code`` (2: a usage error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)
