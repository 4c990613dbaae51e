"""Local-disk tier: one file per block.

Each block is written to a temporary name in the same directory and ``os.replace``d
onto its final name, so a reader never sees half a file from a crash or a concurrent
writer. No fsync: this is a cache, and a block lost to a power cut is only a miss.
The serde frame's CRC is checked on every read; a truncated or corrupted file is a
miss counted as ``corrupt`` and the file is deleted. ``ENOSPC`` on write is a failed
put counted as ``disk_full``; other OS errors count as ``io``.

File names are a hash of the typed key (``base.key_bytes``), so any key is a safe,
fixed-length name. The index lives in memory: files from an earlier run are not
adopted, and stale ``*.kvb`` files found in the directory at start are removed -- so
give each live tier a directory of its own.

Leaks: a directory the tier makes (:func:`private_directory`) is named
``kvmap-disk-<space>-<pid>-<random>``; :meth:`close` and an ``atexit`` hook remove it,
and each new one first removes its siblings whose pid is dead in the same pid space
(``owner.py``; a killed cell runs neither). A
directory on tmpfs or ramfs is RAM, not disk: the tier warns (``TmpfsWarning``).
"""
from __future__ import annotations

import atexit
import errno
import hashlib
import logging
import os
import re
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path

from kvmap.kv.tiers.backend import tier_backend
from kvmap.kv.tiers.base import Key, Tier, TierError, key_bytes
from kvmap.kv.tiers.owner import pid_alive, pid_space

SUFFIX = ".kvb"
DIR_PREFIX = "kvmap-disk-"
_PRIVATE_DIR = re.compile(rf"{DIR_PREFIX}([0-9a-f]{{12}})-(\d+)-")
RAM_FILESYSTEMS = ("tmpfs", "ramfs")
log = logging.getLogger(__name__)


class TmpfsWarning(RuntimeWarning):
    """A disk tier whose directory is in RAM."""


def sweep_dead_directories(parent: str | os.PathLike) -> list[Path]:
    """Remove ``kvmap-disk-<space>-<pid>-*`` directories under ``parent`` whose process
    is dead and whose ``space`` is ours (``owner.pid_space``: the same boot and pid
    namespace, where a pid can be checked); the ones removed. Directories of live
    processes, of another pid namespace (a container sharing the directory), and
    anything else, stay."""
    removed = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for path in entries:
        m = _PRIVATE_DIR.match(path.name)
        if m and path.is_dir() and m.group(1) == pid_space() \
                and int(m.group(2)) != os.getpid() and not pid_alive(int(m.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def private_directory(parent: str | os.PathLike | None = None) -> Path:
    """A new ``kvmap-disk-<space>-<pid>-<random>`` directory under ``parent`` (default:
    the temp dir), after sweeping the ones of dead processes there."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_directories(parent)
    return Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{pid_space()}-{os.getpid()}-",
                                 dir=parent))


def filesystem_type(path: str | os.PathLike) -> str | None:
    """The type of the filesystem ``path`` is on, from /proc/mounts (None: unknown)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    target = os.path.realpath(path)
    best = None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and \
                (best is None or len(point) > len(best[0])):
            best = (point, fstype)
    return best[1] if best else None


def _remove_at_exit(ref: weakref.ref) -> None:
    tier = ref()
    if tier is not None:
        tier.close()


def _os_error_kind(e: OSError) -> str:
    return "disk_full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "io"


def sweep_after_kill(options: dict) -> None:
    """A killed process's disk levels: the directories of dead processes under the temp
    dir and under the level's ``parent`` (``disk_path=``)."""
    sweep_dead_directories(tempfile.gettempdir())
    if options.get("parent") is not None:
        sweep_dead_directories(options["parent"])


@tier_backend(order=20, latency_prior_s=200e-6, bandwidth_prior_bytes_per_s=5e8,
              options={"disk_path": "parent"}, sweep=sweep_after_kill)
class DiskTier(Tier):
    """Blocks as files under ``directory``, or, when it is not given, under a fresh
    directory of this process (``private_directory``) under ``parent`` (default: the
    temp dir; ``disk_path=``), removed by :meth:`close`. ``capacity_bytes`` bounds the
    sum of file sizes."""

    name = "disk"
    verify_reads = True
    authenticate = True

    def __init__(self, capacity_bytes: int, eviction="lru", on_evict=None,
                 directory: str | os.PathLike | None = None,
                 parent: str | os.PathLike | None = None) -> None:
        if directory is not None and parent is not None:
            raise ValueError(f"disk tier: directory={str(directory)!r} and "
                             f"parent={str(parent)!r} exclude each other")
        super().__init__(capacity_bytes, eviction, on_evict)
        self._owns_directory = directory is None
        self.directory = Path(directory) if directory is not None \
            else private_directory(parent)
        self.directory.mkdir(parents=True, exist_ok=True)
        for pattern in (f"*{SUFFIX}", f"*{SUFFIX}.*.tmp"):
            for stale in self.directory.glob(pattern):
                stale.unlink(missing_ok=True)
        self.filesystem = filesystem_type(self.directory)
        if self.filesystem in RAM_FILESYSTEMS:
            message = (f"disk tier directory {str(self.directory)!r} is on "
                       f"{self.filesystem}: its blocks live in RAM, not on disk; give "
                       "disk_path= a directory on a real disk")
            warnings.warn(message, TmpfsWarning, stacklevel=2)
            log.warning(message)
        atexit.register(_remove_at_exit, weakref.ref(self))

    def path_of(self, key: Key) -> Path:
        """The file that holds ``key``'s block (whether or not it exists)."""
        return self.directory / (hashlib.blake2b(key_bytes(key), digest_size=20).hexdigest()
                                 + SUFFIX)

    def _read(self, key: Key) -> bytes | None:
        try:
            return self.path_of(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise TierError(_os_error_kind(e), str(e)) from e

    def _write(self, key: Key, data: bytes) -> None:
        path = self.path_of(key)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise TierError(_os_error_kind(e), str(e)) from e

    def _delete(self, key: Key) -> None:
        try:
            self.path_of(key).unlink(missing_ok=True)
        except OSError as e:
            raise TierError(_os_error_kind(e), str(e)) from e

    def close(self) -> None:
        """Delete every block file; remove the directory if the tier created it.
        Idempotent (it also runs at interpreter exit)."""
        for key in self.keys():
            self.delete(key)
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
