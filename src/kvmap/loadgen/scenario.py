"""What one ``kvmap loadgen`` run is: the value the run store keeps and fingerprints.

``RunStore.open_for(run_dir, scenario, text)`` needs ``fingerprint()``, ``to_dict()`` and
``seed``; ``LoadgenScenario`` gives them, so a load run lands in a run directory of the
same format as ``kvmap bench`` (``run.json``, ``index.sqlite``, ``requests.parquet``)
and ``kvmap report`` reads it the same way. ``scenario.yaml`` holds this value as YAML.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import yaml

from kvmap.loadgen.schedule import Level


@dataclass(frozen=True)
class LoadgenScenario:
    """The server, the workload and the load levels of one run.

    ``num_requests`` and ``duration_s`` bound every level (either or both);
    ``label`` names the KV configuration in the store (None: ask the server).
    """

    url: str
    model: str
    levels: tuple[Level, ...]
    workload: str | None = "throughput"
    trace: str | None = None
    api: str = "completions"
    stream: bool = True
    num_requests: int | None = None
    duration_s: float | None = None
    drain_timeout_s: float = 30.0
    request_timeout_s: float = 300.0
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    tokenizer: str = "smollm2"
    slo: dict | None = None
    seed: int = 0
    num_warmup: int = 1
    label: str | None = None
    name: str = "loadgen"
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("a load run needs at least one level")
        if self.num_requests is not None and (not isinstance(self.num_requests, int)
                                              or self.num_requests < 1):
            raise ValueError(f"--num-requests={self.num_requests!r} must be an integer >= 1")
        if not isinstance(self.num_warmup, int) or self.num_warmup < 0:
            raise ValueError(f"--warmup={self.num_warmup!r} must be an integer >= 0")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"--duration={self.duration_s!r} must be > 0 seconds")

    @property
    def workload_name(self) -> str:
        if self.trace:
            from pathlib import Path
            return f"trace:{Path(self.trace).stem}"
        return self.workload or "throughput"

    def to_dict(self) -> dict:
        return {"kind": "loadgen", **asdict(self)}

    def fingerprint(self) -> str:
        data = {k: v for k, v in self.to_dict().items() if k != "description"}
        return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()
                            ).hexdigest()[:16]

    def text(self) -> str:
        return yaml.safe_dump(json.loads(json.dumps(self.to_dict(), default=str)),
                              sort_keys=False)
