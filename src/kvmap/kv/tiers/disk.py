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
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from kvmap.kv.tiers.base import Key, Tier, TierError, key_bytes

SUFFIX = ".kvb"


def _os_error_kind(e: OSError) -> str:
    return "disk_full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "io"


class DiskTier(Tier):
    """Blocks as files under ``directory`` (default: a fresh temp dir, removed by
    :meth:`close`). ``capacity_bytes`` bounds the sum of file sizes."""

    name = "disk"
    verify_reads = True
    authenticate = True

    def __init__(self, capacity_bytes: int, eviction="lru", on_evict=None,
                 directory: str | os.PathLike | None = None) -> None:
        super().__init__(capacity_bytes, eviction, on_evict)
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="kvmap-disk-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        for pattern in (f"*{SUFFIX}", f"*{SUFFIX}.*.tmp"):
            for stale in self.directory.glob(pattern):
                stale.unlink(missing_ok=True)

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
        """Delete every block file; remove the directory if the tier created it."""
        for key in self.keys():
            self.delete(key)
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
