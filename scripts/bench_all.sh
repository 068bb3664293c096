#!/usr/bin/env bash
# The one-call GPU benchmark of issue 7, on a machine with a GPU:
#
#   [OUT=dir] [CHAPTERS=regex] [SKIP_COMPILED=1] bash scripts/bench_all.sh
#
#  1. makes the Bielik-shaped random checkpoint if absent (models/bielik-shaped-random,
#     scripts/make_random_checkpoint.py: torch + safetensors);
#  2. builds bench_model (chapters 01-05, 07 and 08: CHAPTERS defaults to '0[1234578]');
#  3. runs bench_model -> build/bench/model.json (+ its tables as CSV);
#  3b. checks the CUDA backend's logits against HF transformers on the same checkpoint
#     (scripts/compare_hf_logits.py -> build/bench/hf_logits.json);
#  4. runs the PyTorch baseline -> build/bench/pytorch.json (SKIP_COMPILED=1 skips the
#     torch.compile run, which takes minutes to compile; SKIP_PYTORCH=1 skips the step,
#     for a quick check of our own numbers);
#  5. writes docs/benchmarks.md and docs/benchmarks.png (scripts/make_bench_report.py),
#     and copies them with the JSON files to $OUT when it is set.
# A failing step is reported and the later steps still run on what exists, so one broken
# baseline does not lose the project's own numbers.
set -uo pipefail
cd "$(dirname "$0")/.."
model="${MODEL_DIR:-models/bielik-shaped-random}"
build="${BUILD:-build}"
bench_dir="$build/bench"
mkdir -p "$bench_dir"
status=0
step() { echo "== $(date -u +%H:%M:%S) $*"; }
# Copies what exists so far to $OUT: a run cut short still returns the finished steps.
publish() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  # The device tool returns at most 8 files: the report, the plot, the JSON files, and
  # every CSV table in one archive.
  cp docs/benchmarks.md docs/benchmarks.png "$bench_dir"/*.json "$OUT"/ 2>/dev/null
  tar -C "$bench_dir" -cf "$OUT/bench_csv.tar" $(cd "$bench_dir" && ls *.csv 2>/dev/null) 2>/dev/null
  return 0
}

step "checkpoint $model"
if [ ! -f "$model/model.safetensors" ]; then
  python3 scripts/make_random_checkpoint.py --out "$model" || { echo "checkpoint: FAILED"; exit 1; }
fi

step "build bench_model (CHAPTERS='${CHAPTERS-0[1234578]}')"
make configure BUILD="$build" CHAPTERS="${CHAPTERS-0[1234578]}" CUDA_ARCH="${CUDA_ARCH:-}" >"$bench_dir/configure.log" 2>&1 \
  && cmake --build "$build" --target bench_model -j "$(nproc)" >"$bench_dir/build.log" 2>&1
if [ $? -ne 0 ]; then
  tail -40 "$bench_dir/configure.log" "$bench_dir/build.log"
  echo "build: FAILED"
  exit 1
fi

step "bench_model"
BIELIK_BENCH_DIR="$bench_dir" "$build/chapters/08_bielik/bench_model" --model "$model" --out "$bench_dir/model.json" \
  || { echo "bench_model: FAILED"; status=1; }

step "logits vs HF transformers (same checkpoint)"
cmake --build "$build" --target dump_logits -j "$(nproc)" >>"$bench_dir/build.log" 2>&1 \
  && python3 scripts/compare_hf_logits.py --model "$model" --dump-logits "$build/chapters/08_bielik/dump_logits" \
       --out "$bench_dir/hf_logits.json" \
  || { echo "compare_hf_logits: FAILED"; status=1; }

step "report (our numbers)"
python3 scripts/make_bench_report.py --bench-dir "$bench_dir" --out docs || status=1
publish

if [ "${SKIP_PYTORCH:-0}" = 1 ]; then
  step "done without the PyTorch baseline (status $status)"
  exit $status
fi

step "PyTorch baseline"
compiled_flag=()
[ "${SKIP_COMPILED:-0}" = 1 ] && compiled_flag=(--skip-compiled)
python3 scripts/bench_pytorch.py --model "$model" --out "$bench_dir/pytorch.json" "${compiled_flag[@]}" \
  || { echo "bench_pytorch: FAILED"; status=1; }

step "report (with the baseline)"
python3 scripts/make_bench_report.py --bench-dir "$bench_dir" --out docs || status=1

publish
step "done (status $status)"
exit $status
