#!/usr/bin/env bash
# Final verification call of this session (untracked; deleted before committing).
set -uo pipefail
B=build/chapters/08_bielik/bench_model
M=models/bielik-shaped-random
(ls $M/model.safetensors || python3 scripts/make_random_checkpoint.py --out $M) > /dev/null 2>&1 & CK=$!
bash scripts/gpu_run.sh gpu bench_kv_cache
rm -f $OUT/build.log
wait $CK
OUT=$OUT/b bash scripts/bench_all.sh > $OUT/bench_all.log 2>&1; tar -C $OUT -cf $OUT/bench_all.tar b && rm -rf $OUT/b
dec() { $B --model $M --decode-only "$@" 2>&1 | grep "decode only" | sed 's/decode only: 256 tokens after a //'; }
{
echo "p16 default: $(dec)"
for p in 128 192; do
  echo "p$p default: $(dec --prompt-tokens $p)"
  echo "p$p short-max 0: $(dec --prompt-tokens $p --short-max-keys 0)"
done
echo "== timeline"; $B --model $M --timeline 2>&1 | tail -22
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
