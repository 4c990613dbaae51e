"""What a shared namespace stores: sealed frames and index entries.

A private tier keeps each value's tag in its own memory (``auth.py``); a shared one
cannot, since the reader is another process. So the tag travels with the value, keyed
with the namespace's key that every sharing process is given::

    sealed value = magic "KVMS" | version u16 | reserved u16
                   | layout fingerprint (32) | tag (16) | serde frame
    tag          = FrameAuth(key).tag(tier key, fingerprint + frame)

    index entry  = magic "KVMI" | layout fingerprint (32) | sealed value bytes u64

Opening a sealed value checks, in order: its shape (``corrupt``), the fingerprint
against the reader's own (``layout``: a peer that wrote with another layout), the tag
(``auth``: tampered, moved between keys, or written with another key). Each failure is
a ``TierError`` of that kind, which the tier counts and answers as a miss. Keys are
content hashes, so a replayed older value of a key is the same bytes and does no harm.
"""
from __future__ import annotations

import struct

from kvmap.kv.tiers.auth import TAG_BYTES, FrameAuth
from kvmap.kv.tiers.base import TierError
from kvmap.kv.tiers.shared_namespace import FINGERPRINT_BYTES

_SEAL = struct.Struct(f"<4sHH{FINGERPRINT_BYTES}s{TAG_BYTES}s")
_ENTRY = struct.Struct(f"<4s{FINGERPRINT_BYTES}sQ")
SEAL_MAGIC, ENTRY_MAGIC, SEAL_VERSION = b"KVMS", b"KVMI", 1
SEAL_HEADER_BYTES = _SEAL.size


def seal(auth: FrameAuth, key_bytes: bytes, fingerprint: bytes, frame: bytes) -> bytes:
    """``frame`` under the sealed header (see the module docstring)."""
    tag = auth.tag(key_bytes, fingerprint + frame)
    return _SEAL.pack(SEAL_MAGIC, SEAL_VERSION, 0, fingerprint, tag) + frame


def open_sealed(auth: FrameAuth, key_bytes: bytes, fingerprint: bytes,
                data: bytes) -> bytes:
    """The frame inside a sealed value read under ``key_bytes``. Raises TierError of
    kind corrupt, layout or auth."""
    if not isinstance(data, bytes) or len(data) < SEAL_HEADER_BYTES:
        raise TierError("corrupt", "a shared value shorter than its sealed header")
    magic, version, _, stored_fp, tag = _SEAL.unpack_from(data, 0)
    if magic != SEAL_MAGIC or version != SEAL_VERSION:
        raise TierError("corrupt", f"sealed header magic {magic!r} version {version}")
    if stored_fp != fingerprint:
        raise TierError("layout", "the frame was written with another model or KV layout")
    frame = data[SEAL_HEADER_BYTES:]
    if not auth.check(key_bytes, fingerprint + frame, tag):
        raise TierError("auth", "the frame's tag does not match (tampered or another key)")
    return frame


def index_entry(fingerprint: bytes, value_bytes: int) -> bytes:
    return _ENTRY.pack(ENTRY_MAGIC, fingerprint, value_bytes)


def read_index_entry(entry: bytes) -> tuple[bytes, int] | None:
    """(fingerprint, sealed value bytes) of an index entry; None if it is malformed."""
    if not isinstance(entry, bytes) or len(entry) != _ENTRY.size:
        return None
    magic, fingerprint, value_bytes = _ENTRY.unpack(entry)
    return (fingerprint, value_bytes) if magic == ENTRY_MAGIC else None
