"""The ``endpoints:`` section of a scenario -> ``EndpointEntry`` values, every problem at
once (``endpoints[0] (llamacpp-q8).launch: ...``), and the ``endpoints:`` filter a
workload or task may take (``endpoints: [a, b]``; absent: every endpoint)."""
from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvmap.bench.endpoint_spec import (DEFAULT_STARTUP_TIMEOUT_S, ENDPOINT_KEYS, HOSTS_ENV,
                                       PLACEHOLDERS, EndpointEntry, placeholder_values,
                                       user_hosts)
from kvmap.hosts import is_loopback
from kvmap.kv.redact import check_no_password

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_endpoints(raw: Any, problems, base_dir: Path, taken: set[str]
                    ) -> list[EndpointEntry]:
    """The scenario's endpoints; ``taken``: names an endpoint may not have (KV specs,
    dtypes: a record's ``kv`` is the endpoint's name)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.add("endpoints", f"{raw!r} must be a list of endpoints")
        return []
    out: list[EndpointEntry] = []
    for i, item in enumerate(raw):
        where = f"endpoints[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not item["name"].strip():
            problems.add(where, f"{item!r} must be a mapping with a 'name'")
            continue
        name = item["name"].strip()
        where = f"endpoints[{i}] ({name})"
        entry = _parse_one(item, name, where, problems, base_dir)
        if name in taken or any(e.name == name for e in out):
            problems.add(f"{where}.name", f"{name!r} is already the name of a KV "
                                          "configuration or another endpoint")
            continue
        if entry is not None:
            out.append(entry)
    for e in out:
        names = [x.name for x in out if x is not e]
        if e.baseline is not None and e.baseline not in names and e.baseline not in taken:
            problems.add(f"endpoints ({e.name}).baseline",
                         f"{e.baseline!r} is neither another endpoint ({names}) nor one "
                         f"of the scenario's KV configurations ({sorted(taken)})")
    return out


def _parse_one(item: dict, name: str, where: str, problems, base_dir: Path
               ) -> EndpointEntry | None:
    from kvmap.config import parse_size
    n0 = len(problems.items)
    for key in item:
        if key == "api_key":
            problems.add(f"{where}.api_key", "an API key is never read from the scenario "
                         "file; put it in an environment variable and name it in "
                         "api_key_env")
        elif key not in ENDPOINT_KEYS:
            problems.add(f"{where}.{key}", f"unknown key {key!r}; valid keys: "
                                           f"{', '.join(sorted(ENDPOINT_KEYS))}")
    model = _optional_str(item, "model", where, problems)
    if model is None and "model" not in item:
        problems.add(f"{where}.model", "the served model name is required")
    launch = item.get("launch")
    launched = launch is not None and _check_launch(launch, where, problems)
    url = item.get("url") or ("http://127.0.0.1:{port}" if launch is not None else None)
    if not isinstance(url, str):
        problems.add(f"{where}.url", f"{url!r}: a URL is required without a launch command")
    else:
        _check_url(url, launch is not None, where, problems)
    kv_memory = None
    if item.get("kv_memory") is not None:
        try:
            kv_memory = parse_size(item["kv_memory"], "kv_memory")
        except ValueError as e:
            problems.add(f"{where}.kv_memory", str(e))
    metrics = item.get("metrics", "/metrics")
    if metrics is not None and (not isinstance(metrics, str) or not metrics.startswith("/")):
        problems.add(f"{where}.metrics", f"{metrics!r} must be a path such as /metrics, or "
                                         "null")
    key_env = _optional_str(item, "api_key_env", where, problems)
    if key_env is not None:
        if not _ENV_NAME.fullmatch(key_env):
            problems.add(f"{where}.api_key_env", f"{key_env!r} is not an environment "
                                                 "variable name")
        elif not os.environ.get(key_env):
            problems.add(f"{where}.api_key_env", f"environment variable {key_env} is not "
                                                 "set")
    gguf = _optional_str(item, "gguf", where, problems)
    if gguf is not None:
        path = (base_dir / gguf).expanduser()
        if not path.is_file():
            problems.add(f"{where}.gguf", f"{gguf!r} is not a file")
        gguf = str(path.resolve())
    timeout = item.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        problems.add(f"{where}.startup_timeout_s", f"{timeout!r} must be seconds > 0")
    tokenizer = _optional_str(item, "tokenizer", where, problems) or "smollm2"
    entry_args = dict(name=name, url=url, model=model, kv_label=_optional_str(
        item, "kv_label", where, problems), kv_memory_bytes=kv_memory, launch=launch,
        metrics_path=metrics, api_key_env=key_env, tokenizer=str(tokenizer), gguf=gguf,
        baseline=_optional_str(item, "baseline", where, problems),
        startup_timeout_s=float(timeout) if len(problems.items) == n0 else 1.0)
    if len(problems.items) > n0:
        return None
    entry = EndpointEntry(**entry_args)
    if launched and "{gguf}" in launch:
        try:
            placeholder_values(entry, 0)
        except ValueError as e:
            problems.add(f"{where}.launch", f"{{gguf}} has no value: {e} (or give gguf:)")
            return None
    return entry


def reserved_names(data: dict, kv: list[str]) -> set[str]:
    """Names an endpoint may not take: the KV specs anywhere in the scenario, the dtypes
    (an endpoint's cells carry its name where in-process cells carry their KV spec)."""
    from kvmap.config import DTYPES
    jobs = [j for section in ("workloads", "tasks") for j in
            (data.get(section) if isinstance(data.get(section), list) else [])
            if isinstance(j, dict) and isinstance(j.get("kv"), list)]
    return set(kv) | set(DTYPES) | {s for j in jobs for s in j["kv"] if isinstance(s, str)}


def parse_endpoint_filter(item: dict, where: str, endpoints: list[EndpointEntry],
                          problems) -> tuple[str, ...] | None:
    """A workload's or task's ``endpoints: [names]`` (None when absent: all of them)."""
    if "endpoints" not in item:
        return None
    raw, names = item["endpoints"], [e.name for e in endpoints]
    if not isinstance(raw, list) or any(n not in names for n in raw):
        problems.add(f"{where}.endpoints", f"{raw!r} must be a list of the scenario's "
                                           f"endpoints {names}")
        return None
    return tuple(raw)


def _check_url(url: str, launched: bool, where: str, problems) -> bool:
    try:
        check_no_password(url, f"{where}.url", "Put the key in an environment variable "
                          "and name it in api_key_env.")
    except ValueError as e:
        problems.add(f"{where}.url", str(e))
        return False
    parts = urlsplit(url.replace("{port}", "1"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.add(f"{where}.url", f"{url!r} must be an http:// or https:// URL")
        return False
    host = parts.hostname
    if launched and not is_loopback(host):
        problems.add(f"{where}.url", f"{url!r}: a launched server is reached on loopback "
                                     "(127.0.0.1, localhost, ::1)")
        return False
    if not is_loopback(host) and host.lower() not in user_hosts():
        problems.add(f"{where}.url", f"host {host!r} is not loopback; endpoints reach "
                     f"loopback or the hosts listed in ${HOSTS_ENV} (comma-separated)")
        return False
    if "{port}" in url and not launched:
        problems.add(f"{where}.url", f"{url!r} has {{port}} but no launch command")
        return False
    return True


def _check_launch(command: Any, where: str, problems) -> bool:
    if not isinstance(command, str) or not command.strip():
        problems.add(f"{where}.launch", f"{command!r} must be a command line")
        return False
    try:
        names = {field for _, field, _, _ in string.Formatter().parse(command) if field}
    except ValueError as e:
        problems.add(f"{where}.launch", f"{command!r}: {e}")
        return False
    unknown = sorted(names - set(PLACEHOLDERS))
    if unknown:
        problems.add(f"{where}.launch", f"unknown placeholder {{{unknown[0]}}}; valid: "
                     + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
        return False
    if "port" not in names:
        problems.add(f"{where}.launch", "has no {port}: the runner picks a free port and "
                                        "the command must listen on it")
        return False
    return True


def _optional_str(item: dict, key: str, where: str, problems) -> str | None:
    value = item.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        problems.add(f"{where}.{key}", f"{value!r} must be a non-empty string")
        return None
    return value
