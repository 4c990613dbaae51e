"""The house rule of issue 13, held by a test: no module in src/ over 400 lines, no
function over 80 (DESIGN.md: small modules, one concept per file)."""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kvmap"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 80


def test_no_module_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, long


def test_no_function_over_80_lines():
    long = {}
    for p in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(SRC)}:{node.name}"] = n
    assert not long, long
