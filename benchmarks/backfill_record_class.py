"""Back-fills ``machine_class`` and ``dtype`` into the records under benchmarks/results/
written before ``common.write_record`` named them (``record_class.back_fill``: from the
embedded profile, else the README's date rule, marked ``"inferred": true``). Idempotent;
prints what it changed.

    python benchmarks/backfill_record_class.py
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_class import back_fill  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# records whose dtype their script fixes, not the date rule's auto: name -> (dtype, why)
DTYPE_FROM_CODE = {"fragmentation": ("fp32", "benchmarks/fragmentation.py builds LLM(dtype='fp32')")}


def first_committed(path: Path) -> str | None:
    """The day ``path`` was first committed (YYYY-MM-DD), or None outside git."""
    try:
        out = subprocess.check_output(["git", "log", "--diff-filter=A", "--format=%cs", "--",
                                       path.name], cwd=path.parent, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.split()[-1] if out.split() else None


def main() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        record = json.loads(path.read_text())
        filled = back_fill(path.stem, record, first_committed(path))
        if path.stem in DTYPE_FROM_CODE and "dtype_source" not in filled:
            dtype, why = DTYPE_FROM_CODE[path.stem]
            filled = {**filled, "dtype": dtype, "dtype_source": why}
        if filled is record:
            continue
        indent = 2 if path.read_text().startswith("{\n") else None
        path.write_text(json.dumps(filled, indent=indent) + ("\n" if indent is None else ""))
        print(f"{path.name}: {filled['machine_class']} {filled['dtype']} "
              f"({filled['machine_class_source']})")


if __name__ == "__main__":
    main()
