"""Who may read a shared remote pool: its namespace, its key, and the spec checks.

Processes share blocks through ``tiers(redis=URL, shared=true, shared_key=env:NAME)``.
A block's bytes depend on the weights, the KV geometry, the codecs and the compute
dtype, so those -- and nothing about the process -- make the namespace:

    identity    = weights_identity(model id, ModelConfig, weight format, sampled weights)
    fingerprint = sha256(identity, geometry + block size, pool codec, level codec, dtype)
    namespace   = "kvmap:shared:" + hex(fingerprint[:16]) + ":"

A peer with another model or codec lands in another namespace and never reads ours.
The full fingerprint also travels in every stored frame (``shared_frames.py``), so a
frame written with another layout is refused even inside this namespace.

``weights_identity`` hashes the model id, every shape field, the weight format and a
strided sample of the embedding rows and the final norm: two random-weight models of one
shape with different seeds, or two quantizations of one checkpoint, differ there.

The key: ``shared_key=env:NAME`` names the environment variable that holds a passphrase
(at least ``MIN_PASSPHRASE_CHARS``) that every sharing process is given; the spec holds
only the variable's name, so records and logs never see the key.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import astuple
from typing import Iterable

import torch

NAMESPACE_ROOT = "kvmap:shared:"
FINGERPRINT_BYTES = 32
MIN_PASSPHRASE_CHARS = 16
_SAMPLED_ROWS = 1024        # embedding rows hashed: enough to tell weights apart, ~1 MB


def weights_identity(model_id: str, model_config, quantization: str | None,
                     tensors: Iterable[torch.Tensor]) -> str:
    """A hex digest naming these weights: id, shape, weight format and a strided row
    sample of each tensor (their bytes as stored, any dtype)."""
    h = hashlib.sha256()
    h.update(f"{model_id}\x00{astuple(model_config)!r}\x00{quantization}".encode())
    for t in tensors:
        t = t.detach()
        rows = t if t.dim() == 0 else t[::max(1, t.shape[0] // _SAMPLED_ROWS)]
        flat = rows.contiguous().reshape(-1).view(torch.uint8).cpu()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(flat.numpy().tobytes())
    return h.hexdigest()


def layout_fingerprint(identity: str, geom, pool_codec, level_codec,
                       compute_dtype: torch.dtype) -> bytes:
    """The 32-byte fingerprint of everything that decides a shared frame's bytes."""
    text = "\x00".join(["kvmap-shared-pool/1", identity, repr(astuple(geom)),
                        repr(pool_codec), repr(level_codec), str(compute_dtype)])
    return hashlib.sha256(text.encode()).digest()


def namespace_prefix(fingerprint: bytes) -> str:
    """The Redis key prefix of a fingerprint's shared namespace."""
    if len(fingerprint) != FINGERPRINT_BYTES:
        raise ValueError(f"a layout fingerprint is {FINGERPRINT_BYTES} bytes, "
                         f"got {len(fingerprint)}")
    return f"{NAMESPACE_ROOT}{fingerprint[:16].hex()}:"


def shared_auth_key(shared_key: str) -> bytes:
    """The 32-byte frame-authentication key from ``env:NAME``. ValueError naming the
    variable (never its value) when it is unset or too short."""
    name = _env_name(shared_key)
    value = os.environ.get(name, "")
    if len(value) < MIN_PASSPHRASE_CHARS:
        state = "is not set" if not value else \
            f"holds fewer than {MIN_PASSPHRASE_CHARS} characters"
        raise ValueError(f"tiers: shared_key=env:{name}: environment variable {name!r} "
                         f"{state}; give every sharing process the same passphrase there")
    return hashlib.blake2b(value.encode(), digest_size=32,
                           person=b"kvmap-shared").digest()


def check_shared_options(options: dict) -> None:
    """Spec-parse check of ``shared=`` and ``shared_key=`` with ``redis=`` given.
    ValueError naming the bad option; the key's value is never quoted."""
    shared, key = options.get("shared"), options.get("shared_key")
    if shared not in (None, True, False):
        raise ValueError(f"tiers: shared={shared} must be true or false")
    if not shared:
        if key is not None:
            raise ValueError("tiers: shared_key= is given without shared=true")
        return
    if key is None:
        raise ValueError("tiers: shared=true needs shared_key=env:NAME, the environment "
                         "variable holding the key every sharing process is given")
    _env_name(key)


def _env_name(shared_key) -> str:
    if not isinstance(shared_key, str) or not shared_key.startswith("env:") \
            or not shared_key[4:]:
        raise ValueError("tiers: shared_key must be env:NAME (the key's environment "
                         "variable); a key written into the spec would be stored with "
                         "every record")
    return shared_key[4:]
