#!/usr/bin/env bash
# Build llama.cpp's own C++ server (llama-server) from the sources vendored in the
# llama-cpp-python source distribution, into a scratch directory, and print its path.
#
#   scripts/llamacpp.sh [--version V] [--prefix DIR] [--jobs N]
#
#   --version V   llama-cpp-python release whose vendor/llama.cpp is built (default 0.3.36)
#   --prefix DIR  scratch root (default $KVMAP_LLAMACPP_PREFIX or ~/.cache/kvmap/llamacpp);
#                 the build lands in DIR/V/
#   --jobs N      parallel compile jobs (default 2: the machine is shared)
#
# Idempotent: when DIR/V/build/bin/llama-server exists it is printed and nothing is built.
# The last line of stdout is the binary's path; everything else goes to stderr.
# llama.cpp is a peer the benchmarks measure, never a dependency of the kvmap package:
# nothing in src/ imports or calls this script.
set -euo pipefail

usage() { echo "usage: $0 [--version V] [--prefix DIR] [--jobs N]" >&2; exit 2; }

version="0.3.36"
prefix="${KVMAP_LLAMACPP_PREFIX:-$HOME/.cache/kvmap/llamacpp}"
jobs=2
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || usage; version="$2"; shift 2 ;;
    --prefix) [ $# -ge 2 ] || usage; prefix="$2"; shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; jobs="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument '$1'" >&2; usage ;;
  esac
done
case "$version" in
  ''|*[!0-9.]*) echo "--version must look like 0.3.36, got '$version'" >&2; exit 2 ;;
esac
case "$jobs" in
  ''|*[!0-9]*|0) echo "--jobs must be a positive integer, got '$jobs'" >&2; exit 2 ;;
esac

root="$prefix/$version"
binary="$root/build/bin/llama-server"
if [ -x "$binary" ]; then echo "$binary"; exit 0; fi

for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "llamacpp.sh needs '$tool' on PATH" >&2; exit 1; }
done
python="${PYTHON:-python3}"
mkdir -p "$root"

src="$root/src"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
  echo "downloading the llama-cpp-python $version source distribution" >&2
  "$python" -m pip download --no-deps --no-binary :all: --dest "$root/sdist" \
    "llama-cpp-python==$version" >&2
  archive="$(ls "$root"/sdist/llama_cpp_python-"$version".tar.gz 2>/dev/null \
    || ls "$root"/sdist/llama-cpp-python-"$version".tar.gz)"
  rm -rf "$src" && mkdir -p "$src"
  tar -xzf "$archive" -C "$src" --strip-components=1
fi

echo "building llama-server (jobs=$jobs) in $root/build" >&2
# Only the server target, no libcurl (models come from local GGUF files), native ISA.
nice -n 19 cmake -S "$src/vendor/llama.cpp" -B "$root/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
nice -n 19 cmake --build "$root/build" --config Release --target llama-server -j "$jobs" >&2

[ -x "$binary" ] || { echo "build finished but $binary is missing" >&2; exit 1; }
echo "$binary"
