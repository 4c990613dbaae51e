"""kvmap's engine against HF transformers ``generate`` and llama.cpp's server, side by
side in one run, on the same weights (the embedded SmolLM2-135M GGUF: dense for
transformers and our default row, its own Q4_1 for llama.cpp). Each side runs at the
dtype it runs best on this hardware: the profile's ``auto`` (``kvmap.hardware``: bf16
where the CPU multiplies bf16 natively, fp32 where it does not), for both kvmap and
transformers; the record carries the profile and the machine class.

Measures (median of --repeats runs each):
  prefill   tokens/s on a 2,000-token prompt (time to the first token)
  decode    tokens/s at batch 1 (128 new tokens after a short prompt): our default
            weights and each --formats weight quantization (``LLM(quantization=...)``),
            rounds alternating over the formats, each as a ratio to the default and its
            bandwidth bound (bytes read per step over the read bandwidth of this run:
            the faster of two probes right before and right after these rows; a
            copy's read + write rate swung 46-83 GB/s between two quiet runs)
  batch     output tokens/s for 32 requests of ~200 prompt and 200 output tokens
            (ours: continuous batching; transformers: one padded batched generate)
  kv        batch-1 decode and operators per decode step with each --kv-codecs cache
            against the dtype's own cache; the 2,000-token prefill and a decoding
            neighbour's worst inter-token gap at step budgets 512 and 2,048
            (``engine_rows.py``)
  llama.cpp prefill and batch-1 decode from ``llama-server``'s own timings
            (``llamacpp_peer.py`` states the definitions), when it is built
            (``scripts/llamacpp.sh``); else its rows say "not built"
and the machine's matrix-multiply rate in the run's dtype at the model's own shapes (the
hardware profile's prefill GEMM probe, measured in this run), to state prefill as a
fraction of it: FLOPs counted as the layers' matrix products plus causal attention's two
products, and the output head for the last token only.

    .venv/bin/python benchmarks/engine_vs_hf.py [--repeats 3] [--quick] [--threads 1]
        [--formats int8,w8a8,int4] [--kv-codecs int8,int4] [--decode-only]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import environment, median_time_s, write_record  # noqa: E402
from engine_rows import budget_rows, kv_codec_rows  # noqa: E402
from llamacpp_peer import LlamaServer, llama_server_binary  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.hardware import detect, measure  # noqa: E402
from kvmap.hardware.report import headline  # noqa: E402
from kvmap.model.loader import embedded_model_path  # noqa: E402
from kvmap.hardware.probes import copy_bandwidth, read_bandwidth  # noqa: E402
from kvmap.workloads.corpus import corpus_text  # noqa: E402

FORMATS = ("int8", "w8a8", "int4")
# issue 29's targets: ours / transformers at each side's best dtype; ours / our default
# for a weight format's decode; the best format / llama.cpp's Q4_1 at batch-1 decode;
# prefill as a fraction of the GEMM rate; batch-1 decode as a fraction of its read bound
TARGETS = {"prefill_tokens_per_s": 1.0, "decode_tokens_per_s_batch1": 2.0,
           "output_tokens_per_s_": 3.0}      # the N-request row, N in its name
FORMAT_TARGETS = {"int8": 1.6}
LLAMACPP_TARGET = 0.5          # the best weight format's batch-1 decode / llama.cpp's
PREFILL_GEMM_TARGET = 0.8
DECODE_BOUND_TARGET = 0.6


def load_hf(dtype: str):
    import transformers
    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path),
        dtype={"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dtype],
        quantization_config=transformers.GgufConfig(dequantize=True))
    return model.eval()


def prompts_of(tokenizer, num: int, num_tokens: int) -> list[list[int]]:
    ids = tokenizer.encode(corpus_text())
    step = max(1, (len(ids) - num_tokens) // max(1, num))
    return [ids[i * step:i * step + num_tokens] for i in range(num)]


def prefill_flops(config, num_tokens: int) -> float:
    """FLOPs of one prefill of ``num_tokens``: every layer's matrix products, causal
    attention's two products (token i attends to i + 1 keys), the head for the last token."""
    c = config
    d = c.head_dim
    linear = 2 * c.num_layers * c.hidden_size * (
        (c.num_heads + 2 * c.num_kv_heads) * d + c.num_heads * d + 3 * c.intermediate_size)
    attention = 2 * 2 * c.num_layers * c.num_heads * d * num_tokens * (num_tokens + 1) / 2
    return linear * num_tokens + attention + 2 * c.hidden_size * c.vocab_size


def hf_generate(model, batch: list[list[int]], new_tokens: int):
    # left padding, explicit mask: equal-length prompts here, so no padding is needed
    ids = torch.tensor(batch)
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0)


def ours_prefill(llm, prompt):
    out = llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0]
    return out.metrics.ttft_s


def ours_decode(llm, prompt, num_tokens: int) -> float:
    """Tokens after the first over the time after the first (batch 1)."""
    m = llm.generate([prompt], SamplingParams(max_tokens=num_tokens + 1,
                                              ignore_eos=True))[0].metrics
    return (m.num_output_tokens - 1) / (m.token_times_s[-1] - m.token_times_s[0])


def decode_bytes_per_step(llm) -> int:
    """Weight bytes a batch-1 decode step reads: all but an embedding the head does not
    share (the embedding is a lookup of one row)."""
    model = llm.engine.model
    embed = model.embed.numel() * model.embed.element_size()
    own_head = model.quantization or model.lm_head is not model.embed
    return model.weight_bytes - (embed if own_head else 0)


def decode_rows(llms: dict, prompt, num_tokens: int, repeats: int) -> dict:
    """Median batch-1 decode rate per weight format, rounds alternating over formats
    (the first round is a warm-up)."""
    rates = {q: [] for q in llms}
    for _ in range(repeats + 1):
        for q, llm in llms.items():
            rates[q].append(ours_decode(llm, prompt, num_tokens))
    return {q: statistics.median(r[1:]) for q, r in rates.items()}


def llamacpp_rows(threads: int, long_prompt, short_prompt, num_decode: int,
                  repeats: int, decode_only: bool) -> dict:
    binary = llama_server_binary()
    if binary is None:
        return {"status": "not built (scripts/llamacpp.sh)"}
    try:
        return _llamacpp_run(binary, threads, long_prompt, short_prompt, num_decode,
                             repeats, decode_only)
    except RuntimeError as e:          # the other rows of the run are kept
        return {"status": f"failed: {e}"[:600], "binary": str(binary)}


def _llamacpp_run(binary, threads: int, long_prompt, short_prompt, num_decode: int,
                  repeats: int, decode_only: bool) -> dict:
    with LlamaServer(binary, embedded_model_path(), threads,
                     ctx_tokens=len(long_prompt) + 256) as server:
        server.complete(short_prompt, 4)                       # warm-up
        decode = [server.complete(short_prompt, num_decode + 1)["predicted_per_second"]
                  for _ in range(repeats)]
        prefill = [] if decode_only else [
            server.complete(long_prompt, 1)["prompt_per_second"] for _ in range(repeats)]
    return {"status": "ran", "binary": str(binary), "weights": "Q4_1 (the GGUF's own)",
            "argv": server.argv[1:], "notes": server.notes,
            "decode_tokens_per_s_batch1": statistics.median(decode),
            "prefill_tokens_per_s": statistics.median(prefill) if prefill else None,
            "definition": "llama-server timings: predicted_per_second = (generated - 1) / "
                          "time from the first generated token to the last; "
                          "prompt_per_second = prompt tokens / time to the first token; "
                          "server clock, no HTTP"}


def hf_rows(llm, hf, long_prompt, short_prompt, batch_prompts, n, repeats) -> dict:
    """The bf16 rows against transformers: (ours, theirs) per metric."""
    n_prefill, n_decode, n_req, n_out = n
    rows = {}
    if long_prompt is not None:
        ours_s, _ = median_time_s(lambda: ours_prefill(llm, long_prompt), repeats)
        hf_s, _ = median_time_s(lambda: hf_generate(hf, [long_prompt], 1), repeats)
        rows["prefill_tokens_per_s"] = (n_prefill / ours_s, n_prefill / hf_s)
    t_full, _ = median_time_s(lambda: hf_generate(hf, [short_prompt], n_decode + 1), repeats)
    t_first, _ = median_time_s(lambda: hf_generate(hf, [short_prompt], 1), repeats)
    rows["decode_tokens_per_s_batch1"] = (None, n_decode / (t_full - t_first))
    if batch_prompts is not None:
        params = SamplingParams(max_tokens=n_out, ignore_eos=True)
        ours_s, _ = median_time_s(lambda: llm.generate(batch_prompts, params), repeats,
                                  warmup=0)
        hf_s, _ = median_time_s(lambda: hf_generate(hf, batch_prompts, n_out), repeats,
                                warmup=0)
        rows[f"output_tokens_per_s_{n_req}req"] = (n_req * n_out / ours_s, n_req * n_out / hf_s)
    return rows


def format_metrics(llms, decode, bandwidth, llamacpp, dtype: str) -> dict:
    base = decode[None]
    out = {}
    print(f"\nbatch-1 decode by weight format (read bandwidth {bandwidth / 1e9:.1f} GB/s: "
          f"the faster of two probes around these rows); default = dense {dtype}")
    print(f"{'weights':8s} {'tok/s':>8s} {'vs dflt':>8s} {'target':>7s} {'MB/step':>8s} "
          f"{'bound':>7s} {'of bound':>8s}")
    for q, llm in llms.items():
        step_bytes = decode_bytes_per_step(llm)
        bound = bandwidth / step_bytes
        key = dtype if q is None else q
        row = {"tokens_per_s": decode[q], "ratio_to_default": decode[q] / base,
               "weight_bytes": llm.weight_bytes(), "bytes_read_per_step": step_bytes,
               "bandwidth_bound_tokens_per_s": bound, "fraction_of_bound": decode[q] / bound,
               "target_ratio_to_default": FORMAT_TARGETS.get(q)}
        if q is None:
            row["target_fraction_of_bound"] = DECODE_BOUND_TARGET
            row["met_bound"] = row["fraction_of_bound"] >= DECODE_BOUND_TARGET
        if row["target_ratio_to_default"] is not None:
            row["met"] = row["ratio_to_default"] >= row["target_ratio_to_default"]
        out[key] = row
        target = (f"{row['target_ratio_to_default']:.1f}x" if row["target_ratio_to_default"]
                  else f">={DECODE_BOUND_TARGET:.0%}b" if q is None else "-")
        print(f"{key:8s} {decode[q]:8.1f} {row['ratio_to_default']:7.2f}x {target:>7s} "
              f"{step_bytes / 1e6:8.1f} {bound:7.1f} {row['fraction_of_bound']:7.0%}")
    lc = llamacpp.get("decode_tokens_per_s_batch1")
    print(f"{'llama.cpp':8s} " + (f"{lc:8.1f} {lc / base:7.2f}x  (Q4_1, llama-server timings)"
                                  if lc else llamacpp["status"]))
    if lc:
        best = max((q for q in llms if q is not None), key=lambda q: decode[q], default=None)
        if best is not None:
            ratio = decode[best] / lc
            out["best_format_vs_llamacpp"] = {"format": best, "ratio": ratio,
                                              "target": LLAMACPP_TARGET,
                                              "met": ratio >= LLAMACPP_TARGET}
            print(f"best format ({best}) / llama.cpp Q4_1 = {ratio:.2f}x "
                  f"(target >= {LLAMACPP_TARGET}x)")
    return out


def print_hf(rows: dict, repeats: int, dtype: str) -> dict:
    print(f"\nkvmap engine vs HF transformers generate, both dense {dtype} (the best dtype "
          f"here), same weights (median of {repeats}); load average "
          f"{environment()['load_average']}")
    print(f"{'metric':34s} {'kvmap':>10s} {'transformers':>13s} {'ratio':>7s} {'target':>7s}")
    metrics = {}
    for name, (ours, theirs) in rows.items():
        ratio = ours / theirs
        target = TARGETS.get(name, TARGETS["output_tokens_per_s_"])
        print(f"{name:34s} {ours:10.1f} {theirs:13.1f} {ratio:6.2f}x {target:6.1f}x")
        metrics[name] = {"kvmap": ours, "transformers": theirs, "ratio": ratio,
                         "target_ratio": target, "met": ratio >= target}
    return metrics


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="torch threads (and llama-server -t), the same for every engine")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="weight quantizations for the decode rows (comma-separated; '' none)")
    ap.add_argument("--kv-codecs", default="int8,int4",
                    help="KV caches for the batch-1 decode rows against the dtype's own "
                         "(comma-separated; '' none)")
    ap.add_argument("--decode-only", action="store_true",
                    help="only the batch-1 decode rows (skip prefill and 32 requests)")
    args = ap.parse_args()
    args.formats = [f for f in args.formats.split(",") if f]
    args.kv_codecs = [c for c in args.kv_codecs.split(",") if c]
    bad = [f for f in args.formats if f not in FORMATS]
    if bad:
        ap.error(f"--formats {bad[0]!r} is not one of {', '.join(FORMATS)}")
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    n_prefill, n_decode, n_req, n_in, n_out = (2000, 128, 32, 200, 200)
    if args.quick:
        n_prefill, n_decode, n_req, n_in, n_out = (500, 32, 8, 100, 32)
        args.repeats = 1

    hw = detect()
    dtype = hw.auto_dtype("cpu")       # each side at its best dtype on this hardware
    print(f"machine: {headline(hw.summary())}")
    engine_args = dict(dtype=dtype, kv=dtype, enable_prefix_caching=False,
                       max_num_batched_tokens=2048, max_num_seqs=64)
    llms = {None: LLM(kv_memory="512MiB", **engine_args)}
    for q in args.formats:             # batch 1 only: a small pool is enough
        llms[q] = LLM(kv_memory="64MiB", quantization=q, **engine_args)
    llm, hf = llms[None], load_hf(dtype)
    tok = llm.tokenizer
    long_prompt = prompts_of(tok, 1, n_prefill)[0]
    short_prompt = prompts_of(tok, 1, 16)[0]
    batch_prompts = prompts_of(tok, n_req, n_in)

    rows = hf_rows(llm, hf, None if args.decode_only else long_prompt, short_prompt,
                   None if args.decode_only else batch_prompts,
                   (n_prefill, n_decode, n_req, n_out), args.repeats)
    read_before = read_bandwidth()
    decode = decode_rows(llms, short_prompt, n_decode, args.repeats)
    read_after = read_bandwidth()
    rows["decode_tokens_per_s_batch1"] = (decode[None], rows["decode_tokens_per_s_batch1"][1])
    # the bound: the faster of two read-bandwidth probes around the decode rows (a probe
    # that caught a burst of load must not lower the bar); copy bandwidth recorded beside
    bandwidth = max(read_before, read_after)
    kv_rows = kv_codec_rows(engine_args, dtype, args.kv_codecs, short_prompt, n_decode,
                            args.repeats) if args.kv_codecs else {}
    budgets = ({} if args.decode_only else
               budget_rows({**engine_args, "kv_memory": "512MiB"}, long_prompt,
                           short_prompt, args.repeats))
    llamacpp = llamacpp_rows(args.threads, long_prompt, short_prompt, n_decode,
                             args.repeats, args.decode_only)

    metrics = print_hf(rows, args.repeats, dtype)
    metrics["weight_formats_decode_batch1"] = format_metrics(llms, decode, bandwidth, llamacpp,
                                                             dtype)
    metrics["llamacpp"] = llamacpp
    metrics["kv_codecs_decode_batch1"] = kv_rows
    metrics["step_budget_prefill"] = budgets
    metrics["read_bandwidth_bytes_per_s"] = {"before_decode": read_before,
                                             "after_decode": read_after, "bound": bandwidth}
    metrics["copy_bandwidth_bytes_per_s"] = copy_bandwidth()
    if "prefill_tokens_per_s" in rows:
        measured = measure(detect())          # the GEMM probe now, at the model's shapes
        peak = measured.rates["matmul_flops"][dtype]["prefill"] / 1e9
        flops = prefill_flops(llm.engine.model.config, n_prefill)
        prefill_gflops = rows["prefill_tokens_per_s"][0] * flops / n_prefill / 1e9
        print(f"{dtype} GEMM rate at the model's shapes {peak:.0f} GFLOP/s; prefill runs "
              f"{prefill_gflops:.0f} GFLOP/s = {prefill_gflops / peak:.0%} of it "
              f"(target >= {PREFILL_GEMM_TARGET:.0%})")
        if llamacpp.get("prefill_tokens_per_s"):
            print(f"llama.cpp prefill {llamacpp['prefill_tokens_per_s']:.1f} tok/s; ours / it "
                  f"= {rows['prefill_tokens_per_s'][0] / llamacpp['prefill_tokens_per_s']:.2f}x")
        metrics["gemm_gflops_at_model_shapes"] = peak
        metrics["prefill_gflops"] = prefill_gflops
        metrics["prefill_fraction_of_gemm_rate"] = prefill_gflops / peak
        metrics["prefill_gemm_target_met"] = prefill_gflops / peak >= PREFILL_GEMM_TARGET
    print(f"load average {environment()['load_average']}")
    path = write_record("engine_vs_hf", {"repeats": args.repeats, "quick": args.quick,
                                         "threads": args.threads, "formats": args.formats,
                                         "decode_only": args.decode_only,
                                         "kv_codecs": args.kv_codecs,
                                         "prefill_tokens": n_prefill,
                                         "decode_tokens": n_decode, "requests": n_req,
                                         "prompt_tokens": n_in, "output_tokens": n_out,
                                         "dtype": dtype, "machine_class": hw.machine_class},
                        metrics)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
