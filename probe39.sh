#!/usr/bin/env bash
# (untracked probe, session 39) the norm weight asked for first: A/B, then chapter 08's GPU tests
set -uo pipefail
cd "$(dirname "$0")"
python3 scripts/make_random_checkpoint.py --out models/bielik-shaped-random > $OUT/ckpt.log 2>&1 &
ck=$!
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; } > $OUT/sweep.txt
make configure CHAPTERS='0[1234578]' > $OUT/build.log 2>&1
cmake --build build -j 16 --target bench_model >> $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
cmake --build build -j 16 > $OUT/build_all.log 2>&1 &
bp=$!
wait $ck
echo "bench_model+ckpt done $(date -u)" >> $OUT/sweep.txt
wait $bp; echo "build all: exit $? $(date -u)" >> $OUT/sweep.txt
bash scripts/decode_ab.sh 3 'defaults=' 'nwf qkv=--norm-weight-first qkv' 'nwf all=--norm-weight-first qkv,gate_up,lm_head' \
  'nwf gate_up lm_head=--norm-weight-first gate_up,lm_head' 'no qkv norm=--decode-skip qkv_norm' >> $OUT/sweep.txt 2>&1
date -u >> $OUT/sweep.txt
ctest --test-dir build -L gpu -R 'ch08|chat' --output-on-failure > $OUT/ctest.log 2>&1
echo "ctest exit $? $(date -u)" >> $OUT/sweep.txt
grep -E 'tests passed|Passed|Failed|assertions' $OUT/ctest.log | tail -8 >> $OUT/sweep.txt
