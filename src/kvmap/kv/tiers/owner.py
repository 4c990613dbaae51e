"""Who owns a private tier namespace: a Redis key prefix or a disk directory carries the
pid of the process that made it, so a later process can tell a live owner from a dead
one (killed cells run no clean-up) and remove only what the dead left behind.

A pid means something only inside one pid namespace of one running kernel: two
containers on a host network share a host name, yet a live process of one is invisible
(``kill(pid, 0)`` fails) from the other. So every namespace also carries
:func:`owner_tag` -- the host name and a hash of the boot id and the pid namespace -- and
a sweep only judges the pids of namespaces with its own tag; anything else is left to
its TTL (Redis) or to its owner.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
from functools import lru_cache


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def pid_space() -> str:
    """12 hex digits naming where this process's pids live: the kernel's boot id and
    this process's pid namespace (its inode)."""
    try:
        ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        ns = ""
    ident = f"{_read('/proc/sys/kernel/random/boot_id')}\x00{ns}\x00{socket.gethostname()}"
    return hashlib.blake2b(ident.encode(), digest_size=6).hexdigest()


def owner_tag() -> str:
    """The host name (safe inside a key, a file name and a SCAN pattern: no ``:``, no
    glob characters) and :func:`pid_space`: ``<host>.<12 hex>``."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64]
    return f"{host}.{pid_space()}"
