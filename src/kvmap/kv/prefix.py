"""Chained block hashes for cross-request prefix reuse.

Block j's hash covers the model, the KV layout and every token up to the end of block j:

    h_j = sha256(salt || h_{j-1} || token_ids[j*bs : (j+1)*bs])

where salt = sha256(model id, KV layout (codec/policy spec), dtype), or, for a request
with a ``cache_salt`` (a tenant's, vLLM's field), sha256(that salt, "cache_salt",
cache_salt). Two requests share block j exactly when they share the salt and the first
(j+1)*bs tokens: tenants with different salts share nothing, and someone who can read
block hashes (a shared pool's Redis) cannot test a guessed prompt without the salt. Only
full blocks are hashed.
"""
from __future__ import annotations

import hashlib
import struct


def prefix_salt(model_id: str, kv_layout: str, dtype: str) -> bytes:
    return hashlib.sha256(f"{model_id}\x00{kv_layout}\x00{dtype}".encode()).digest()


def tenant_salt(salt: bytes, cache_salt: str) -> bytes:
    """The salt of a request with ``cache_salt`` (any string) on an engine of ``salt``."""
    return hashlib.sha256(salt + b"\x00cache_salt\x00" + cache_salt.encode()).digest()


def block_hashes(token_ids: list[int], block_size: int, salt: bytes,
                 start_block: int = 0, parent: bytes | None = None) -> list[bytes]:
    """Hashes of the full blocks ``start_block, start_block+1, ...`` of ``token_ids``.
    ``parent`` is the hash of block ``start_block - 1`` (None at the start)."""
    out = []
    prev = parent if parent is not None else salt
    for j in range(start_block, len(token_ids) // block_size):
        chunk = token_ids[j * block_size:(j + 1) * block_size]
        h = hashlib.sha256()
        h.update(salt)
        h.update(prev)
        h.update(struct.pack(f"<{block_size}q", *chunk))
        prev = h.digest()
        out.append(prev)
    return out
