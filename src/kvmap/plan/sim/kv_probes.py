"""Probes of what a KV configuration costs on this machine, with the engine's own code at
a model's geometry: the codec's write and read and the policy's scoring
(:class:`~kvmap.plan.sim.kvcost.KVCosts` holds the results).

One layer of the engine's attention (``kvmap.model.attention.paged_attention``) over a
store the codec allocated (``kvmap.kv.codecs``), with ``B`` decode rows of ``L`` cached
tokens each, is timed at nine (B, L) points and fitted (least squares) as::

    t(B, L) = step_s + B x seq_s + B x L x read_s        (per layer, per decode step)

so ``read_s`` is what attending one cached token costs (the codec's gather and decode,
both products, the softmax), ``seq_s`` each decoding row's own cost (writing its new
K/V, its mask and output rows), ``step_s`` the fixed operators of the codec's path.
``prefill_read_s`` is ``codec.read`` of a prefill chunk's context per token (a chunk
reads its whole context back through the codec, dequantized), ``write_s`` writing one
token of a prefill chunk. A selection policy adds ``stats_s`` per cached token in a
decode step where it asks for attention statistics, and ``compress_s`` per token of a
sequence it compresses (the sequence read back, scored, the kept tokens selected).

A tier's transfer per block (:func:`measure_tier_block`): one pool block of every layer
serialized (``kvmap.kv.tiers.serde``) and put into the tier, then got back and decoded,
as the engine's tiered store moves blocks.

Every probe is timed once per round (a sample repeats it for a few milliseconds), rounds
interleaved, and keeps its fastest round: these are microsecond operators, and on a
shared machine a round the scheduler preempted says nothing of the operator (the
speed of the machine under its load is :func:`kvmap.plan.sim.calibrate.scaled`'s job). The costs are per layer: the
simulator multiplies by the model's layer count.
"""
from __future__ import annotations

import math
import time

import torch

from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry

DECODE_POINTS = tuple((b, n) for b in (1, 4, 16) for n in (64, 256, 512))
PREFILL_TOKENS = (64, 1024)
BLOCK_SIZE = 16


SAMPLE_S = 0.002        # each sample repeats a probe for at least this long


def _time(fn, calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _fit_decode(times: dict[tuple[int, int], float]) -> tuple[float, float, float]:
    """Least squares of ``t = a + b B + c B L`` over the probe points, in relative terms
    (each point weighted by 1 / t, so the small points that fix ``a`` count as much as
    the large ones that fix ``c``) -> (a, b, c), each clipped at 0 (a negative fixed cost
    is noise, not a refund)."""
    t = torch.tensor(list(times.values()), dtype=torch.float64)[:, None]
    rows = torch.tensor([[1.0, b, b * l] for b, l in times], dtype=torch.float64) / t
    a, b, c = torch.linalg.lstsq(rows, torch.ones_like(t)).solution[:, 0].tolist()
    return max(0.0, a), max(0.0, b), max(0.0, c)


class _LayerBench:
    """One layer's store and the tensors of each probe (built once, timed many times)."""

    def __init__(self, spec: str, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, seed: int = 0):
        from kvmap.model.attention import AttentionMetadata, paged_attention
        self.kv = KVConfig.parse(spec)
        self.codec, self.policy = self.kv.codec, self.kv.policy
        self.heads, self.kv_heads, self.head_dim, self.dtype = (num_heads, num_kv_heads,
                                                                 head_dim, dtype)
        geom = KVGeometry(1, num_kv_heads, head_dim, BLOCK_SIZE)
        self.codec.validate_geometry(geom)
        max_b, max_l = max(b for b, _ in DECODE_POINTS), max(l for _, l in DECODE_POINTS)
        num_blocks = max_b * (max_l // BLOCK_SIZE + 1) + max(PREFILL_TOKENS) // BLOCK_SIZE + 2
        self.store = self.codec.allocate(num_blocks, geom, "cpu", dtype, layer_id=0)
        g = torch.Generator().manual_seed(seed)
        n = num_blocks * BLOCK_SIZE
        k = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        self.codec.write(self.store, torch.arange(n), k, v)       # every slot holds a token
        self.paged_attention, self.meta_type = paged_attention, AttentionMetadata
        self.g = g

    def decode(self, batch: int, num_tokens: int, want_scores: bool = False):
        """A closure timing one decode step of this layer: ``batch`` rows of
        ``num_tokens`` cached tokens (each row its own blocks), one new token each."""
        nb = num_tokens // BLOCK_SIZE + 1
        tables = [list(range(b * nb, (b + 1) * nb)) for b in range(batch)]
        slots = torch.tensor([t[0] * BLOCK_SIZE + num_tokens for t in tables])
        meta = self.meta_type.build(slots, tables, [num_tokens + 1] * batch, [], BLOCK_SIZE,
                                    "cpu", self.dtype)
        meta.want_scores = want_scores
        q = torch.randn(batch, self.heads, self.head_dim, generator=self.g).to(self.dtype)
        k = torch.randn(batch, self.kv_heads, self.head_dim, generator=self.g).to(self.dtype)
        v = torch.randn_like(k)

        def run() -> None:
            meta.decode_rows = None          # built once per step, as the engine does
            meta.scores.clear()
            self.paged_attention(q, k, v, self.store, self.codec, meta, self.kv_heads)
        return run

    def prefill_read(self, num_tokens: int):
        ids = torch.arange(num_tokens // BLOCK_SIZE)
        return lambda: self.codec.read(self.store, ids)

    def write(self, num_tokens: int):
        slots = torch.arange(num_tokens)
        k = torch.randn(num_tokens, self.kv_heads, self.head_dim, generator=self.g).to(self.dtype)
        v = torch.randn_like(k)
        return lambda: self.codec.write(self.store, slots, k, v)

    def select(self, num_tokens: int):
        """A closure running the policy's scoring and selection over one layer of one
        sequence of ``num_tokens`` cached tokens (as its compression does), after the
        codec's read of those tokens."""
        from kvmap.kv.policies.base import ScoreInputs
        ids = torch.arange(num_tokens // BLOCK_SIZE)
        p = self.policy
        window = torch.rand(self.kv_heads, p.observation_window, num_tokens, generator=self.g)
        acc = torch.rand(self.kv_heads, num_tokens, generator=self.g)

        def run() -> None:
            k, v = self.codec.read(self.store, ids)
            inputs = ScoreInputs(0, k.reshape(num_tokens, self.kv_heads, -1),
                                 v.reshape(num_tokens, self.kv_heads, -1),
                                 window if p.needs_window_attention else None,
                                 acc if p.needs_accumulated_attention else None,
                                 num_prompt_tokens=num_tokens, generator=self.g)
            p.select(inputs, max(1, p.budget_tokens(num_tokens)))
        return run


def measure_kv_costs(spec: str, num_heads: int, num_kv_heads: int, head_dim: int,
                     dtype: torch.dtype, num_threads: int, repeats: int = 9) -> dict:
    """Per-layer seconds of KV configuration ``spec`` at this geometry (see the module
    docstring): ``{"step_s", "seq_s", "read_s", "prefill_read_s", "write_s", "stats_s",
    "compress_s"}`` plus ``decode_points_s`` (the raw probe times)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        bench = _LayerBench(spec, num_heads, num_kv_heads, head_dim, dtype)
        probes = {("decode", b, n): bench.decode(b, n) for b, n in DECODE_POINTS}
        probes.update({("prefill_read", n): bench.prefill_read(n) for n in PREFILL_TOKENS})
        probes.update({("write", n): bench.write(n) for n in PREFILL_TOKENS})
        if bench.policy is not None:
            probes.update({("stats", b, n): bench.decode(b, n, want_scores=True)
                           for b, n in DECODE_POINTS})
            probes.update({("select", n): bench.select(n) for n in PREFILL_TOKENS})
        calls = {}
        for key, probe in probes.items():      # warm-up: allocations, oneDNN primitives
            probe()
            calls[key] = max(1, math.ceil(SAMPLE_S / max(_time(probe, 1), 1e-7)))
        samples: dict = {key: [] for key in probes}
        for _ in range(repeats):
            for key, probe in probes.items():
                samples[key].append(_time(probe, calls[key]))
    finally:
        torch.set_num_threads(previous)
    t = {key: min(s) for key, s in samples.items()}
    step_s, seq_s, read_s = _fit_decode({(b, n): t["decode", b, n] for b, n in DECODE_POINTS})
    lo, hi = PREFILL_TOKENS

    def slope(name: str) -> float:
        return max(0.0, (t[name, hi] - t[name, lo]) / (hi - lo))

    out = {"step_s": step_s, "seq_s": seq_s, "read_s": read_s,
           "prefill_read_s": slope("prefill_read"), "write_s": slope("write"),
           "stats_s": 0.0, "compress_s": 0.0,
           "decode_points_s": {f"{b}x{n}": t["decode", b, n] for b, n in DECODE_POINTS}}
    if bench.policy is not None:
        with_stats = _fit_decode({(b, n): t["stats", b, n] for b, n in DECODE_POINTS})
        out["stats_s"] = max(0.0, with_stats[2] - read_s)
        out["compress_s"] = slope("select")
    return out


def measure_tier_block(backend: str, spec: str, num_layers: int, num_kv_heads: int,
                       head_dim: int, dtype: torch.dtype, repeats: int = 5) -> dict:
    """Seconds to move one pool block (all ``num_layers`` layers) of codec ``spec`` down
    into tier ``backend`` (``write_s``: encode + put) and back (``read_s``: get +
    decode), and the block's bytes as stored (``block_bytes``)."""
    import tempfile

    from kvmap.kv.tiers.disk import DiskTier
    from kvmap.kv.tiers.host import HostTier
    from kvmap.kv.tiers.serde import decode_block, encode_block
    codec = KVConfig.parse(spec).codec
    store = codec.allocate(2, KVGeometry(1, num_kv_heads, head_dim, BLOCK_SIZE), "cpu", dtype,
                           layer_id=0)
    block = [store.block_to_bytes(0)] * num_layers
    with tempfile.TemporaryDirectory() as folder:
        tiers = {"host": lambda: HostTier(2**30),
                 "disk": lambda: DiskTier(2**30, directory=folder)}
        if backend not in tiers:
            raise ValueError(f"tier {backend!r}: the probe measures {', '.join(tiers)}")
        tier = tiers[backend]()
        data = encode_block(block)
        keys = (f"b{i}" for i in range(10**6))

        def write() -> None:
            tier.put(next(keys), encode_block(block))

        def read() -> None:
            decode_block(tier.get("b"))
        tier.put("b", data)
        samples = {"write_s": [], "read_s": []}
        for _ in range(repeats):
            samples["write_s"].append(_time(write, 4))
            samples["read_s"].append(_time(read, 4))
        tier.close()
    return {"block_bytes": len(data), **{k: min(v) for k, v in samples.items()}}
