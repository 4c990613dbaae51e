"""Every benchmark record the README or docs/ cite exists under benchmarks/results/: a
figure names its record, and a record that is not in the repository backs nothing."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# <name>-YYYYMMDD-HHMMSS, or <name>-YYYYMMDD.json: how records are named (common.write_record)
CITATION = re.compile(r"\b([A-Za-z0-9_.-]*?[A-Za-z0-9_]-20\d{6}(?:-\d{6})?)(\.json)?\b")


def cited_records() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in path.read_text().splitlines():
            for name, ext in CITATION.findall(line):
                if ext or re.search(r"-\d{8}-\d{6}$", name):
                    found.setdefault(name, set()).add(path.name)
    return found


def test_the_citation_pattern_finds_record_names():
    line = "record `engine_vs_hf-20261201-192023.json`, and sim_calibration-20261129-231652"
    assert [n for n, _ in CITATION.findall(line)] == ["engine_vs_hf-20261201-192023",
                                                      "sim_calibration-20261129-231652"]


def test_every_cited_record_is_in_the_repository():
    cited = cited_records()
    assert cited, "no record citations found: the pattern is broken"
    missing = {name: sorted(docs) for name, docs in cited.items()
               if not (RESULTS / f"{name}.json").is_file()}
    assert not missing, f"cited records not under benchmarks/results/: {missing}"
