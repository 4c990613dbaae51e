"""The machine class and compute dtype every benchmark record names at its top level
(``machine_class``, ``dtype``): a figure is true on the class it was measured on.

A new record takes them from the hardware profile it embeds (``environment.hardware``,
:meth:`kvmap.hardware.HardwareProfile.summary`) and the dtype its config names, or the
dtype ``auto`` picks on that class. A record written before the writer named them is
back-filled by :func:`back_fill`: from its embedded profile when it has one, else from
the README's date rule (the 2-core machine was a Zen 4, class ``x86-avx512-bf16``, before
2026-12-03, an Ice Lake, class ``x86-avx512``, from then on), and then says so in
``machine_class_source``."""
from __future__ import annotations

import re

# the README's rule for records without a profile: (first day, class, auto dtype there)
DATE_RULE = (("2026-12-03", "x86-avx512", "fp32"), ("0000-00-00", "x86-avx512-bf16", "bf16"))
MEASURED = "profile"              # machine_class_source of a record with its own profile
FORCED = "profile, forced by KVMAP_NATIVE_BF16"   # ... whose native-bf16 verdict was forced
INFERRED = "inferred from date"   # ... of one whose class follows from the date rule
SIMULATED = "simulated"           # a simulator's output: no machine measured anything
_DATE = re.compile(r"(20\d{2})(\d{2})(\d{2})")


def fields_from_profile(hardware: dict, config: dict) -> dict:
    """``machine_class``, ``dtype`` and their source for a record whose profile is
    ``hardware``: the config's dtype when it names one, else ``auto``'s on that class."""
    if not hardware.get("machine_class"):
        raise ValueError(f"hardware profile without machine_class: {sorted(hardware)}")
    dtype = config.get("dtype") if isinstance(config.get("dtype"), str) else None
    if dtype in (None, "auto"):
        dtype = _auto_dtype(hardware, str(config.get("device") or "cpu"))
    if not dtype:
        raise ValueError(f"no dtype in config {sorted(config)} nor in the profile")
    forced = bool(hardware.get("native_bf16_forced"))
    return {"machine_class": hardware["machine_class"], "dtype": dtype,
            "machine_class_source": FORCED if forced else MEASURED}


def _auto_dtype(hardware: dict, device: str) -> str | None:
    """What ``dtype: auto`` picks on ``device`` by the profile (``HardwareProfile
    .auto_dtype``): on a CUDA device bf16 from compute capability 8.0, else fp16."""
    if not device.startswith("cuda"):
        return hardware.get("auto_dtype_cpu")
    index = int(device.partition(":")[2] or 0)
    devices = hardware.get("cuda") or []
    if index >= len(devices):
        raise ValueError(f"device={device!r} is not in the profile's {len(devices)} CUDA devices")
    return "bf16" if tuple(devices[index]["capability"]) >= (8, 0) else "fp16"


def class_on_date(day: str) -> tuple[str, str]:
    """(class, auto dtype) the date rule gives for ``day`` (YYYY-MM-DD)."""
    for first, machine_class, dtype in DATE_RULE:
        if day >= first:
            return machine_class, dtype
    raise ValueError(f"day={day!r} precedes every rule")


def record_day(name: str, record: dict, committed: str | None = None) -> str:
    """The day a record was written: its ``time``/``started_at`` field, else the date in
    its file name, else ``committed`` (the day it was first committed); ValueError naming
    the file when none is known."""
    stamp = record.get("time") or record.get("started_at")
    if isinstance(stamp, str) and re.match(r"\d{4}-\d{2}-\d{2}", stamp):
        return stamp[:10]
    match = _DATE.search(name)
    if not match and committed:
        return committed
    if not match:
        raise ValueError(f"record {name!r} has no time field and no date in its name")
    return "-".join(match.groups())


def back_fill(name: str, record: dict, committed: str | None = None) -> dict:
    """``record`` with ``machine_class``, ``dtype`` and ``machine_class_source``; a record
    that has both fields already is returned unchanged."""
    if "machine_class" in record and "dtype" in record:
        return record
    config = record.get("config") if isinstance(record.get("config"), dict) else {}
    hardware = (record.get("environment") or {}).get("hardware") or {}
    if hardware.get("machine_class"):
        fields = fields_from_profile(hardware, config)
    elif "results" in record and "scenario" in record:          # kvmap simulate output
        config = record["results"][0]["config"]
        fields = {"machine_class": f"{SIMULATED}:{config['hardware']['name']}",
                  "dtype": config["weights"], "machine_class_source": SIMULATED}
    else:
        machine_class, auto = class_on_date(record_day(name, record, committed))
        dtype = config.get("dtype") if isinstance(config.get("dtype"), str) else auto
        fields = {"machine_class": machine_class, "dtype": dtype,
                  "machine_class_source": INFERRED, "inferred": True}
    return {**fields, **record}
