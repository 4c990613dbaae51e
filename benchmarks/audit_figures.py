"""The figures audit of README.md and docs/*.md against benchmarks/results/ (issue 40).

A *figure* is a number with a unit (``1.62x``, ``+19%``, ``49.1 tokens/s``, ``12 cells``,
``538 MB``). The docs are cut into sections at their headings. A section is *measured*
when it speaks of a measurement (``measured``, ``record``, ``load average``, a benchmark
command, ...). Then each figure is one of:

- **keyed**: written ``49.1 tokens/s<!-- fig odcc_table-20261204-034345 metrics/a/b -->``,
  the record and the key of the value it quotes (``*100`` after the key scales it; a
  range ``1.62-1.67x`` names several keys and spans their least and greatest values;
  ``A:B`` quotes the ratio of two values).
  Checked exactly: the value, rounded to the figure's decimals, must be the figure.
- **matched**: the paragraph (a list item: the last paragraph before it that cites any; a
  paragraph citing none: its section) cites records and some value of theirs gives the figure at its
  printed precision: a value itself, a ratio of two values under the same key, either
  as a percentage or a percentage change, or a value in other units (s -> ms, bytes ->
  MB/MiB/GB).
- **mismatched**: the section cites records and none of their values gives the figure.
  A heuristic: a figure derived otherwise (a sum, a mean of several keys) shows here too,
  and a human reads the list (``--list``).
- **unsourced**: the section is measured and cites no record.

A paragraph of figures that are not measurements -- a design constant, a default, a
model's arithmetic, a paper's figure -- says so with ``<!-- audit: not measured -->`` in
it (a paragraph of only that line under a heading says it for the whole section); its
figures are then not audited, but for keyed ones. A measured figure no record holds, kept visibly as history under a
sentence that says it is withdrawn, carries ``<!-- audit: withdrawn -->`` the same way
and counts as **withdrawn**, not unsourced or mismatched (a keyed figure is still checked). ``python benchmarks/audit_figures.py [--list]
[FILES...]`` prints the counts (and each mismatched or unsourced figure with ``--list``);
tests/test_docs_records.py holds the keyed figures and the counts.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
UNITS = (r"x|%|tokens/s|tok/s|req/s|GFLOP/s|GB/s|ms|µs|us|s|min|MiB|MB|GiB|GB|KiB|kB|"
         r"cells|requests|sequences")
NUMBER = r"[+-]?\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.\-/=])(?<!min )({NUMBER})(?:\s?(?:-|to)\s?({NUMBER}))?\s?({UNITS})(?![\w/])"
                    r"(?! \d+ s\b)")
COMPOUND = re.compile(r"\b(\d+) min (\d+) s\b")       # 1 min 39 s: one figure, 99 s
KEY = re.compile(r"<!--\s*fig\s+([\w.-]+)\s+(\S+(?:\s+[^\s*]\S*)*?)(?:\s*\*\s*([\d.e+-]+))?\s*-->")
CITE = re.compile(r"\b([A-Za-z0-9_.-]*?[A-Za-z0-9_]-20\d{6}(?:-\d{6})?)(?:\.json)?\b"
                  r"|`-(\d{6})\.json`|\b(fragmentation)\.json\b")
MEASURED_WORDS = re.compile(r"measured|record|load average|\bload \d|median|benchmarks/|"
                            r"kvmap bench|ran in|took", re.I)
NOT_MEASURED = "<!-- audit: not measured -->"
WITHDRAWN = "<!-- audit: withdrawn -->"
SCALES = {"ms": (1e3, 1.0), "µs": (1e6, 1.0), "us": (1e6, 1.0), "MB": (1e-6, 1.0),
          "GB": (1e-9, 1.0), "GB/s": (1e-9, 1.0), "MiB": (2 ** -20, 1.0),
          "GiB": (2 ** -30, 1.0), "KiB": (2 ** -10, 1.0), "kB": (1e-3, 1.0),
          "min": (1 / 60, 1.0), "GFLOP/s": (1e-9, 1.0)}


@dataclass(frozen=True)
class Figure:
    doc: str
    line: int
    section: str
    text: str
    verdict: str            # keyed, keyed-mismatch, matched, mismatched, unsourced
    records: tuple[str, ...]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def leaves(obj, key: str = "") -> list[tuple[str, float]]:
    """Every number in a record with the name of the key that holds it (a number written
    in one of its strings too)."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [(key, float(obj))] if math.isfinite(obj) else []
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in leaves(v, str(k))]
    if isinstance(obj, list):
        return [leaf for v in obj for leaf in leaves(v, key)]
    if isinstance(obj, str):          # a record's sentences carry figures too
        return [(key + "#text", _number(n)) for n in re.findall(NUMBER, obj)[:200]]
    return []


@lru_cache(maxsize=None)
def candidates(name: str) -> tuple[frozenset, frozenset]:
    """(values, ratios) of a record: its numbers, and the ratios of numbers under one key."""
    record = json.loads((RESULTS / f"{name}.json").read_text())
    found = leaves(record)
    values = frozenset(v for _, v in found)
    by_key: dict[str, list[float]] = {}
    for k, v in found:
        by_key.setdefault(k, []).append(v)
    ratios = set()
    for vs in by_key.values():
        vs = sorted(set(vs))[:300]
        ratios.update(a / b for a in vs for b in vs if b)
    return values, frozenset(ratios)


def _close(target: float, decimals: int, value: float) -> bool:
    return abs(value - target) <= 0.5 * 10 ** -decimals + 1e-9 * max(1.0, abs(target))


def matches(text: str, unit: str, records: tuple[str, ...]) -> bool:
    """Whether some value of ``records`` gives the figure ``text`` ``unit``."""
    target, decimals = abs(_number(text)), _decimals(text)
    for name in records:
        values, ratios = candidates(name)
        scale = SCALES.get(unit, (1.0, 1.0))[0]
        pool = [abs(v) * scale for v in values] + [abs(v) for v in values]
        if unit == "x":
            pool += list(ratios)
        if unit == "%":
            pool += [abs(v) * 100 for v in values]
            pool += [abs(r - 1) * 100 for r in ratios] + [r * 100 for r in ratios]
        if any(_close(target, decimals, v) for v in pool):
            return True
    return False


def resolve(token: tuple[str, str, str], previous: str | None) -> str | None:
    name, suffix, bare = token
    if bare:
        return bare
    if name:
        return name
    hits = sorted(p.stem for p in RESULTS.glob(f"*-{suffix}.json"))
    if previous and any(h.startswith(previous.rsplit("-", 1)[0]) for h in hits):
        return next(h for h in hits if h.startswith(previous.rsplit("-", 1)[0]))
    return hits[0] if len(hits) == 1 else None


def sections(path: Path) -> list[tuple[str, int, list[str]]]:
    """(heading, first line number, lines) of each section of a markdown file; fenced
    code is left out (commands, not figures)."""
    out, fenced = [("(top)", 1, [])], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            out[-1][2].append("")
            continue
        if not fenced and re.match(r"#{1,6} ", line):
            out.append((line.lstrip("# ").strip(), number, []))
        out[-1][2].append("" if fenced else line)
    return out


def keyed_value(record: str, key: str, scale: str | None) -> float:
    """The value at ``key`` of ``record``: keys and list indexes joined by ``/``
    (``metrics/s1_int8/output_tok_s/0``), or ``A:B``, the value at A over the value at B;
    KeyError names the record and the key."""
    if ":" in key:
        over, under = key.split(":", 1)
        return keyed_value(record, over, scale) / keyed_value(record, under, None)
    obj = json.loads((RESULTS / f"{record}.json").read_text())
    for part in key.split("/"):
        try:
            obj = obj[int(part)] if isinstance(obj, list) else obj[part]
        except (KeyError, IndexError, ValueError) as e:
            raise KeyError(f"{record} has no {key!r} (at {part!r})") from e
    if not isinstance(obj, (int, float)):
        raise KeyError(f"{record} {key} is {obj!r}, not a number")
    return float(obj) * (float(scale) if scale else 1.0)


def _cited(text: str) -> tuple[str, ...]:
    cited, previous = [], None
    for token in CITE.findall(text):
        name = resolve(token, previous)
        if name and (RESULTS / f"{name}.json").is_file():
            cited.append(name)
            previous = name
    return tuple(dict.fromkeys(cited))


def paragraphs(lines: list[str]) -> list[tuple[int, list[str]]]:
    """(offset, lines) of each paragraph: blocks split at blank lines and list items."""
    out: list[tuple[int, list[str]]] = []
    for offset, line in enumerate(lines):
        if not line.strip():
            continue
        if not out or not lines[offset - 1].strip() or re.match(r"\s*([-*]|\d+\.) ", line):
            out.append((offset, []))
        out[-1][1].append(line)
    return out


def _figures(line: str) -> list[tuple[str, str | None, str, int, int]]:
    """(number, range end, unit, start, end) of each figure on ``line``."""
    out = [(m.group(1), m.group(2), m.group(3), m.start(), m.end()) for m in FIGURE.finditer(line)
           if not (m.group(3) == "x" and m.group(0)[-2].isspace())]      # 2 x 30: a product
    out += [(str(int(m.group(1)) * 60 + int(m.group(2))), None, "s", m.start(), m.end())
            for m in COMPOUND.finditer(line)]
    return sorted(out, key=lambda f: f[3])


def _verdict(m: tuple, key: re.Match | None, records: tuple[str, ...],
             measured: bool) -> str | None:
    if key:
        values = [keyed_value(key.group(1), k, key.group(3)) for k in key.group(2).split()]
        low, high = m[0], m[1] or m[0]
        ok = (_close(_number(low), _decimals(low), min(values))
              and _close(_number(high), _decimals(high), max(values)))
        return "keyed" if ok else f"keyed-mismatch (record: {min(values):g}-{max(values):g})"
    if records:
        numbers = [n for n in (m[0], m[1]) if n]
        return "matched" if all(matches(n, m[2], records) for n in numbers) else "mismatched"
    return "unsourced" if measured else None


def audit_file(path: Path) -> list[Figure]:
    """Each figure of ``path`` with its verdict: a paragraph's figures are compared with
    the records the paragraph cites; when it cites none, a list item's with those of the
    last paragraph before it (not a list item) that cites some, another paragraph's with
    those of its section."""
    figures: list[Figure] = []
    for heading, start, lines in sections(path):
        body = "\n".join(lines)
        in_section = _cited(body)
        blocks = paragraphs(lines)
        text = [b for _, b in blocks if not re.match(r"#{1,6} ", b[0])]
        marker = "\n".join(text[0]).strip() if text else ""
        measured = marker != NOT_MEASURED and bool(MEASURED_WORDS.search(body))
        lead: tuple[str, ...] = ()
        for first, block in blocks:
            own = _cited("\n".join(block))
            is_item = bool(re.match(r"\s*([-*]|\d+\.) ", block[0]))
            records = own or (lead if is_item else in_section)
            if not is_item and own:
                lead = own
            for index, line in enumerate(block):
                keys = list(KEY.finditer(line))
                for m in _figures(line):
                    key = next((k for k in keys if 0 <= k.start() - m[4] <= 1), None)
                    here = "\n".join(block)
                    if NOT_MEASURED in here and not key:
                        continue
                    verdict = _verdict(m, key, records, measured)
                    if verdict in ("unsourced", "mismatched") and (
                            WITHDRAWN in here or marker == WITHDRAWN):
                        verdict = "withdrawn"
                    if verdict:
                        figures.append(Figure(path.name, start + first + index, heading,
                                              line[m[3]:m[4]], verdict, records))
    return figures


def default_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--list", action="store_true", help="print each mismatched/unsourced figure")
    args = ap.parse_args(argv)
    figures = [f for p in (args.files or default_files()) for f in audit_file(p)]
    counts: dict[str, int] = {}
    for f in figures:
        counts[f.verdict.split(" ")[0]] = counts.get(f.verdict.split(" ")[0], 0) + 1
        if args.list and f.verdict not in ("keyed", "matched"):
            print(f"{f.doc}:{f.line} [{f.section}] {f.text!r}: {f.verdict} {list(f.records)}")
    print(f"figures checked {len(figures)}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
