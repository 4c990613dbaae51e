"""One matrix-rate probe in the code base: a function that times a matrix product lives in
``kvmap.hardware`` (the profile's probes) or ``kvmap.perf``, nowhere else. A second probe
gives a second rate for one machine (issue 34: the offloader had its own); whoever needs
a rate reads the profile (``kvmap.hardware.profile``) or ``kvmap.perf.rates``.

The check reads the source (``ast``): a function whose body both reads a clock
(``time.perf_counter`` / ``monotonic`` / ``time``) and multiplies matrices (``@``,
``matmul``, ``mm``, ``bmm``, ``addmm``, ``linear``, ``einsum``) is a probe."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kvmap"
HOMES = ("hardware", "perf")
PRODUCTS = {"matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "einsum"}
CLOCKS = {"perf_counter", "monotonic", "time"}


def timed_products(source: str) -> list[str]:
    """Names of the functions in ``source`` that time a matrix product."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(fn))
        clock = any(isinstance(n, ast.Attribute) and n.attr in CLOCKS
                    and isinstance(n.value, ast.Name) and n.value.id == "time" for n in nodes)
        product = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult)
                      or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and n.func.attr in PRODUCTS for n in nodes)
        if clock and product:
            out.append(fn.name)
    return out


def test_the_check_finds_a_probe():
    probe = "import time\ndef rate(a, b):\n    t0 = time.perf_counter()\n    a @ b\n" \
            "    return time.perf_counter() - t0\n"
    assert timed_products(probe) == ["rate"]
    assert timed_products("def f(a, b):\n    return a @ b\n") == []


def test_no_matrix_rate_probe_outside_hardware_and_perf():
    found = [f"{path.relative_to(SRC)}: {name}"
             for path in sorted(SRC.rglob("*.py"))
             if path.relative_to(SRC).parts[0] not in HOMES
             for name in timed_products(path.read_text())]
    assert found == [], f"a matrix-rate probe outside kvmap.hardware / kvmap.perf: {found}"
