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

The key: ``shared_key=env:NAME`` names the environment variable that holds the pool's
random key -- at least ``MIN_KEY_BYTES`` bytes as hex (``python -c "import secrets;
print(secrets.token_hex(32))"``) -- that every sharing process is given; the spec holds
only the variable's name, so records and logs never see the key. A passphrase is
refused: one hash of it would be the key, and every sealed frame in Redis (whose bytes
are largely predictable) would let whoever reads Redis test guesses offline. From the
key, three keys of their own are derived (keyed BLAKE2b, one ``person`` each): the
frames' tags, the index entries' tags, and the *names* of a block's Redis keys -- a
keyed hash of its prefix hash, so that a Redis reader without the key cannot tell which
prompts' blocks are stored, nor plant a value under the name a block will take.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import astuple, dataclass
from typing import Iterable

import torch

NAMESPACE_ROOT = "kvmap:shared:"
FINGERPRINT_BYTES = 32
MIN_KEY_BYTES = 32
KEY_HINT = "python -c \"import secrets; print(secrets.token_hex(32))\""
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


@dataclass(frozen=True)
class SharedKeys:
    """The keys derived from a pool's random key: ``frames`` tags sealed frames,
    ``index`` tags index entries, ``names`` names a block's Redis keys."""

    frames: bytes
    index: bytes
    names: bytes

    def name(self, key_bytes: bytes) -> bytes:
        """The Redis name of a content-addressed tier key (32 bytes, hex)."""
        return hashlib.blake2b(key_bytes, key=self.names, digest_size=32).hexdigest().encode()


def shared_keys(shared_key: str) -> SharedKeys:
    """The keys of ``env:NAME``'s random key. ValueError naming the variable (never its
    value) when it is unset, not hex, or shorter than ``MIN_KEY_BYTES``."""
    name = _env_name(shared_key)
    value = os.environ.get(name, "").strip()
    try:
        key = bytes.fromhex(value)
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        state = "is not set" if not value else (
            f"does not hold a random key of at least {MIN_KEY_BYTES} bytes in hex "
            f"({2 * MIN_KEY_BYTES}+ hex digits; a passphrase is refused)")
        raise ValueError(f"tiers: shared_key=env:{name}: environment variable {name!r} "
                         f"{state}; give every sharing process the same random key there, "
                         f"made with: {KEY_HINT}")

    key = key if len(key) <= 64 else hashlib.blake2b(key).digest()   # BLAKE2b's key limit

    def derive(person: bytes) -> bytes:
        return hashlib.blake2b(b"", key=key, digest_size=32, person=person).digest()
    return SharedKeys(derive(b"kvmap-frames"), derive(b"kvmap-index"), derive(b"kvmap-names"))


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
