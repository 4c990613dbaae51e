"""The Pareto front of a set of points: those no other point beats on both axes.

    y (lower is better)          a point is dominated when another is at least as good on
    |  x                         both axes and strictly better on one; the front is the
    |     o---o                  rest, joined in order of x (o: front, x: dominated)
    |          \\      x
    |           o------o
    +-------------------- x (lower is better)

Pure; ``None`` coordinates are left out.
"""
from __future__ import annotations

from collections.abc import Sequence


def pareto_front(points: Sequence[tuple[float | None, float | None]], *,
                 minimize_x: bool = True, minimize_y: bool = True) -> list[int]:
    """Indices of the non-dominated points, sorted by x (ascending)."""
    sx, sy = (1 if minimize_x else -1), (1 if minimize_y else -1)
    valid = [(i, sx * x, sy * y) for i, (x, y) in enumerate(points)
             if x is not None and y is not None]
    front = []
    for i, x, y in valid:
        dominated = any((x2 <= x and y2 <= y) and (x2 < x or y2 < y)
                        for j, x2, y2 in valid if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][0], points[i][1]))
