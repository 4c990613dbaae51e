"""The machine's profile (``profile.py``: what it is, its class, its measured rates,
cached per machine), the probes that measure it (``probes.py``) and ``dtype: auto``
(``dtype.py``). The floor of the house: imports nothing of kvmap but ``config``."""
from kvmap.hardware.dtype import resolve_dtype, supported_dtypes
from kvmap.hardware.profile import (AUTO, CPUInfo, CUDAInfo, HardwareProfile, cache_dir,
                                    detect, load_cached, measure, profile, record_summary)

__all__ = ["AUTO", "CPUInfo", "CUDAInfo", "HardwareProfile", "cache_dir", "detect",
           "load_cached", "measure", "profile", "record_summary", "resolve_dtype",
           "supported_dtypes"]
