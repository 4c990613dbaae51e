"""The kvpress half of ``kvpress_check.py``: runs in kvpress's own venv
(``scripts/kvpress.sh``; kvpress 0.5.5 needs transformers < 5.3) and imports nothing of
kvmap. Reads the passkey cases kvmap built (JSON: ``[{"sample_id", "prompt", "key"}]``),
answers each with every press at one compression ratio, in two modes, and writes
``{press: {mode: [answer, ...]}}``:

  blind    kvpress's own use: the context (the prompt up to the question) is compressed,
           then the question is read into the compressed cache -- the presses never see
           the question;
  window   the whole prompt, question included, is compressed (question=""), as kvmap
           compresses a prompt: the observation window of SnapKV ends on the question.

Greedy, ``max_new_tokens`` 24, the tokenizer's chat template off (the passkey prompt ends
"The special magic number for X is" and is continued as plain text, as kvmap does).

    .venv-kvpress/bin/python benchmarks/kvpress_peer.py CASES.json OUT.json \
        --gguf SmolLM2.gguf --ratio 0.75 [--presses snapkv,streaming_llm,...]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

MAX_NEW_TOKENS = 24       # the pipeline starts the answer on a new line and often repeats
                          # "The special magic number for X is" first (12 ran out, 2026-12-04)
QUESTION_MARK = "\n\nWhat is the special magic number"


def make_presses(names: list[str], ratio: float, window: int, kernel: int) -> dict:
    import kvpress
    makers = {
        "none": lambda: None,
        "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=ratio, window_size=window,
                                              kernel_size=kernel),
        "streaming_llm": lambda: kvpress.StreamingLLMPress(compression_ratio=ratio,
                                                           n_sink=4),
        "knorm": lambda: kvpress.KnormPress(compression_ratio=ratio),
        "tova": lambda: kvpress.TOVAPress(compression_ratio=ratio),
        "h2o": lambda: kvpress.ObservedAttentionPress(compression_ratio=ratio),
    }
    unknown = [n for n in names if n not in makers]
    if unknown:
        raise ValueError(f"unknown presses {unknown}; valid: {', '.join(makers)}")
    return {n: makers[n]() for n in names}


def load_pipeline(gguf: pathlib.Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    import kvpress  # noqa: F401  (registers "kv-press-text-generation")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.chat_template = None
    # transformers < 5.3 dequantizes a GGUF as it loads it (no GgufConfig needed);
    # eager attention: ObservedAttentionPress (H2O) scores from the attention weights
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
        attn_implementation="eager").eval()
    return pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer,
                    device="cpu")


def answer(pipe, prompt: str, press, mode: str) -> str:
    if mode == "blind":
        cut = prompt.index(QUESTION_MARK)
        context, question = prompt[:cut], prompt[cut:]
    else:
        context, question = prompt, ""
    out = pipe(context, question=question, press=press, max_new_tokens=MAX_NEW_TOKENS)
    return out["answer"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", type=pathlib.Path)
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--gguf", type=pathlib.Path, required=True)
    p.add_argument("--ratio", type=float, required=True, help="fraction of the KV removed")
    p.add_argument("--presses", default="none,snapkv,streaming_llm,knorm,tova,h2o")
    p.add_argument("--modes", default="blind,window")
    p.add_argument("--window", type=int, default=32, help="SnapKV observation window")
    p.add_argument("--kernel", type=int, default=11, help="SnapKV pooling kernel")
    args = p.parse_args()
    import kvpress
    import transformers
    cases = json.loads(args.cases.read_text())
    pipe = load_pipeline(args.gguf)
    presses = make_presses(args.presses.split(","), args.ratio, args.window, args.kernel)
    results: dict = {}
    started = time.perf_counter()
    for name, press in presses.items():
        for mode in args.modes.split(","):
            if name == "none" and mode == "window" and "blind" in args.modes:
                continue            # without a press both modes are the same full cache
            results.setdefault(name, {})[mode] = [answer(pipe, c["prompt"], press, mode)
                                                  for c in cases]
            print(f"{name:14s} {mode:6s} {time.perf_counter() - started:7.1f} s", flush=True)
    args.out.write_text(json.dumps({
        "kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
        "transformers": transformers.__version__, "ratio": args.ratio,
        "snapkv": {"window": args.window, "kernel": args.kernel}, "answers": results}))


if __name__ == "__main__":
    main()
