#!/usr/bin/env bash
# `make sanitize`: every CPU test (ctest label `cpu`) built with AddressSanitizer,
# LeakSanitizer and UBSan (g++, Debug, in build-asan/) and run. The host code is what
# is instrumented: loaders, tokenizer, sampler, CPU backend, chat session and program,
# the chapters' CPU references. nvcc's device code is not, and no GPU test runs here.
# Any report (out-of-bounds, use after free, leak, signed overflow, misaligned load...)
# fails the test that made it.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${SANITIZE_BUILD:-build-asan}
arch=${CUDA_ARCH:-90}  # one architecture is enough: the device code only has to link
jobs=${JOBS:-$(nproc)}
python=$(bash scripts/python_env.sh)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$build" "${generator[@]}" -DBIELIK_PYTHON="$python" -DBIELIK_CUDA_ARCH="$arch" \
  -DBIELIK_CHAPTER_FILTER= -DBIELIK_LAST_CHAPTER=99 -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null

# Only the programs the CPU tests run (the `cpu_tests` target; with what they depend
# on: golden data, bielik-chat for the command-line test).
cmake --build "$build" -j "$jobs" --target cpu_tests

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" -L cpu --output-on-failure -j 2
