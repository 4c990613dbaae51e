"""Reading the user's files: an existing-file check and JSONL records, with errors that
name the file and the line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, Iterator


def require_file(path: str | Path, what: str) -> Path:
    """``path`` as a Path; ValueError naming it (as ``what``) if it is not a file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist or is not a file")
    return path


def jsonl_records(lines: Iterable[str], locate: Callable[[int], str]
                  ) -> Iterator[tuple[int, object]]:
    """(line number, parsed record) for every non-blank line; a line that is not JSON
    raises ValueError prefixed by ``locate(line_number)``."""
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{locate(line_no)}: not valid JSON ({e.msg})") from None
        yield line_no, record
