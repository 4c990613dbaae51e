"""The typed views of a cell record's other payloads: ``CellEnv`` (how busy the machine was
and which profile it ran on: ``hardware.process.machine_env``), ``Estimate`` (the
preflight's estimate of the cell beside its actual wall time: ``bench.estimate``) and
``Prediction`` (the simulator's prediction of a workload cell: ``plan.sim.predict``, with
the ``PredictedMetrics``, ``Roofline`` and the GPU beside). Read by ``CellRecord``'s
``cell_env``, ``cell_estimate`` and ``cell_prediction``; ``EndpointInfo``: the server an
endpoint cell measured (its ``metrics.endpoint``, a workload's or a task's); a value of
the wrong kind is a ``ValueError`` naming the cell and the key (``runs.payload.view``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvmap.runs.payload import view


@dataclass(frozen=True)
class CellEnv:
    """The machine over one cell: threads, load average at both ends, the profile."""

    num_threads: int | None = None
    load_avg_1m_start: float | None = None
    load_avg_1m_end: float | None = None
    num_cpus: int | None = None
    omp_wait_policy: str | None = None
    hardware: dict[str, Any] | None = None      # hardware.profile.record_summary
    backend: str | None = None
    node: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def machine_class(self) -> str | None:
        value = (self.hardware or {}).get("machine_class")
        return value if isinstance(value, str) else None

    @property
    def fingerprint(self) -> str | None:
        value = (self.hardware or {}).get("fingerprint")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Estimate:
    """The preflight's seconds for the cell, its parts, and the seconds it took."""

    estimate_s: float | None = None
    actual_s: float | None = None
    parts_s: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PredictedMetrics:
    """What the simulator predicts of a cell's headline metrics."""

    output_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    tbt_p50_s: float | None = None
    e2e_mean_s: float | None = None
    concurrency_max: float | None = None
    concurrency_mean: float | None = None
    num_preemptions: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any) -> PredictedMetrics:
        return view(cls, data, "")


@dataclass(frozen=True)
class Roofline:
    """The bytes a decode step reads and where one more sequence stops being free."""

    weight_bytes: float | None = None
    kv_capacity_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    ridge_num_seqs: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any) -> Roofline:
        return view(cls, data, "")


@dataclass(frozen=True)
class GpuPrediction:
    """The same configuration and requests simulated on a catalogued GPU."""

    name: str | None = None
    hardware: str | None = None                 # the GPU profile's own words
    metrics: PredictedMetrics = field(default_factory=PredictedMetrics)
    bound_share: dict[str, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any) -> GpuPrediction:
        return view(cls, data, "", nested={"metrics": PredictedMetrics.read})


@dataclass(frozen=True)
class Prediction:
    """The simulator's prediction of one workload cell on the machine it ran on; a
    prediction not made says why (``skipped``, or the simulation's ``error``)."""

    hardware: str | None = None
    calibration: str | None = None
    kv_costs: str | None = None
    metrics: PredictedMetrics | None = None
    time_s: dict[str, float] | None = None
    bound_share: dict[str, float] | None = None
    roofline: Roofline = field(default_factory=Roofline)
    approximations: list[str] | None = None
    slo_attainment: dict[str, Any] | None = None
    gpu: GpuPrediction | None = None
    skipped: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: Any, where: str) -> Prediction:
        return view(cls, data, where,
                    nested={"metrics": PredictedMetrics.read, "roofline": Roofline.read,
                            "gpu": GpuPrediction.read})

    @property
    def why_not(self) -> str | None:
        """Why no prediction was made (None when one was)."""
        return self.skipped or self.error

    def codec_share(self) -> float | None:
        """The share of the predicted busy time the KV codec's own operators take."""
        busy = (self.time_s or {}).get("busy")
        return (self.time_s or {}).get("kv_codec", 0.0) / busy if busy else None


@dataclass(frozen=True)
class EndpointInfo:
    """The server a cell measured over HTTP (``bench.endpoint_http.endpoint_info``)."""

    name: str | None = None
    url: str | None = None
    model: str | None = None
    kv_label: str | None = None
    label: str | None = None
    kv_memory_bytes: float | None = None
    launched: bool | None = None
    baseline: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadLevel:
    """The load level of a swept or searched cell (``workloads.options.Load.to_dict``);
    a search's probe carries ``search``: its ``role`` and the search's written settings
    (``runs.search_settings``)."""

    label: str | None = None
    kind: str | None = None
    value: float | None = None
    search: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def search_role(self) -> str | None:
        """``serial``, ``saturated``, ``level``, ``bisect``... (None: not a probe)."""
        role = (self.search or {}).get("role")
        return None if role is None else str(role)
