"""How long one engine step takes: a roofline over FLOPs and bytes, per resource.

A step computes ``num_tokens`` new tokens (prefill chunks and one token per decoding
sequence) of a batch. Its load is counted in pure numbers (:class:`StepLoad`), then timed
on a :class:`~kvmap.plan.sim.hardware.Hardware`. The step's kernels run one after
another, so each class of kernels is its own roofline and the classes add up::

    matmul_flops = num_tokens x 2 x (weights a token multiplies)       dense layers
                 + num_sampled x 2 x hidden x vocab                     LM head
    attn_flops   = attention_pairs x 4 x layers x heads x head_dim      QK^T and PV
    weight_bytes = weight_bytes / num_devices                           read once a step
    kv_bytes     = (kv_read_tokens + kv_write_tokens) x KV bytes/token/device (exact codec)
    rate         = num_devices x peak x compute_efficiency
    matmul_s     = max(matmul_flops / (rate x curve(num_tokens)), weight_bytes / bandwidth)
    attention_s  = max(attn_flops / rate, kv_bytes / bandwidth, codec_s)
    codec_s      = the KV configuration's own operators (:mod:`kvmap.plan.sim.kvcost`:
                   the codec's read and write, a policy's scoring; 0 for bytes only)
    comm_s       = num_tokens x 2 all-reduces/layer x hidden x 2 B x 2(n-1)/n / link  (TP)
    link_s[l]    = bytes streamed over tier link l this step / its bandwidth (offloaded KV)
    overhead     = step_overhead + layers x layer_overhead
                   + num_seqs x (seq_overhead + layers x seq_layer_overhead)
                   + layers x (codec step_s [if it decodes] + num_decode x codec seq_s)
    step_s       = overhead + comm_s + max(matmul_s + attention_s, link_s...)  streams overlap
                 = overhead + comm_s + matmul_s + attention_s + sum(link_s)    they do not

(``bandwidth`` is the HBM's times ``bandwidth_efficiency``.) Each class's time is charged
to the resource that bounds it, ``compute``, ``hbm`` or ``kv_codec`` (attention bound by
the codec's operators rather than by its FLOPs or bytes), so ``compute_s + hbm_s +
kv_codec_s`` is ``matmul_s + attention_s``: a decode step's matrix products are bound by reading the
weights, its attention by reading the KV; a long prefill is compute-bound throughout.

``attention_pairs`` counts (query token, key token) pairs: a decode over a context of c
resident tokens is c pairs (plus itself); a causal prefill of tokens [s, e) is
``sum_{t=s}^{e-1} (t + 1)`` pairs, as :func:`kvmap.kv.offload.cost.prefill_flops` counts them.

The resource with the largest time is the step's bottleneck; every step's times are kept
so the results can say where the time went and when the bottleneck moved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvmap.kv.config import KVConfig
from kvmap.kv.spec import KVGeometry
from kvmap.plan import capacity
from kvmap.plan.catalogue import PlanModel
from kvmap.plan.sim.hardware import Hardware
from kvmap.plan.sim.kvcost import KVCosts
from kvmap.perf.calibration import Calibration
from kvmap.perf.rates import Rates
from kvmap.perf.roofline import step_time
from kvmap.perf.shape import DENSE_BYTES, StepShape
from kvmap.perf.weights import weight_bytes

ACTIVATION_BYTES = 2        # bf16 activations in the tensor-parallel all-reduce


@dataclass(frozen=True)
class ModelCost:
    """Per-model constants of the roofline (one KV configuration, one device count)."""

    name: str
    num_layers: int
    dense_flops_per_token: float       # 2 x weights one token multiplies (LM head apart)
    lm_head_flops: float               # 2 x hidden x vocab, per sampled token
    attention_flops_per_pair: float    # 4 x layers x heads x head_dim
    weight_bytes: int                  # all devices
    weight_bytes_per_device: int
    kv_block_bytes_per_device: int     # one pool block on one device, exact codec bytes
    kv_block_bytes: int                # the block on all devices (what a tier stores)
    block_size: int
    allreduce_bytes_per_token: float   # per device, all layers (0 without TP)
    kv_costs: KVCosts | None = None    # the KV configuration's own operators, per layer
    # linear-attention layers' fixed state of one sequence on one device (not paged)
    state_bytes_per_seq_per_device: int = 0
    perf: PerfStep | None = None       # calibrated hardware: the step by ``kvmap.perf``

    @property
    def kv_bytes_per_token_per_device(self) -> float:
        return self.kv_block_bytes_per_device / self.block_size

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_block_bytes / self.block_size


@dataclass(frozen=True)
class PerfStep:
    """What ``kvmap.perf`` needs to time a step of one model on calibrated hardware."""

    shape: StepShape
    rates: Rates
    codec: str
    calibration: Calibration


def perf_step(model: PlanModel, kv: KVConfig, hw: Hardware, weights: str) -> PerfStep | None:
    """The perf model of ``model`` on ``hw`` when ``hw`` carries a calibration, else None.
    ``weights`` in the compute dtype is the dense engine; int8 / w8a8 / int4 its formats
    (ValueError from ``StepShape.of`` for a format the engine does not run)."""
    cal = hw.calibration
    if cal is None:
        return None
    dtype = hw.compute_dtype
    quantization = None if weights in DENSE_BYTES else weights
    return PerfStep(shape=StepShape.of(model.config, dtype, quantization),
                    rates=Rates.of(hw.profile_rates, dtype, quantization, cal),
                    codec=str(getattr(kv.codec, "name", "other")), calibration=cal)


def model_cost(model: PlanModel, kv: KVConfig, hw: Hardware, block_size: int = 16,
               weights: str = "bf16", kv_costs: KVCosts | None = None) -> ModelCost:
    """The constants of ``model`` with KV configuration ``kv`` on ``hw`` (``kv_costs``:
    what its codec and policy cost beyond their bytes; None: nothing)."""
    c = model.config
    n = hw.num_devices
    heads_per_device = capacity.kv_heads_per_gpu(c.num_kv_heads, c.num_heads, n)
    geom_device = KVGeometry(c.num_layers, heads_per_device, c.head_dim, block_size)
    kv.codec.validate_geometry(geom_device)
    block_device = kv.codec.block_bytes(geom_device, capacity.COMPUTE_DTYPE)
    attention_weights = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp_weights = 3 * c.hidden_size * c.intermediate_size * model.num_experts_per_tok
    router = c.hidden_size * model.num_experts if model.num_experts > 1 else 0
    all_weight_bytes = weight_bytes(model, weights)
    return ModelCost(
        name=c.name, num_layers=c.num_layers,
        dense_flops_per_token=2.0 * c.num_layers * (attention_weights + mlp_weights + router),
        lm_head_flops=2.0 * c.hidden_size * c.vocab_size,
        attention_flops_per_pair=4.0 * c.num_layers * c.num_heads * c.head_dim,
        weight_bytes=all_weight_bytes, weight_bytes_per_device=math.ceil(all_weight_bytes / n),
        kv_block_bytes_per_device=block_device,
        kv_block_bytes=block_device * n if heads_per_device * n == c.num_kv_heads
        else kv.codec.block_bytes(KVGeometry.of(c, block_size), capacity.COMPUTE_DTYPE),
        block_size=block_size,
        allreduce_bytes_per_token=(0.0 if n == 1 else 2 * c.num_layers * c.hidden_size
                                   * ACTIVATION_BYTES * 2 * (n - 1) / n),
        kv_costs=kv_costs if kv_costs is not None and kv_costs.charges else None,
        state_bytes_per_seq_per_device=math.ceil(
            model.layout.state_bytes_per_seq() / n) if model.layout is not None else 0,
        perf=perf_step(model, kv, hw, weights))


def causal_pairs(start_token: int, end_token: int) -> int:
    """(query, key) pairs of computing tokens ``[start, end)`` with full causal attention."""
    return (end_token * (end_token + 1) - start_token * (start_token + 1)) // 2


@dataclass(frozen=True)
class StepLoad:
    """What one step computes and moves (counts, no times)."""

    num_tokens: int                # new tokens computed (prefill chunks + decodes)
    num_sampled: int               # tokens that go through the LM head
    attention_pairs: int           # (query, key) pairs of attention
    kv_read_tokens: int            # KV tokens read from HBM (resident there)
    kv_write_tokens: int           # KV tokens written to HBM
    link_bytes: dict = field(default_factory=dict)   # tier link -> KV bytes streamed
    num_seqs: int = 1              # sequences in the batch
    num_decode: int = 0            # of which decoding (one token each)
    decode_read_tokens: int = 0    # of kv_read_tokens, those decode rows attend
    stats_tokens: int = 0          # cached tokens a policy's attention statistics cover
    compress_tokens: float = 0.0   # tokens of sequences a policy compresses (amortized)


class KVWork:
    """What one step asks of the KV configuration's own operators, item by item: decode
    rows and the tokens they attend, the tokens a policy's attention statistics cover
    (decode rows, when it asks for them), and the tokens it compresses -- every
    ``decode_every_steps`` decodes (amortized over them), and a prompt once, by the
    chunk that completes it. The counts are :class:`~kvmap.plan.sim.costmodel.StepLoad`
    fields."""

    def __init__(self, policy, block_size: int):
        self.policy = policy
        self.every = policy.decode_every_steps(block_size) if policy is not None else 0
        self.stats = policy is not None and (policy.needs_window_attention
                                             or policy.needs_accumulated_attention)
        self.num_decode = self.decode_read_tokens = self.stats_tokens = 0
        self.compress_tokens = 0.0

    def add(self, decoding: bool, completes_prompt: bool, num_tokens: int) -> None:
        """One batch item over ``num_tokens`` cached tokens (its new ones included)."""
        if decoding:
            self.num_decode += 1
            self.decode_read_tokens += num_tokens
            self.stats_tokens += num_tokens if self.stats else 0
            self.compress_tokens += num_tokens / self.every if self.every else 0.0
        elif self.policy is not None and completes_prompt:
            self.compress_tokens += num_tokens

    def counts(self) -> dict:
        return {"num_decode": self.num_decode, "decode_read_tokens": self.decode_read_tokens,
                "stats_tokens": self.stats_tokens, "compress_tokens": self.compress_tokens}


@dataclass(frozen=True)
class StepCost:
    """Seconds each resource needs for one step, the step's total and its bottleneck."""

    compute_s: float              # kernel classes bound by compute
    hbm_s: float                  # kernel classes bound by HBM bandwidth
    interconnect_s: float
    overhead_s: float
    link_s: dict                   # tier link -> seconds streaming offloaded KV
    total_s: float
    bound: str                     # the resource with the largest time
    flops: float
    hbm_bytes_per_device: float
    kv_codec_s: float = 0.0        # attention bound by the KV configuration's operators

    def resource_s(self) -> dict[str, float]:
        return {"compute": self.compute_s, "hbm": self.hbm_s, "kv_codec": self.kv_codec_s,
                "interconnect": self.interconnect_s, "overhead": self.overhead_s,
                **self.link_s}


def codec_seconds(mc: ModelCost, load: StepLoad) -> tuple[float, float]:
    """(seconds of the KV configuration's operators in the attention, seconds of its
    fixed costs added to the overhead) for ``load`` (0, 0 without ``kv_costs``)."""
    c = mc.kv_costs
    if c is None:
        return 0.0, 0.0
    prefill_read = load.kv_read_tokens - load.decode_read_tokens
    per_token = (c.read_s * load.decode_read_tokens + c.prefill_read_s * prefill_read
                 + c.write_s * load.kv_write_tokens + c.stats_s * load.stats_tokens
                 + c.compress_s * load.compress_tokens)
    prefill_pairs = max(0, load.attention_pairs - load.decode_read_tokens)
    fixed = (c.step_s if load.num_decode else 0.0) + c.seq_s * load.num_decode \
        + c.activation_s * load.num_tokens + c.pair_s * prefill_pairs
    return mc.num_layers * per_token, mc.num_layers * fixed


def kernel_times(mc: ModelCost, hw: Hardware, load: StepLoad, matmul_flops: float,
                 attn_flops: float, kv_bytes: float, codec_s: float) -> dict[str, float]:
    """Seconds of the step's kernels by bounding resource (and ``overhead``): on
    calibrated hardware ``kvmap.perf.roofline.step_time`` (its compute, its weight stream
    as ``hbm``, its dispatch), else each class of kernels charged to the resource with
    the larger time (the module docstring)."""
    if mc.perf is not None:
        p = mc.perf
        decode_pairs = min(load.decode_read_tokens, load.attention_pairs)
        t = step_time(p.shape, p.rates, p.codec, p.calibration,
                      prefill_tokens=load.num_tokens - load.num_decode,
                      prefill_pairs=load.attention_pairs - decode_pairs,
                      decode_tokens=load.num_decode, decode_pairs=decode_pairs)
        return {"compute": t.compute_s, "hbm": t.stream_s, "kv_codec": codec_s,
                "overhead": t.overhead_s}
    bandwidth = hw.effective_bandwidth
    times_s = {"compute": 0.0, "hbm": 0.0, "kv_codec": 0.0, "overhead": 0.0}
    for candidates in (
            {"compute": matmul_flops / (hw.effective_flops
                                        * hw.curve_efficiency(load.num_tokens)),
             "hbm": mc.weight_bytes_per_device / bandwidth},
            {"compute": attn_flops / hw.effective_flops, "hbm": kv_bytes / bandwidth,
             "kv_codec": codec_s}):
        bound = max(candidates, key=candidates.get)
        times_s[bound] += candidates[bound]
    return times_s


def step_cost(mc: ModelCost, hw: Hardware, load: StepLoad, link_bandwidth: dict | None = None,
              overlap_links: bool = True) -> StepCost:
    """Time ``load`` on ``hw`` (see the module docstring). ``link_bandwidth`` maps each link
    in ``load.link_bytes`` to bytes/s; ``overlap_links`` says whether streaming offloaded KV
    overlaps the step's compute (layer-ahead prefetch) or adds to it."""
    matmul_flops = (load.num_tokens * mc.dense_flops_per_token
                    + load.num_sampled * mc.lm_head_flops)
    attn_flops = load.attention_pairs * mc.attention_flops_per_pair
    kv_bytes = (load.kv_read_tokens + load.kv_write_tokens) * mc.kv_bytes_per_token_per_device
    codec_s, codec_fixed_s = codec_seconds(mc, load)
    times_s = kernel_times(mc, hw, load, matmul_flops, attn_flops, kv_bytes, codec_s)
    compute_s, hbm_s, kv_codec_s = times_s["compute"], times_s["hbm"], times_s["kv_codec"]
    flops, hbm_bytes = matmul_flops + attn_flops, mc.weight_bytes_per_device + kv_bytes
    comm_s = (load.num_tokens * mc.allreduce_bytes_per_token / hw.interconnect_bandwidth
              if mc.allreduce_bytes_per_token else 0.0)
    overhead_s = times_s["overhead"] + codec_fixed_s + (
        hw.step_overhead_s + mc.num_layers * hw.layer_overhead_s
        + load.num_seqs * (hw.seq_overhead_s + mc.num_layers * hw.seq_layer_overhead_s))
    link_s = {link: num_bytes / (link_bandwidth or {})[link]
              for link, num_bytes in load.link_bytes.items() if num_bytes}
    core_s = compute_s + hbm_s + kv_codec_s
    if overlap_links:
        body_s = max(core_s, *link_s.values()) if link_s else core_s
    else:
        body_s = core_s + sum(link_s.values())
    times = {"compute": compute_s, "hbm": hbm_s, "kv_codec": kv_codec_s,
             "interconnect": comm_s, "overhead": overhead_s, **link_s}
    return StepCost(compute_s=compute_s, hbm_s=hbm_s, interconnect_s=comm_s,
                    overhead_s=overhead_s, link_s=link_s,
                    total_s=overhead_s + comm_s + body_s,
                    bound=max(times, key=times.get), flops=flops,
                    hbm_bytes_per_device=hbm_bytes, kv_codec_s=kv_codec_s)
