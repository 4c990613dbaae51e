"""Start an endpoint's server for its cells, wait until it is healthy, stop it after.

``launched(entry, log_path)`` is a context manager yielding a ``Launched`` -- the entry
with its real URL (``{port}`` filled with a free port) and the process, or the entry as
it is when it has no ``launch`` (a server the user runs). The command is split like a
shell line (``shlex``) and each word's placeholders filled after the split, so a path
with spaces stays one argument; no shell runs it. Its stdout and stderr go to
``log_path``, line by line through the redaction (``log_pump``). Health: ``GET
/health``, else ``GET /v1/models``, answering 200, polled until
``entry.startup_timeout_s``. ``EndpointLaunchError`` names the cause -- the command is
not found, it exited (with its last log lines), it never became healthy.
On exit the server's whole process group is stopped (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvmap.bench.endpoint_spec import EndpointEntry, placeholder_values
from kvmap.bench.log_pump import pump_lines
from kvmap.kv.redact import redact_spec

HEALTH_PATHS = ("/health", "/v1/models")
STOP_GRACE_S = 5.0
POLL_S = 0.2


class EndpointLaunchError(RuntimeError):
    """The endpoint's server could not be started (the message says why)."""


@dataclass
class Launched:
    entry: EndpointEntry                 # with its real URL
    process: subprocess.Popen | None     # None: not launched by us

    def exit_code(self) -> int | None:
        """The server's exit code once it has exited (None: running, or not ours)."""
        return None if self.process is None else self.process.poll()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_argv(entry: EndpointEntry, port: int) -> list[str]:
    values = placeholder_values(entry, port)
    return [word.format(**values) for word in shlex.split(entry.launch)]


def log_tail(path: Path, num_lines: int = 8) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-num_lines:] if line.strip())


def is_healthy(root: str, headers: dict[str, str], timeout_s: float = 2.0) -> bool:
    """Whether the server answers 200 on one of ``HEALTH_PATHS``."""
    for path in HEALTH_PATHS:
        request = urllib.request.Request(f"{root}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return False


def stop(process: subprocess.Popen) -> None:
    """Stop the server's process group: SIGTERM, then SIGKILL after ``STOP_GRACE_S``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)      # what it left behind, too
    process.wait()


def _wait_healthy(entry: EndpointEntry, process: subprocess.Popen, log_path: Path) -> None:
    root = entry.url.rstrip("/").removesuffix("/v1")
    deadline = time.monotonic() + entry.startup_timeout_s
    headers = entry.headers()
    while True:
        code = process.poll()
        if code is not None:
            tail = log_tail(log_path)
            raise EndpointLaunchError(f"the launch command exited with code {code} before "
                                      f"the server became healthy{': ' + tail if tail else ''}")
        if is_healthy(root, headers):
            return
        if time.monotonic() > deadline:
            raise EndpointLaunchError(f"the server did not become healthy at {root} within "
                                      f"{entry.startup_timeout_s:g} s (startup_timeout_s)")
        time.sleep(POLL_S)


@contextlib.contextmanager
def launched(entry: EndpointEntry, log_path: Path) -> Iterator[Launched]:
    """The running endpoint for the block (see the module docstring)."""
    if entry.launch is None:
        yield Launched(entry, None)
        return
    from kvmap.bench.cell_process import child_env
    port = free_port()
    entry = entry.with_port(port)
    try:
        argv = launch_argv(entry, port)
    except (ValueError, KeyError) as e:
        raise EndpointLaunchError(f"launch command {entry.launch!r}: {e}") from None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "a")
    log.write(redact_spec(f"$ {shlex.join(argv)}\n"))
    log.flush()
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=child_env(),
                                   start_new_session=True)
    except OSError as e:
        log.close()
        raise EndpointLaunchError(f"the launch command cannot start: {e}") from None
    pump = pump_lines(process.stdout, log)        # its output, redacted, into the log
    try:
        _wait_healthy(entry, process, log_path)
        yield Launched(entry, process)
    finally:
        stop(process)
        pump.join(timeout=5)
        log.close()
