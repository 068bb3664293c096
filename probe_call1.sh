#!/usr/bin/env bash
set -uo pipefail
date -u
ck=models/bielik-shaped-random/model.safetensors
if [ ! -f "$ck" ]; then (python3 scripts/make_random_checkpoint.py --out models/bielik-shaped-random > /tmp/ckpt.log 2>&1 &); fi
OUT=/tmp/g bash scripts/gpu_run.sh gpu 'NONE_MATCHES'
tail -30 /tmp/g/summary.md
grep -E "test cases|assertions|FAILED|failed" /tmp/g/ctest.log | tail -30
tar czf $OUT/gpu_tests.tgz -C /tmp g
while [ ! -f "$ck" ] || pgrep -f make_random_checkpoint >/dev/null; do sleep 2; done
date -u
bash scripts/decode_ab.sh 3 'defaults=' 'embed each step=--embed-each-step' 'graph a step=--decode-graph-steps 1' 'graph a step, embed each step=--decode-graph-steps 1 --embed-each-step' 2>&1 | tee $OUT/ab.txt
date -u
