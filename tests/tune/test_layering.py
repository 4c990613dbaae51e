"""``kvmap.tune`` sits beside report and plan: only the CLI imports it."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "kvmap"


def test_only_the_cli_imports_tune():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "tune" or rel.as_posix() == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{rel}: {n}" for n in names if n.startswith("kvmap.tune")]
    assert offenders == []


def test_the_cli_registers_tune():
    from kvmap.cli import app
    names = {c.name for c in app.registered_commands}
    assert "tune" in names
