"""Short probes of what this machine can do: matrix products per dtype, read bandwidth,
and each weight format's kernel, at a model's own shapes.

Two shapes stand for a forward pass (default: SmolLM2-135M's MLP up projection, in 576,
out 1536): a prefill chunk of ``prefill_rows`` rows (a GEMM, compute-bound) and a decode
row (a GEMV, bound by reading the weights). The decode probe cycles through copies of the
weight, ``stream_bytes`` in all, so that the weights come from memory and not from the
caches, as in a decode step that reads every layer's matrices once.

Each weight format's kernel (``torch._weight_int8pack_mm`` for int8 W8A16,
``torch._int_mm`` for w8a8, ``_weight_int4pack_mm_for_cpu`` for int4) is timed with fp32
and with bf16 activations: which is faster depends on the CPU and on the shape (on a Zen 1
the int8 kernel ran a decode row 6x faster with bf16 activations, and a prefill chunk 12x
slower), so the model picks the activation dtype per phase from these rates.

The compute curve (``matmul_curve``) times the same product at ``CURVE_ROWS`` rows,
streaming its weights as the decode probe does (up to ``CURVE_FLOPS`` a call, so that the
many-row points, compute-bound anyway, stay short): the rate a step of that many tokens
gets from its matrix products, weights read included. On a CPU core a product of a few
rows neither overlaps its weight stream with its arithmetic nor reaches the peak, so
the simulator reads this measured curve, not a max of two bounds.

``probe_version`` says which probes a profile holds; a cached profile of an older
version is measured again.

All rates are FLOP/s (2 x rows x in x out per product) except the bandwidths (bytes/s);
each is the median of a few repeats after a warm-up, with ``torch.set_num_threads`` as the
profile's thread count. The whole measurement takes a few seconds.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch

PROBE_VERSION = 2                    # 2: matmul_curve
CURVE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CURVE_FLOPS = 2e9                    # a curve point streams at most this much work a call
DEFAULT_SHAPE = (576, 1536)          # (in, out): SmolLM2-135M's up projection
PREFILL_ROWS = 512
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _median_s(fn: Callable[[], object], repeats: int,
              sync: Callable[[], object] = lambda: None) -> float:
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dense_product(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> x @ w.T`` as the engine runs it on the CPU: the weight reordered once into
    oneDNN's blocked layout where oneDNN takes the dtype (``kvmap.model.linear``), else
    ``F.linear``."""
    if w.device.type == "cpu" and torch.backends.mkldnn.is_available() \
            and w.dtype in (torch.float32, torch.bfloat16):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
            return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none",
                                                                [], "")
        except (RuntimeError, AttributeError):
            pass
    return lambda x: torch.nn.functional.linear(x, w)


def gemm_flops(dtype: torch.dtype, rows: int, k: int, n: int, repeats: int = 3,
               device: str | torch.device = "cpu") -> float:
    """FLOP/s of ``x (rows, k) @ W.T`` (:func:`dense_product`) for one (n, k) weight held
    in the caches, on ``device`` (a GPU's timing synchronized)."""
    x = torch.randn(rows, k, device=device).to(dtype)
    product = dense_product(torch.randn(n, k, device=device).to(dtype))
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    return 2 * rows * k * n / max(_median_s(lambda: product(x), repeats, sync), 1e-9)


def _streamed(make: Callable[[], Callable[[torch.Tensor], object]], x: torch.Tensor,
              bytes_each: int, stream_bytes: int, kernels: list | None = None
              ) -> Callable[[], float]:
    """A timing of one product over ``stream_bytes`` / ``bytes_each`` weights in turn
    (the first of ``kernels`` when given, else made): each call returns seconds per
    product."""
    count = max(1, stream_bytes // max(1, bytes_each))
    kernels = kernels[:count] if kernels is not None else [make() for _ in range(count)]

    def run() -> float:
        t0 = time.perf_counter()
        for kernel in kernels:
            kernel(x)
        return (time.perf_counter() - t0) / len(kernels)
    return run


def _cached(product: Callable[[torch.Tensor], object], x: torch.Tensor
            ) -> Callable[[], float]:
    """A timing of ``product(x)`` with its weight in the caches: seconds per call."""
    def run() -> float:
        t0 = time.perf_counter()
        product(x)
        return time.perf_counter() - t0
    return run


def _dense(dtype: torch.dtype, k: int, n: int):
    return lambda: dense_product(torch.randn(n, k, dtype=dtype))


def _int8(act: torch.dtype, k: int, n: int):
    def make():
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        scale = torch.rand(n, dtype=act) / 64
        return lambda x: torch._weight_int8pack_mm(x, q, scale)
    return make


def _w8a8(act: torch.dtype, k: int, n: int):
    def make():
        q_t = torch.randint(-127, 128, (n, k), dtype=torch.int8).t()
        def run(x):
            scale = x.abs().amax(-1, keepdim=True).float() / 127
            xq = (x.float() / scale).round().to(torch.int8)
            return (torch._int_mm(xq, q_t).float() * scale).to(act)
        return run
    return make


def _int4(act: torch.dtype, k: int, n: int, group_size: int = 32):
    def make():
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = torch.stack([torch.rand(k // group_size, n), torch.zeros(k // group_size, n)],
                         -1).to(act).contiguous()
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group_size, sz)
    return make


WEIGHT_KERNELS = {"int8": (_int8, 1.0), "w8a8": (_w8a8, 1.0), "int4": (_int4, 0.5)}


def measure_rates(hw, device: str = "cpu", shape: tuple[int, int] = DEFAULT_SHAPE,
                  prefill_rows: int = PREFILL_ROWS, stream_bytes: int = 48 * 2**20,
                  repeats: int = 3) -> dict:
    """The profile's ``rates`` (see the module docstring); ``hw`` is the
    :class:`~kvmap.hardware.profile.HardwareProfile` whose thread count is used.

    Every probe is timed once per round, ``repeats`` rounds, and each keeps its median:
    a burst of the machine's other load then falls on one round of every probe, not on
    every round of one, so the comparisons the engine makes from these rates (fp32 or
    bf16 activations for a kernel) hold even when the absolute rates drift."""
    if str(device) != "cpu":
        raise ValueError(f"device={device!r}: the probes measure the CPU; a GPU's rates "
                         "come from benchmarks/gpu_check.py")
    t_start = time.perf_counter()
    previous = torch.get_num_threads()
    torch.set_num_threads(hw.cpu.num_threads)
    k, n = shape
    dtypes = ["fp32", "bf16"]
    if hw.native_bf16 and "avx512_fp16" in hw.cpu.flags or "fphp" in hw.cpu.flags:
        dtypes.append("fp16")
    probes: dict[tuple[str, str, str], Callable[[], float]] = {}
    errors: dict[tuple[str, str], str] = {}
    try:
        for name in dtypes:
            dt = DTYPES[name]
            probes["dense", name, "prefill"] = _cached(
                dense_product(torch.randn(n, k, dtype=dt)), torch.randn(prefill_rows, k, dtype=dt))
            bytes_each = n * k * dt.itemsize
            weights = [_dense(dt, k, n)() for _ in range(max(1, stream_bytes // bytes_each))]
            probes["dense", name, "decode"] = _streamed(
                None, torch.randn(1, k, dtype=dt), bytes_each, stream_bytes, weights)
            for m in CURVE_ROWS:        # the same weights; at most CURVE_FLOPS a call
                budget = max(bytes_each, int(CURVE_FLOPS / (2 * m * k * n)) * bytes_each)
                probes["curve", name, str(m)] = _streamed(
                    None, torch.randn(m, k, dtype=dt), bytes_each, min(stream_bytes, budget),
                    weights)
        for fmt, (maker, bytes_per_weight) in WEIGHT_KERNELS.items():
            for act in ("fp32", "bf16"):
                dt = DTYPES[act]
                try:
                    make = maker(dt, k, n)
                    probes[fmt, act, "prefill"] = _cached(make(),
                                                          torch.randn(prefill_rows, k, dtype=dt))
                    probes[fmt, act, "decode"] = _streamed(
                        make, torch.randn(1, k, dtype=dt), int(n * k * bytes_per_weight),
                        stream_bytes)
                    probes[fmt, act, "prefill"]()       # a kernel missing on this build
                except (RuntimeError, AttributeError) as e:
                    errors[fmt, act] = f"{type(e).__name__}: {e}"[:200]
                    probes.pop((fmt, act, "prefill"), None)
                    probes.pop((fmt, act, "decode"), None)
        times: dict = {key: [] for key in probes}
        for probe in probes.values():                   # warm-up: reorders, caches
            probe()
        for _ in range(repeats):
            for key, probe in probes.items():
                times[key].append(probe())
        read = read_bandwidth()
    finally:
        torch.set_num_threads(previous)
    rows = {"prefill": prefill_rows, "decode": 1, **{str(m): m for m in CURVE_ROWS}}
    rates: dict = {}
    for (family, name, phase), ts in times.items():
        rates.setdefault(family, {}).setdefault(name, {})[phase] = \
            2 * rows[phase] * k * n / statistics.median(ts)
    kernels = {fmt: {**rates.get(fmt, {}), **{act: {"error": e} for (f, act), e
                                               in errors.items() if f == fmt}}
               for fmt in WEIGHT_KERNELS}
    return {"num_threads": hw.cpu.num_threads, "shape_in_out": [k, n],
            "prefill_rows": prefill_rows, "matmul_flops": rates["dense"],
            "probe_version": PROBE_VERSION, "matmul_curve": rates["curve"],
            "weight_kernels": kernels, "read_bandwidth_bytes_per_s": read,
            "measured_s": round(time.perf_counter() - t_start, 2),
            "load_avg_1m": os.getloadavg()[0],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def read_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes read per second by a sum over ``num_bytes`` of int64 (a stream of reads with
    no writes, as a decode step's matrix products read their weights); the median of
    ``repeats`` after a warm-up."""
    x = torch.ones(num_bytes // 8, dtype=torch.int64)
    return num_bytes / _median_s(x.sum, repeats)


def copy_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes read + written per second by ``dst.copy_(src)`` of ``num_bytes`` (the
    convention of ``/work/shared/CALIBRATION.md``); the median of ``repeats``."""
    src = torch.ones(num_bytes // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * num_bytes / _median_s(lambda: dst.copy_(src), repeats)


def bf16_activation_speedup(rates: dict | None, fmt: str) -> float | None:
    """How much faster ``fmt``'s kernel ran with bf16 activations than with fp32 ones in
    ``rates``: the geometric mean of the prefill and decode ratios (one noisy phase
    cannot flip a choice the other phase makes by a wide margin); None without both."""
    per_act = ((rates or {}).get("weight_kernels") or {}).get(fmt) or {}
    fp32, bf16 = per_act.get("fp32") or {}, per_act.get("bf16") or {}
    phases = ("prefill", "decode")
    if not all(fp32.get(p) and bf16.get(p) for p in phases):
        return None
    return ((bf16["prefill"] / fp32["prefill"]) * (bf16["decode"] / fp32["decode"])) ** 0.5
