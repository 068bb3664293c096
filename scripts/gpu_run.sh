#!/usr/bin/env bash
# One call on a GPU machine: describe the machine, build everything, run every test
# (GPU tests included) and every benchmark, and write a summary.
#
#   [CHAPTERS=regex] bash scripts/gpu_run.sh [ctest-label-regex] [bench-name-regex]
#
# CHAPTERS limits the build to matching chapter folders (Makefile variable), e.g.
# CHAPTERS='0[45]' builds common/, chapter 04 and chapter 05 only.
# Output goes to $OUT (the device tool's result folder) or build/gpu_run/ otherwise:
# summary.md (machine, test summary, benchmark tables), build.log, ctest.log, bench.log
# and bench_outputs.tar (each bench program's output and CSV tables).
set -uo pipefail
cd "$(dirname "$0")/.."
# This is the GPU machine: a GPU test that finds no CUDA device fails here instead of
# exiting 77 ("skipped"), so a run whose GPU went missing cannot pass with nothing run.
export BIELIK_REQUIRE_GPU=1
labels="${1:-.}"
benches="${2:-.}"
out="${OUT:-build/gpu_run}"
mkdir -p "$out"
summary="$out/summary.md"

{
  echo "# GPU run $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  nvcc --version | tail -1
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed files"
  echo '```'
} >"$summary"

start=$(date +%s)
make build JOBS="$(nproc)" CHAPTERS="${CHAPTERS:-}" >"$out/build.log" 2>&1
build_status=$?
echo "build: exit $build_status in $(( $(date +%s) - start )) s" | tee -a "$summary"
if [ $build_status -ne 0 ]; then
  tail -60 "$out/build.log"
  exit 1
fi

ctest --test-dir build --output-on-failure -L "$labels" -j 4 >"$out/ctest.log" 2>&1
test_status=$?
{
  echo
  echo "## Tests (ctest -L '$labels'), exit $test_status"
  echo '```'
  grep -E "tests passed|tests failed|Skipped|\*\*\*Failed|Not Run|Passed|Exception" "$out/ctest.log" | head -60
  echo '```'
} >>"$summary"

mkdir -p build/bench
echo >>"$summary"
echo "## Benchmarks" >>"$summary"
# bench_model needs a checkpoint and has its own script (scripts/bench_all.sh).
# Each program's output goes into one archive: the device tool returns at most 8 files.
mkdir -p build/gpu_run_bench
for program in $(find build -maxdepth 3 -type f -name 'bench_*' ! -name bench_model -perm -u+x | sort); do
  name=$(basename "$program")
  [[ "$name" =~ $benches ]] || continue
  echo "== $name" >>"$out/bench.log"
  BIELIK_BENCH_DIR=build/bench timeout 300 "$program" >"build/gpu_run_bench/$name.txt" 2>&1
  echo "bench $name: exit $?" >>"$out/bench.log"
  cat "build/gpu_run_bench/$name.txt" >>"$summary"
done
tar -C build -cf "$out/bench_outputs.tar" gpu_run_bench bench 2>/dev/null
cat "$summary"
[ $test_status -eq 0 ]
