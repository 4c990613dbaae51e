"""What a shared namespace stores: sealed frames and index entries.

A private tier keeps each value's tag in its own memory (``auth.py``); a shared one
cannot, since the reader is another process. So the tag travels with the value, keyed
with the namespace's key that every sharing process is given::

    sealed value = magic "KVMS" | version u16 | reserved u16
                   | layout fingerprint (32) | tag (16) | serde frame
    tag          = FrameAuth(frames key).tag(tier key, header before the tag + frame)

    index entry  = magic "KVMI" | layout fingerprint (32) | sealed value bytes u64
                   | tag (16)
    tag          = FrameAuth(index key).tag(tier key, fingerprint + value bytes)

Opening a sealed value checks its tag before anything else -- only a value too short
to hold one is ``corrupt`` first -- then its magic and version (``corrupt``), then the
fingerprint against the reader's own (``layout``: a key holder that wrote with another
layout). The tag covers the whole header, so a writer without the key who forges a
header (another fingerprint: "another layout") gets ``auth``, like any tampered value,
not ``layout`` (issue 38: a forged fingerprint, checked before the tag, made every
reader refuse the block for its life). Reading an index entry likewise checks its shape
(``corrupt``) and its tag (``auth``) before its fingerprint is believed. A writer
without the key can thus neither make peers refuse a block nor advertise one: ``auth``
and ``corrupt`` values are replaced by the next put (``shared_redis.py``). Each failure
is a ``TierError`` of that kind, which the tier counts and answers as a miss. Keys are
content hashes, so a replayed older value of a key is the same bytes and does no harm.
"""
from __future__ import annotations

import struct

from kvmap.kv.tiers.auth import TAG_BYTES, FrameAuth
from kvmap.kv.tiers.base import TierError
from kvmap.kv.tiers.shared_namespace import FINGERPRINT_BYTES

_HEAD = struct.Struct(f"<4sHH{FINGERPRINT_BYTES}s")       # what the tag covers, less the frame
_SEAL = struct.Struct(f"<4sHH{FINGERPRINT_BYTES}s{TAG_BYTES}s")
_ENTRY = struct.Struct(f"<4s{FINGERPRINT_BYTES}sQ{TAG_BYTES}s")
SEAL_MAGIC, ENTRY_MAGIC, SEAL_VERSION = b"KVMS", b"KVMI", 3   # 3: the tag covers the header
SEAL_HEADER_BYTES = _SEAL.size


def seal(auth: FrameAuth, key_bytes: bytes, fingerprint: bytes, frame: bytes) -> bytes:
    """``frame`` under the sealed header (see the module docstring)."""
    head = _HEAD.pack(SEAL_MAGIC, SEAL_VERSION, 0, fingerprint)
    return head + auth.tag(key_bytes, head + frame) + frame


def open_sealed(auth: FrameAuth, key_bytes: bytes, fingerprint: bytes,
                data: bytes) -> bytes:
    """The frame inside a sealed value read under ``key_bytes``. Raises TierError of
    kind corrupt, auth or layout -- the tag checked before the header is believed."""
    if not isinstance(data, bytes) or len(data) < SEAL_HEADER_BYTES:
        raise TierError("corrupt", "a shared value shorter than its sealed header")
    head, tag = data[:_HEAD.size], data[_HEAD.size:SEAL_HEADER_BYTES]
    frame = data[SEAL_HEADER_BYTES:]
    if not auth.check(key_bytes, head + frame, tag):
        raise TierError("auth", "the frame's tag does not match (tampered, forged, or "
                                "another key)")
    magic, version, _, stored_fp = _HEAD.unpack(head)
    if magic != SEAL_MAGIC or version != SEAL_VERSION:
        raise TierError("corrupt", f"sealed header magic {magic!r} version {version}")
    if stored_fp != fingerprint:
        raise TierError("layout", "the frame was written with another model or KV layout")
    return frame


def index_entry(auth: FrameAuth, key_bytes: bytes, fingerprint: bytes,
                value_bytes: int) -> bytes:
    """The index entry of a value of ``value_bytes`` under ``key_bytes``, tagged."""
    tag = auth.tag(key_bytes, fingerprint + value_bytes.to_bytes(8, "little"))
    return _ENTRY.pack(ENTRY_MAGIC, fingerprint, value_bytes, tag)


def read_index_entry(auth: FrameAuth, key_bytes: bytes, entry: bytes) -> tuple[bytes, int]:
    """(fingerprint, sealed value bytes) of the index entry read under ``key_bytes``.
    Raises TierError of kind corrupt (its shape) or auth (its tag)."""
    if not isinstance(entry, bytes) or len(entry) != _ENTRY.size:
        raise TierError("corrupt", "an index entry of the wrong size")
    magic, fingerprint, value_bytes, tag = _ENTRY.unpack(entry)
    if magic != ENTRY_MAGIC:
        raise TierError("corrupt", f"index entry magic {magic!r}")
    if not auth.check(key_bytes, fingerprint + value_bytes.to_bytes(8, "little"), tag):
        raise TierError("auth", "the index entry's tag does not match")
    return fingerprint, value_bytes
