"""A hardware profile's summary as text (``kvmap hw``, report headers)."""
from __future__ import annotations


def _g(rate: float | None) -> str:
    return "-" if not rate else f"{rate / 1e9:.1f}"


def headline(summary: dict) -> str:
    """One line: class, CPU, bf16 verdict, dtype auto picks, threads."""
    bf16 = "native bf16" if summary.get("native_bf16") else "no native bf16"
    forced = " (forced)" if summary.get("native_bf16_forced") else ""
    return (f"{summary.get('machine_class')}: {summary.get('cpu_model')}, {bf16}{forced}, "
            f"dtype auto = {summary.get('auto_dtype_cpu')}, "
            f"{summary.get('num_threads')} threads of {summary.get('num_cores')} cores")


def describe(summary: dict) -> str:
    """Several lines: the headline, the ISA, and the measured rates when present."""
    lines = [headline(summary),
             f"  ISA: {' '.join(summary.get('isa', []))}; torch capability "
             f"{summary.get('torch_capability')}"
             + (f"; oneDNN capped at {summary['onednn_max_isa']}"
                if summary.get("onednn_max_isa") else ""),
             f"  torch {summary.get('torch')}, fingerprint {summary.get('fingerprint')}"]
    for gpu in summary.get("cuda") or []:
        lines.append(f"  CUDA: {gpu['name']}, compute capability "
                     f"{'.'.join(map(str, gpu['capability']))}, "
                     f"{gpu['memory_bytes'] / 2**30:.0f} GiB")
    rates = summary.get("rates")
    if not rates:
        return "\n".join(lines)
    k, n = rates.get("shape_in_out", ("?", "?"))
    lines.append(f"  measured {rates.get('measured_at')} in {rates.get('measured_s')} s at "
                 f"load {rates.get('load_avg_1m', 0):.1f}, {rates.get('num_threads')} "
                 f"threads; shape in {k} x out {n}, prefill {rates.get('prefill_rows')} rows")
    lines.append(f"  read bandwidth: {_g(rates.get('read_bandwidth_bytes_per_s'))} GB/s")
    lines.append("  GFLOP/s           prefill   decode")
    for dtype, r in rates.get("matmul_flops", {}).items():
        lines.append(f"  dense {dtype:<10} {_g(r.get('prefill')):>8} {_g(r.get('decode')):>8}")
    for fmt, per_act in rates.get("weight_kernels", {}).items():
        for act, r in per_act.items():
            if "error" in r:
                lines.append(f"  {fmt} x {act:<7}   unavailable: {r['error']}")
            else:
                lines.append(f"  {fmt + ' x ' + act:<16} {_g(r.get('prefill')):>8} "
                             f"{_g(r.get('decode')):>8}")
    return "\n".join(lines)
