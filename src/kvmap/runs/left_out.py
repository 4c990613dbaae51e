"""What a budget left out of a run, as the plan's lines and the report's say it: one line
per reason. An optional entry's cells share theirs (its minimum), so an entry is one line
however many cells it has; a cell over its timeout has its own estimate in its reason,
and its own line. Pure: (cell id, reason) pairs in, lines out (``bench.budget`` prints
the plan, ``report.power`` the stored plan of run.json)."""
from __future__ import annotations

from collections.abc import Iterable


def left_out_lines(left_out: Iterable[tuple[str, str]]) -> list[str]:
    by_reason: dict[str, list[str]] = {}
    for cid, why in left_out:
        by_reason.setdefault(why, []).append(cid)
    return [f"  left out {ids[0]}: {why}" if len(ids) == 1 else
            f"  left out {len(ids)} cells or searches ({', '.join(ids)}): {why}"
            for why, ids in by_reason.items()]
