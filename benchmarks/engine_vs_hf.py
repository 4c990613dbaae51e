"""kvmap's engine against HF transformers ``generate``, side by side in one run, on the
same weights (the embedded SmolLM2-135M GGUF, dequantized to dense bf16 for both).

Measures (median of --repeats runs each):
  prefill   tokens/s on a 2,000-token prompt (time to the first token)
  decode    tokens/s at batch 1 (128 new tokens after a short prompt)
  batch     output tokens/s for 32 requests of ~200 prompt and 200 output tokens
            (ours: continuous batching; transformers: one padded batched generate)
and the machine's bf16 matrix-multiply rate, to state prefill as a fraction of it.

    .venv/bin/python benchmarks/engine_vs_hf.py [--repeats 3] [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import environment, matmul_gflops, median_time_s, write_record  # noqa: E402

from kvmap import LLM, SamplingParams  # noqa: E402
from kvmap.model.loader import embedded_model_path  # noqa: E402
from kvmap.workloads.corpus import corpus_text  # noqa: E402


def load_hf():
    import transformers
    path = embedded_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.bfloat16,
        quantization_config=transformers.GgufConfig(dequantize=True))
    return model.eval()


def prompts_of(tokenizer, num: int, num_tokens: int) -> list[list[int]]:
    ids = tokenizer.encode(corpus_text())
    step = max(1, (len(ids) - num_tokens) // max(1, num))
    return [ids[i * step:i * step + num_tokens] for i in range(num)]


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                    help="torch threads, the same for both engines")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    n_prefill, n_decode, n_req, n_in, n_out = (2000, 128, 32, 200, 200)
    if args.quick:
        n_prefill, n_decode, n_req, n_in, n_out = (500, 32, 8, 100, 32)
        args.repeats = 1

    llm = LLM(dtype="bf16", kv="bf16", kv_memory="512MiB", enable_prefix_caching=False,
              max_num_batched_tokens=2048, max_num_seqs=64)
    hf = load_hf()
    tok = llm.tokenizer
    long_prompt = prompts_of(tok, 1, n_prefill)[0]
    short_prompt = prompts_of(tok, 1, 16)[0]
    batch_prompts = prompts_of(tok, n_req, n_in)
    rows = {}

    # prefill: ours = time to first token of a lone request; HF = generate 1 new token
    ours_s, _ = median_time_s(lambda: ours_prefill(llm, long_prompt), args.repeats)
    hf_s, _ = median_time_s(lambda: hf_generate(hf, [long_prompt], 1), args.repeats)
    rows["prefill_tokens_per_s"] = (n_prefill / ours_s, n_prefill / hf_s)

    # decode at batch 1: tokens after the first over the time after the first
    def ours_decode():
        m = llm.generate([short_prompt], SamplingParams(max_tokens=n_decode + 1,
                                                        ignore_eos=True))[0].metrics
        return (m.num_output_tokens - 1) / (m.token_times_s[-1] - m.token_times_s[0])
    ours_rates = [ours_decode() for _ in range(args.repeats + 1)][1:]
    t_full, _ = median_time_s(lambda: hf_generate(hf, [short_prompt], n_decode + 1),
                              args.repeats)
    t_first, _ = median_time_s(lambda: hf_generate(hf, [short_prompt], 1), args.repeats)
    rows["decode_tokens_per_s_batch1"] = (sorted(ours_rates)[len(ours_rates) // 2],
                                          n_decode / (t_full - t_first))

    # 32 concurrent requests
    params = SamplingParams(max_tokens=n_out, ignore_eos=True)
    ours_s, _ = median_time_s(lambda: llm.generate(batch_prompts, params), args.repeats,
                              warmup=0)
    hf_s, _ = median_time_s(lambda: hf_generate(hf, batch_prompts, n_out), args.repeats,
                            warmup=0)
    rows[f"output_tokens_per_s_{n_req}req"] = (n_req * n_out / ours_s, n_req * n_out / hf_s)

    peak = matmul_gflops(torch.bfloat16)
    flops_per_token = 2 * llm.engine.model.config.num_params   # dense matmuls, approx.
    prefill_gflops = rows["prefill_tokens_per_s"][0] * flops_per_token / 1e9
    targets = {"prefill_tokens_per_s": 2.0, "decode_tokens_per_s_batch1": 2.5,
               f"output_tokens_per_s_{n_req}req": 5.0}

    print(f"\nkvmap engine vs HF transformers generate, bf16, same weights "
          f"(median of {args.repeats}); load average {environment()['load_average']}")
    print(f"{'metric':34s} {'kvmap':>10s} {'transformers':>13s} {'ratio':>7s} {'target':>7s}")
    metrics = {}
    for name, (ours, theirs) in rows.items():
        ratio = ours / theirs
        print(f"{name:34s} {ours:10.1f} {theirs:13.1f} {ratio:6.2f}x {targets[name]:6.1f}x")
        metrics[name] = {"kvmap": ours, "transformers": theirs, "ratio": ratio,
                         "target_ratio": targets[name], "met": ratio >= targets[name]}
    print(f"bf16 matmul rate {peak:.0f} GFLOP/s; prefill runs {prefill_gflops:.0f} GFLOP/s "
          f"= {prefill_gflops / peak:.0%} of it (target >= 50%)")
    metrics["bf16_matmul_gflops"] = peak
    metrics["prefill_fraction_of_matmul_rate"] = prefill_gflops / peak
    path = write_record("engine_vs_hf", {"repeats": args.repeats, "quick": args.quick,
                                         "threads": args.threads,
                                         "prefill_tokens": n_prefill,
                                         "decode_tokens": n_decode, "requests": n_req,
                                         "prompt_tokens": n_in, "output_tokens": n_out},
                        metrics)
    print(f"record: {path}")


if __name__ == "__main__":
    main()
