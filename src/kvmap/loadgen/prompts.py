"""The requests a load run sends: a workload preset or a trace, in text, sized per level.

Prompts are text built by ``kvmap.workloads`` (the same presets as ``kvmap bench``), so
any server can take them. Their lengths are counted with a local tokenizer, which should
be the server's own for exact prompt lengths (``--tokenizer``):

    smollm2        the embedded SmolLM2 tokenizer (default; what ``kvmap serve`` runs)
    PATH           a Hugging Face model directory with tokenizer.json, or a .gguf file
    bytes          one token per UTF-8 byte (no model files; ``dummy:*`` models)

A server with another tokenizer gets prompts of about the same length in its own tokens;
the lengths it really saw are in its usage chunk (``num_prompt_tokens`` in the rows).
Output lengths are exact when the server honours ``ignore_eos`` (vLLM, kvmap).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvmap.model.byte_tokenizer import ByteTokenizer
from kvmap.workloads import WorkloadRequest, WorkloadSpec, build_requests, get_preset


def load_tokenizer(name: str):
    """A tokenizer by ``--tokenizer`` name (see the module docstring)."""
    from kvmap.model.tokenizer import Tokenizer
    key = name.strip()
    if key.lower() == "bytes":
        return ByteTokenizer()          # the one a dummy:* model gets from kvmap serve
    if key.lower() in ("smollm2", "default", ""):
        from kvmap.model.loader import embedded_model_path
        return _gguf_tokenizer(embedded_model_path())
    path = Path(key).expanduser()
    if path.is_dir():
        return Tokenizer.from_hf_dir(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _gguf_tokenizer(path)
    raise ValueError(f"--tokenizer {name!r} is not 'smollm2', 'bytes', a model directory "
                     "or a .gguf file")


def _gguf_tokenizer(path: Path):
    from kvmap.model.gguf_loader import open_gguf, read_metadata
    from kvmap.model.tokenizer import Tokenizer
    return Tokenizer.from_gguf_metadata(read_metadata(open_gguf(path)))


def workload_spec(workload: str | None, trace: str | None, *, seed: int = 0,
                  prompt_tokens: int | None = None, output_tokens: int | None = None
                  ) -> WorkloadSpec:
    """The preset ``workload`` (default ``throughput``) or a trace file, resized."""
    if workload and trace:
        raise ValueError("give --workload or --trace, not both")
    if trace:
        spec = WorkloadSpec("trace", "trace", None, arrival=None, trace_path=str(trace),
                            seed=seed)
    else:
        spec = replace(get_preset(workload or "throughput"), seed=seed)
    for name, value in (("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    return spec.with_sizes(prompt_tokens=prompt_tokens, output_tokens=output_tokens)


def build(spec: WorkloadSpec, tokenizer, num_requests: int | None) -> list[WorkloadRequest]:
    """``num_requests`` requests of ``spec`` (``None``: the spec's own count)."""
    if num_requests is not None:
        if spec.kind == "trace":
            spec = replace(spec, num_requests=num_requests)
        else:
            spec = spec.with_sizes(num_requests=num_requests)
    return build_requests(spec, tokenizer)
