"""Request streams: length distributions, arrival processes, corpus text and presets."""
from kvmap.workloads.presets import PRESETS, build_requests, get_preset
from kvmap.workloads.spec import WorkloadRequest, WorkloadSpec

__all__ = ["PRESETS", "WorkloadRequest", "WorkloadSpec", "build_requests", "get_preset"]
