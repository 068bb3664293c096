#!/usr/bin/env bash
# `make fuzz`: the loaders (safetensors, a sharded checkpoint's index, config.json,
# tokenizer_config.json's chat template, tokenizer.json, the tokenizer itself) and the
# CPU sampler under libFuzzer with AddressSanitizer and UBSan, each target for
# FUZZ_SECONDS (default 60) starting from its seeds in tests/fuzz/corpus/<target>/.
#
# Needs clang with libFuzzer (Debian: clang, libclang-rt-dev); CPU only. New inputs go to
# build-fuzz/corpus/<target>/, a failing input to build-fuzz/crashes/. To keep a failing
# input as a regression case, fix the bug, copy the input into the target's seed
# directory and delete it from build-fuzz/crashes/ (the script fails while any is
# there, and when a fuzzer exits nonzero without leaving one): `make test` replays
# every seed (test_fuzz_corpus_*), built with the normal compiler, so it is checked
# from then on even where clang is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
only=${FUZZ_ONLY:-.}  # a regex: run only the targets it matches (FUZZ_ONLY=config)
out=${FUZZ_BUILD:-build-fuzz}
cxx=${FUZZ_CXX:-clang++}
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found (apt-get install clang libclang-rt-dev, or set FUZZ_CXX)" >&2
  exit 2
fi
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -I chapters/08_bielik -I tests/fuzz -DBIELIK_SOURCE_DIR="\"$PWD\"")
mkdir -p "$out/obj" "$out/crashes"

# The loader and sampler sources, once, instrumented for coverage but without libFuzzer's main.
objects=()
for source in safetensors model_config utf8 pretokenizer tokenizer_bpe tokenizer chat_template sampler; do
  object="$out/obj/$source.o"
  if [[ ! -f $object || chapters/08_bielik/$source.cpp -nt $object ||
        -n $(find chapters/08_bielik \( -name '*.hpp' -o -name '*.inc' \) -newer "$object" -print -quit) ]]; then
    echo "fuzz: compiling $source.cpp"
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "chapters/08_bielik/$source.cpp" -o "$object"
  fi
  objects+=("$object")
done

build() {  # build <target>
  [[ $1 =~ $only ]] || return 0
  echo "fuzz: building $1"
  "$cxx" "${flags[@]}" -fsanitize=fuzzer "tests/fuzz/$1.cpp" "${objects[@]}" -o "$out/$1"
}

failed_runs=()
run() {  # run <target> <seed dir> [VAR=value ...]: FUZZ_SECONDS of fuzzing
  local target=$1 seeds=$2 status=0
  shift 2
  [[ $target =~ $only ]] || return 0
  mkdir -p "$out/corpus/$target"
  echo "fuzz: $target for ${seconds}s ${*:-}"
  # grep finding none of its lines is no failure; the fuzzer's own exit status is: one that
  # fails without leaving a crash file (it cannot start, a bad option or environment, a
  # fuzz check in its initialization) would otherwise pass unnoticed.
  env "$@" "$out/$target" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$out/crashes/$target-" "$out/corpus/$target" "$seeds" 2>&1 |
    grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|.*fuzz check failed|SUMMARY)' ||
    status=${PIPESTATUS[0]}
  if ((status != 0)); then
    echo "fuzz: $target ${*:-} exited with status $status" >&2
    failed_runs+=("$target ${*:-}(exit $status)")
  fi
}

targets=(fuzz_safetensors fuzz_checkpoint_index fuzz_model_config fuzz_chat_template fuzz_tokenizer_json
         fuzz_tokenizer_text fuzz_tokenizer_ids fuzz_sampler)
for target in "${targets[@]}"; do
  build "$target"
done

corpus=tests/fuzz/corpus
run fuzz_safetensors "$corpus/safetensors"
run fuzz_checkpoint_index "$corpus/checkpoint_index"
run fuzz_model_config "$corpus/model_config"
run fuzz_chat_template "$corpus/chat_template"
run fuzz_tokenizer_json "$corpus/tokenizer_json"
run fuzz_sampler "$corpus/sampler"
smollm2=models/smollm2-135m-instruct/tokenizer.json
for tokenizer in "$corpus/tokenizer_json/bytelevel.json" "$corpus/tokenizer_json/metaspace.json" "$smollm2"; do
  [[ -f $tokenizer ]] || { echo "fuzz: $tokenizer absent (make models), skipped"; continue; }
  round_trip=0
  [[ $tokenizer == *metaspace* ]] || round_trip=1  # byte-level: nothing normalized away
  run fuzz_tokenizer_text "$corpus/tokenizer_text" BIELIK_FUZZ_TOKENIZER="$tokenizer" BIELIK_FUZZ_ROUND_TRIP=$round_trip
  run fuzz_tokenizer_ids "$corpus/tokenizer_ids" BIELIK_FUZZ_TOKENIZER="$tokenizer"
done

crashes=$(find "$out/crashes" -type f | wc -l)
if ((crashes > 0)); then
  echo "fuzz: $crashes failing inputs in $out/crashes/" >&2
  ls "$out/crashes" >&2
fi
if ((${#failed_runs[@]} > 0)); then
  echo "fuzz: ${#failed_runs[@]} fuzzer runs failed:" >&2
  printf '  %s\n' "${failed_runs[@]}" >&2
fi
if ((crashes > 0 || ${#failed_runs[@]} > 0)); then
  exit 1
fi
echo "fuzz: no failing input"
