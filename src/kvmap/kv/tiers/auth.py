"""Frame authentication: a keyed BLAKE2b tag over a tier key and the bytes stored under it.

A CRC catches accidents; anyone who can write the Redis (or the disk directory) can
recompute one, and can also move a valid frame from one key to another or put back an
older value. A tier that stores outside this process (disk, redis: ``Tier.authenticate``)
therefore remembers, for each key it wrote, ``tag(key, data)`` -- BLAKE2b keyed with the
tier's secret, over the typed key and the data -- and accepts a read only when the bytes
read give the same tag. That refuses, as a counted miss:

- corrupted or truncated bytes (a different digest),
- a frame written under another key (the key is hashed in),
- a replayed older value of the same key (the index holds the tag of the newest put),
- a forged frame (without the secret, no one can compute a matching tag).

The tag lives in the tier's in-memory index, not in the store, so stored bytes are exactly
the frame. The secret is random per process (``process_key``) unless one is given: a
namespace shared between processes (not built yet) would store the tag with its value and
give every process the namespace's key, which is what ``FrameAuth(key=...)`` is for.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

TAG_BYTES = 16
_PROCESS_KEY = secrets.token_bytes(32)


def process_key() -> bytes:
    """This process's random authentication key (never written anywhere)."""
    return _PROCESS_KEY


class FrameAuth:
    """Computes and checks tags with one key (default: the process key)."""

    def __init__(self, key: bytes | None = None) -> None:
        key = process_key() if key is None else key
        if not isinstance(key, bytes) or not 16 <= len(key) <= 64:
            raise ValueError(f"an authentication key must be 16 to 64 bytes, got "
                             f"{len(key) if isinstance(key, bytes) else type(key).__name__}")
        self._key = key

    def tag(self, key_bytes: bytes, data: bytes) -> bytes:
        h = hashlib.blake2b(key=self._key, digest_size=TAG_BYTES)
        h.update(len(key_bytes).to_bytes(4, "little"))   # key|data split is unambiguous
        h.update(key_bytes)
        h.update(data)
        return h.digest()

    def check(self, key_bytes: bytes, data: bytes, expected: bytes) -> bool:
        return hmac.compare_digest(self.tag(key_bytes, data), expected)
