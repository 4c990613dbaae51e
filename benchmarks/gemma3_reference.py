"""Reference tokens and logits of Gemma 3 270M from HF transformers, for kvmap's tests.

transformers (the test reference, 5.x) loads the same GGUF as ``Gemma3ForCausalLM``,
dequantized to fp32 with eager attention, and its tokenizer from the same file (its
GGUF converter). Loading costs minutes on a slow CPU, so this script runs it once and
writes what the tests compare against into a committed JSON
(``tests/model/gemma3_reference.json``):

- ``tokenizer``: HF's ids for a set of strings (no special tokens added), and with BOS;
- ``prompts``: for each prompt, its ids (BOS first, as HF adds it), the greedy
  continuation of ``--new-tokens`` tokens (``generate``, HF's own sliding-window cache),
  and at each continuation position the top-5 logits of one teacher-forced forward pass
  over prompt + continuation. One prompt is longer than the model's 512-token sliding
  window, so the local layers' window is exercised.

    PYTHONPATH=src python benchmarks/gemma3_reference.py          # ~3-5 min on 2 cores

``tests/model/test_gemma3_real.py`` checks kvmap against the file.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from common import code_state, environment, git_sha   # noqa: E402 (benchmarks/ on path)

OUT = Path(__file__).resolve().parents[1] / "tests" / "model" / "gemma3_reference.json"

TOKENIZER_STRINGS = [
    "The Rhine flows through",
    "Hello, world! How are you today?",
    "  leading spaces and   inner   runs of spaces  ",
    "line one\nline two\n\n\ttabbed line\r\nwindows line",
    "Numbers: 3.14159, 2026-12-01, 1,000,000 and 0x1F.",
    "def f(x):\n    return x ** 2  # square\n",
    "Ünïcödé: naïve café, Straße, 東京は日本の首都です。 Привет мир",
    "Emoji 🙂👍🏽 and symbols ∑∫√ ≠ ≤ ≥ © ®",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "a" * 40 + " " + "ab" * 20,
    "https://example.com/path?query=1&other=two#frag",
    "",
]

SHORT_PROMPTS = [
    "The Rhine flows through",
    "The capital of France is",
    "def fibonacci(n):",
]


def long_prompt() -> str:
    """About 700 words of the built-in corpus: longer than the 512-token window."""
    from kvmap.workloads.corpus import corpus_paragraphs
    words, pieces = 0, []
    for paragraph in corpus_paragraphs()[40:]:
        pieces.append(paragraph)
        words += len(paragraph.split())
        if words > 600:
            break
    return "\n\n".join(pieces) + "\n\nIn summary,"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from kvmap.model.loader import gemma3_270m_path
    path = gemma3_270m_path()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    t_tok = time.perf_counter() - t0
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True), attn_implementation="eager").eval()
    t_model = time.perf_counter() - t0 - t_tok
    tokenizer = [{"text": s, "ids": tok(s, add_special_tokens=False)["input_ids"],
                  "ids_with_bos": tok(s)["input_ids"]} for s in TOKENIZER_STRINGS]
    prompts = []
    for text in [*SHORT_PROMPTS, long_prompt()]:
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
            new = out[0, ids.shape[1]:].tolist()
            logits = model(out).logits[0, ids.shape[1] - 1:-1].float()      # (N, V)
        top = torch.topk(logits, 5, dim=-1)
        prompts.append({"text": text, "ids": ids[0].tolist(), "greedy_ids": new,
                        "greedy_text": tok.decode(new),
                        "top5_ids": top.indices.tolist(),
                        "top5_logits": [[round(x, 5) for x in row]
                                        for row in top.values.tolist()]})
        print(f"{ids.shape[1]:5d} tokens -> {tok.decode(new)!r}")
    import transformers
    record = {"schema_version": 1, "benchmark": "gemma3_reference", "git_sha": git_sha(),
              "code": code_state(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "environment": environment(),
              "config": {"model": path.name, "transformers": transformers.__version__,
                         "dtype": "float32", "attn_implementation": "eager",
                         "new_tokens": args.new_tokens, "architecture":
                         type(model).__name__},
              "metrics": {"tokenizer_load_s": round(t_tok, 1),
                          "model_load_s": round(t_model, 1)},
              "tokenizer": tokenizer, "prompts": prompts}
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"tokenizer {t_tok:.0f} s, model {t_model:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
