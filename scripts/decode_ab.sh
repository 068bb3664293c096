#!/usr/bin/env bash
# A/B decode speed of bench_model option sets on one GPU, in alternating rounds, so
# that machine drift hits every variant alike (DECODE_LOG.md's comparisons).
#
#   bash scripts/decode_ab.sh ROUNDS 'label=flags' ['label=flags' ...]
#
# e.g. bash scripts/decode_ab.sh 2 'defaults=' 'side 16 MB=--side-prefetch 16'
# Each variant runs `bench_model --decode-only <flags>` (256 tokens after 16) once a
# round. Prints one line per run, then a table: label, tokens/s of each round, median.
# A run that fails (nonzero exit, or no tokens/s line) is shown as "failed", left out of
# its median, and makes the script exit 1 after the table.
# BENCH_MODEL (default build/chapters/08_bielik/bench_model) and MODEL (default
# models/bielik-shaped-random) say what to run.
#
# A GPU machine that must build bench_model first spends ~5 minutes on it. A bench_model
# built elsewhere for that GPU alone (`make configure BUILD=build-90 CHAPTERS='0[1234578]'
# CUDA_ARCH=90 && cmake --build build-90 --target bench_model`: ~52 MB, with the same CUDA
# major version) can be copied there instead and named by BENCH_MODEL (with
# LD_LIBRARY_PATH=/usr/local/cuda/lib64 if its cuBLAS lives elsewhere); the checkpoint
# (scripts/make_random_checkpoint.py) takes ~12 s on the GPU. Only for measurements of
# code whose GPU tests have passed: the tests need their own build.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds="${1:?usage: decode_ab.sh ROUNDS 'label=flags' ...}"
shift
bench="${BENCH_MODEL:-build/chapters/08_bielik/bench_model}"
model="${MODEL:-models/bielik-shaped-random}"
declare -A rates rounds_shown
failures=0
for ((round = 1; round <= rounds; round++)); do
  for variant in "$@"; do
    label="${variant%%=*}"
    flags="${variant#*=}"
    # shellcheck disable=SC2086  # the flags are words on purpose
    output=$("$bench" --model "$model" --decode-only $flags 2>&1)
    status=$?
    line=$(grep -E "^decode only|rror" <<<"$output" | tail -1)
    rate=$(sed -n 's/.* \([0-9][0-9]*\) tokens\/s$/\1/p' <<<"$line")
    # A failed run has no speed: it is left out of the median (a 0 there would drag the
    # median down and read as a slow variant), shown as "failed", and fails the script.
    if [ $status -ne 0 ] || [ -z "$rate" ]; then
      echo "round $round | $label | failed (exit $status): ${line:-$(tail -1 <<<"$output")}"
      rounds_shown["$label"]+="failed "
      failures=$((failures + 1))
      continue
    fi
    echo "round $round | $label | $rate"
    rates["$label"]+="$rate "
    rounds_shown["$label"]+="$rate "
  done
done
echo
echo "| variant | tokens/s, each round | median of the runs that finished |"
echo "|---|---|---|"
for variant in "$@"; do
  label="${variant%%=*}"
  median=$(tr ' ' '\n' <<<"${rates[$label]:-}" | grep . | sort -n |
           awk '{a[NR]=$1} END {print (NR == 0 ? "-" : NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  echo "| $label | ${rounds_shown[$label]:-}| $median |"
done
if ((failures > 0)); then
  echo "decode_ab: $failures of $((rounds * $#)) runs failed (left out of the medians)" >&2
  exit 1
fi
