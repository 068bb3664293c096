#!/usr/bin/env bash
# The one-call GPU benchmark of issue 7, on a machine with a GPU:
#
#   [OUT=dir] [BUILD=dir] [CHAPTERS=regex] [MODEL_DIR=dir] [SKIP_COMPILED=1] [SKIP_PYTORCH=1] [PYTORCH_ONLY=1] \
#     [SKIP_LLAMACPP=1] [LLAMACPP_ONLY=1] [LLAMA_BENCH=path] [BUILD_ONLY=1] [SKIP_CEILING=1] \
#     bash scripts/bench_all.sh
#
#  0. clears this run's outputs in $BUILD/bench (every *.json, bench_model's model_*.csv),
#     so nothing an earlier run (or another GPU) left there reaches the report, and checks
#     that python3 has the packages of scripts/requirements-bench.txt (it names what is
#     missing and skips the steps that need it; it installs nothing: a GPU machine is
#     often offline);
#  1. picks the checkpoint: MODEL_DIR when set; else the real Bielik-1.5B-v3.0-Instruct
#     in models/bielik-1.5b-v3.0-instruct (the folder `make chat MODEL=bielik` and
#     scripts/download_bielik.sh fill) when it is complete, *instead of* the random one
#     (same tensors and bytes per token, so the same speed, and the logits check then
#     runs on the real weights); else models/bielik-shaped-random, made here if absent
#     (scripts/make_random_checkpoint.py: torch + safetensors). Random weights are only
#     ever written into that default folder;
#  2. builds bench_model into its own tree, build-bench (BUILD overrides), so the main
#     build/ keeps its full chapter set. CHAPTERS defaults to '0[1234578]' (chapters
#     01-05, 07, 08) in build-bench, and to every chapter in a BUILD you name. After
#     scripts/gpu_run.sh (or `make bench`) has built build/ in full, BUILD=build reuses
#     that tree instead of compiling a second one;
#  3. runs bench_model -> $BUILD/bench/model.json (+ its tables as model_*.csv);
#  3b. checks the CUDA backend's logits against HF transformers on the same checkpoint
#     (scripts/compare_hf_logits.py -> $BUILD/bench/hf_logits.json);
#  3c. measures the decode step against the ceiling of its launch shape on this GPU, which
#     says where the gap to the decode target is (scripts/step_vs_ceiling.py with
#     bench_layer_chain -> $BUILD/bench/step_vs_ceiling.json; about a minute;
#     SKIP_CEILING=1 skips it);
#  4. runs the PyTorch baseline -> $BUILD/bench/pytorch.json (SKIP_COMPILED=1 skips the
#     torch.compile run, which takes minutes to compile; SKIP_PYTORCH=1 skips the step,
#     for a quick check of our own numbers);
#  4b. (run before step 4: seconds before minutes) builds and runs llama.cpp on the same GPU
#     and checkpoint -> $BUILD/bench/llamacpp.json
#     (scripts/bench_llamacpp.py: llama-bench, CUDA, f16, flash attention; its source is
#     third_party/llama.cpp, which scripts/fetch_llamacpp.sh fetches on a machine with
#     network; without it the step is skipped with a note, not failed; SKIP_LLAMACPP=1
#     skips it). Its first build takes minutes; LLAMA_BENCH=path uses a llama-bench built
#     before instead: `python3 scripts/bench_llamacpp.py --build-only --cuda-arch 90
#     --work-dir build-llamacpp` on any machine with nvcc packs it as
#     build-llamacpp/llama-bench.xz (~41 MB), which travels to the GPU machine with
#     third_party/llama.cpp/gguf-py (the GGUF writer) and its .commit and .fetched-from;
#     the source is then not needed there.
#     Where one call may not run everything (the device tool's 600 s: a fresh machine's
#     build and bench_model take ~450 s, PyTorch with its compile ~200 s more, llama.cpp's
#     build and benchmark minutes more), split the run on the same machine:
#     SKIP_PYTORCH=1 SKIP_LLAMACPP=1 first, then LLAMACPP_ONLY=1 and PYTORCH_ONLY=1, each
#     of which keeps the earlier calls' results, runs only its baseline and writes the
#     report from all of them (its header names when each part finished). BUILD_ONLY=1,
#     before them, does only the CPU's work (steps 1 and 2 for both engines, side by side,
#     and the GGUF) and measures nothing, so the later calls spend their time measuring;
#  5. writes docs/benchmarks.md and docs/benchmarks.png, on another GPU than the H200
#     docs/benchmarks_<gpu>.md and .png (scripts/make_bench_report.py;
#     it refuses without model.json, leaves out a baseline from another GPU or checkpoint,
#     and deletes a stale plot when matplotlib is missing), and copies them with the JSON
#     files to $OUT when it is set.
# A failing step is reported and the later steps still run on what exists, so one broken
# baseline does not lose the project's own numbers; the exit status is then 1. Without
# model.json there is nothing to report or compare with: the run stops after step 3b.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
random_model=models/bielik-shaped-random
bielik_model=models/bielik-1.5b-v3.0-instruct  # the Makefile's BIELIK_DIR
build="${BUILD:-build-bench}"
if [ -n "${BUILD:-}" ]; then chapters="${CHAPTERS-}"; else chapters="${CHAPTERS-0[1234578]}"; fi
bench_dir="$build/bench"
mkdir -p "$bench_dir"
status=0
report_written=0
report_name=""
step() { echo "== $(date -u +%H:%M:%S) $*"; }
# Copies what this run produced so far to $OUT: a run cut short still returns the
# finished steps, and a report this run did not write (an older docs/benchmarks*.md) is
# never sent as if it were this run's.
publish() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  # The device tool returns at most 8 files: the report, the plot, the five result files
  # the report reads, and the rest (bench_model's CSV tables, llama-bench's own JSON, this
  # run's logs) in one archive.
  local name
  if [ "$report_written" = 1 ]; then
    cp "docs/$report_name.md" "$OUT"/
    [ -f "docs/$report_name.png" ] && cp "docs/$report_name.png" "$OUT"/
  fi
  for name in model hf_logits step_vs_ceiling pytorch llamacpp; do
    [ -f "$bench_dir/$name.json" ] && cp "$bench_dir/$name.json" "$OUT"/
  done
  tar -C "$bench_dir" -cf "$OUT/bench_csv.tar" \
    $(cd "$bench_dir" && ls model_*.csv llamacpp_bench_*.json ./*.log 2>/dev/null) 2>/dev/null
  return 0
}
report() {
  report_written=0  # what publish sends is the last report written, never an older one
  # The report's name depends on the GPU: benchmarks on an H200, benchmarks_<gpu> elsewhere.
  report_name=$(python3 scripts/make_bench_report.py --bench-dir "$bench_dir" --print-report-name) || report_name=""
  if [ -n "$report_name" ] &&
    python3 scripts/make_bench_report.py --bench-dir "$bench_dir" --out docs --checkpoint-kind "$kind"; then
    report_written=1
  else
    echo "report: FAILED (no report written)"
    status=1
  fi
}

# 0. This run's outputs only: the JSON files and bench_model's tables. The chapters'
# own bench_* CSVs (`make bench` writes them here just before calling this script) stay;
# the report does not read them.
# PYTORCH_ONLY=1 or LLAMACPP_ONLY=1 (the later calls of a split run, above) keep them and
# clear only that baseline's.
run_pytorch=1; run_llamacpp=1
[ "${SKIP_PYTORCH:-0}" = 1 ] && run_pytorch=0
[ "${SKIP_LLAMACPP:-0}" = 1 ] && run_llamacpp=0
baseline_only=""
if [ "${PYTORCH_ONLY:-0}" = 1 ] && [ "${LLAMACPP_ONLY:-0}" = 1 ]; then
  echo "PYTORCH_ONLY=1 and LLAMACPP_ONLY=1: set one of them (one baseline a call)"
  exit 1
elif [ "${PYTORCH_ONLY:-0}" = 1 ]; then
  baseline_only=pytorch; run_llamacpp=0
  [ "$run_pytorch" = 1 ] || { echo "PYTORCH_ONLY=1 and SKIP_PYTORCH=1 ask for nothing: set one of them"; exit 1; }
  rm -f "$bench_dir/pytorch.json"
elif [ "${LLAMACPP_ONLY:-0}" = 1 ]; then
  baseline_only=llamacpp; run_pytorch=0
  [ "$run_llamacpp" = 1 ] || { echo "LLAMACPP_ONLY=1 and SKIP_LLAMACPP=1 ask for nothing: set one of them"; exit 1; }
  rm -f "$bench_dir"/llamacpp*.json
fi
later_call=0  # a later call of a split run: our own numbers are kept, not measured again
[ -n "$baseline_only" ] && later_call=1
if [ -n "$baseline_only" ]; then
  if [ ! -f "$bench_dir/model.json" ]; then
    echo "${baseline_only^^}_ONLY=1: no $bench_dir/model.json to compare with: run this script without it first" \
         "(same BUILD)"
    exit 1
  fi
else
  rm -f "$bench_dir"/*.json "$bench_dir"/model_*.csv "$bench_dir"/*.log
fi

# Which packages of scripts/requirements-bench.txt python3 lacks (a broken install, such
# as a torch that cannot find its CUDA libraries, counts as missing).
missing=$(python3 - <<'EOF'
import importlib
lacking = []
for name in ("torch", "transformers", "safetensors", "matplotlib", "numpy", "ml_dtypes"):
    try:
        importlib.import_module(name)
    except Exception:
        lacking.append(name)
print(" ".join(lacking))
EOF
)
has() { local m; for m in "$@"; do case " $missing " in *" $m "*) return 1 ;; esac; done; return 0; }
# needs <step> <module...>: true when python3 has them all, else says what is missing.
needs() {
  local what="$1" m lacking=()
  shift
  for m in "$@"; do has "$m" || lacking+=("$m"); done
  [ ${#lacking[@]} -eq 0 ] && return 0
  echo "$what: SKIPPED: python3 has no ${lacking[*]} (pip install -r scripts/requirements-bench.txt)"
  return 1
}
if [ -n "$missing" ]; then
  step "python3 lacks: $missing (scripts/requirements-bench.txt); the steps that need them are skipped"
  has matplotlib || echo "   without matplotlib the report has no plot and an old plot of its name is deleted"
fi

# Any checkpoint the loader reads: config.json and the weights (one file, or the index
# and every shard it lists).
checkpoint_complete() {
  local shard index="$1/model.safetensors.index.json"
  [ -s "$1/config.json" ] || return 1
  if [ -s "$index" ]; then
    for shard in $(grep -o '"model-[0-9]*-of-[0-9]*\.safetensors"' "$index" | tr -d '"' | sort -u); do
      [ -s "$1/$shard" ] || return 1
    done
    return 0
  fi
  [ -s "$1/model.safetensors" ]
}
# A complete Bielik download: what scripts/download_bielik.sh checks for (the tokenizer too).
bielik_complete() {
  [ -s "$1/tokenizer.json" ] && [ -s "$1/tokenizer_config.json" ] && checkpoint_complete "$1"
}

# 1. The checkpoint.
if [ -n "${MODEL_DIR:-}" ]; then
  model="${MODEL_DIR%/}"
  kind=given
  [ "$(realpath -m "$model")" = "$(realpath -m "$random_model")" ] && kind=random
  [ "$(realpath -m "$model")" = "$(realpath -m "$bielik_model")" ] && kind=real
elif bielik_complete "$bielik_model"; then
  model="$bielik_model"
  kind=real
else
  [ -d "$bielik_model" ] && echo "note: $bielik_model is incomplete (bash scripts/download_bielik.sh" \
    "finishes it): benchmarking the random checkpoint"
  model="$random_model"
  kind=random
fi
step "checkpoint $model ($kind)"
if ! checkpoint_complete "$model"; then
  if [ "$kind" != random ]; then
    echo "checkpoint: FAILED: $model has no complete checkpoint (config.json + model.safetensors, or" \
         "model.safetensors.index.json + its shards). Random weights are only made in $random_model."
    exit 1
  fi
  needs "random checkpoint" torch safetensors || { echo "checkpoint: FAILED"; exit 1; }
  python3 scripts/make_random_checkpoint.py --out "$model" || { echo "checkpoint: FAILED"; exit 1; }
fi

# llama.cpp's step can run: a llama-bench built before (LLAMA_BENCH) and gguf-py to write
# the GGUF, or the source to build both from.
llamacpp_ready() {
  if [ -n "${LLAMA_BENCH:-}" ]; then
    [ -d third_party/llama.cpp/gguf-py ] && return 0
    echo "bench_llamacpp: SKIPPED: LLAMA_BENCH is set but third_party/llama.cpp/gguf-py (the GGUF writer) is missing"
    return 1
  fi
  [ -f third_party/llama.cpp/CMakeLists.txt ] && return 0
  echo "bench_llamacpp: SKIPPED: no third_party/llama.cpp (bash scripts/fetch_llamacpp.sh fetches it on a machine" \
       "with network; a GPU machine without one needs it carried over)"
  return 1
}
llamacpp_args=(--model "$model" --bench-dir "$bench_dir" --work-dir "$build/llamacpp"
               --cuda-arch "${CUDA_ARCH:-native}")
[ -n "${LLAMA_BENCH:-}" ] && llamacpp_args+=(--llama-bench "$LLAMA_BENCH")

# build_ours JOBS TARGET...: configures $build and builds the targets with JOBS jobs; on
# failure shows the logs' ends and returns 1.
build_ours() {
  local jobs="$1"
  shift
  make configure BUILD="$build" CHAPTERS="$chapters" CUDA_ARCH="${CUDA_ARCH:-}" >"$bench_dir/configure.log" 2>&1 \
    && cmake --build "$build" --target "$@" -j "$jobs" >"$bench_dir/build.log" 2>&1 \
    || { tail -n 40 "$bench_dir/configure.log" "$bench_dir/build.log"; return 1; }
}

if [ "${BUILD_ONLY:-0}" = 1 ]; then
  # The first call of a split run on a fresh machine: both builds at once (neither measures
  # anything, so they may share the CPUs), then nothing else.
  step "BUILD_ONLY: bench_model, dump_logits and bench_layer_chain in $build; llama-bench and the GGUF beside them"
  half=$(( ($(nproc) + 1) / 2 ))
  build_ours "$half" bench_model dump_logits bench_layer_chain &
  ours=$!
  if [ "$run_llamacpp" = 1 ] && llamacpp_ready; then
    python3 scripts/bench_llamacpp.py "${llamacpp_args[@]}" --jobs "$half" --prepare-only \
      || { echo "llama.cpp build: FAILED"; status=1; }
  fi
  wait "$ours" || { echo "build: FAILED"; status=1; }
  step "BUILD_ONLY: done (status $status)"
  exit $status
fi

if [ "$later_call" != 1 ]; then
  # 2. Build.
  step "build bench_model in $build (CHAPTERS='$chapters')"
  build_ours "$(nproc)" bench_model || { echo "build: FAILED"; exit 1; }

  # 3. Our numbers.
  step "bench_model"
  BIELIK_BENCH_DIR="$bench_dir" "$build/chapters/08_bielik/bench_model" --model "$model" --out "$bench_dir/model.json" \
    || { echo "bench_model: FAILED"; status=1; }

  step "logits vs HF transformers (same checkpoint)"
  if needs "compare_hf_logits" torch transformers safetensors numpy; then
    cmake --build "$build" --target dump_logits -j "$(nproc)" >>"$bench_dir/build.log" 2>&1 \
      && python3 scripts/compare_hf_logits.py --model "$model" --dump-logits "$build/chapters/08_bielik/dump_logits" \
           --out "$bench_dir/hf_logits.json" \
      || { echo "compare_hf_logits: FAILED"; status=1; }
  else
    status=1
  fi

  # 3c. The step against its ceiling, on this GPU: where the decode time goes.
  if [ "${SKIP_CEILING:-0}" != 1 ]; then
    step "the decode step against its ceiling (step_vs_ceiling.py)"
    cmake --build "$build" --target bench_layer_chain -j "$(nproc)" >>"$bench_dir/build.log" 2>&1 \
      && python3 scripts/step_vs_ceiling.py --bench-model "$build/chapters/08_bielik/bench_model" \
           --bench-layer-chain "$build/chapters/08_bielik/bench_layer_chain" --model "$model" \
           --out "$bench_dir/step_vs_ceiling.json" \
      || { echo "step_vs_ceiling: FAILED"; status=1; }
  fi
fi  # not a later call (PYTORCH_ONLY, LLAMACPP_ONLY)

if [ ! -f "$bench_dir/model.json" ]; then
  # Nothing to compare a baseline with, and the report refuses without it.
  step "no model.json: no report, no PyTorch baseline (status 1)"
  publish
  exit 1
fi

if [ "$later_call" != 1 ]; then
  step "report (our numbers)"
  report
  publish
fi

# 4. The baselines.
if [ "$run_pytorch" = 0 ] && [ "$run_llamacpp" = 0 ]; then
  step "done without the baselines (status $status)"
  exit $status
fi

# 4b. llama.cpp on the same GPU (its source, or a llama-bench built before, travels with
# the tree). It runs before PyTorch: with a llama-bench built before it takes seconds where
# PyTorch takes minutes, and its result is published before PyTorch starts, so a call cut
# short by its time limit still returns it.
if [ "$run_llamacpp" = 1 ]; then
  step "llama.cpp baseline"
  if llamacpp_ready; then  # (else skipped with its reason, not failed)
    if needs "bench_llamacpp" numpy ml_dtypes; then
      python3 scripts/bench_llamacpp.py "${llamacpp_args[@]}" || { echo "bench_llamacpp: FAILED"; status=1; }
    else
      status=1
    fi
  fi
fi
# Only when llama.cpp ran in this call and PyTorch follows: otherwise the next report
# is step 3's again, or (PYTORCH_ONLY=1) the earlier call's.
if [ "$run_llamacpp" = 1 ] && [ "$run_pytorch" = 1 ] && [ -f "$bench_dir/llamacpp.json" ]; then
  step "report (with llama.cpp)"
  report
  publish
fi

# 4. PyTorch + HF transformers on the same checkpoint.
if [ "$run_pytorch" = 1 ]; then
  step "PyTorch baseline"
  compiled_flag=()
  [ "${SKIP_COMPILED:-0}" = 1 ] && compiled_flag=(--skip-compiled)
  if needs "bench_pytorch" torch transformers safetensors; then
    python3 scripts/bench_pytorch.py --model "$model" --out "$bench_dir/pytorch.json" "${compiled_flag[@]}" \
      || { echo "bench_pytorch: FAILED"; status=1; }
  else
    status=1
  fi
fi

# 5. The report with the baselines.
step "report (with the baselines)"
report

publish
step "done (status $status)"
exit $status
