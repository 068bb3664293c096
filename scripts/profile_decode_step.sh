#!/usr/bin/env bash
# Nsight Compute on one decode step of the CUDA backend, kernel by kernel (GPU machine):
#
#   bash scripts/profile_decode_step.sh [model dir] [kernels]
#
# CudaModel runs one eager decode step before it captures the graph, so the first
# kernels of `dump_logits` are: the RoPE table, the embedding, then layer 0's decode
# kernels. ncu replays each one alone with cold caches (its default cache control) and
# reads time and DRAM bytes from the hardware counters; the clocks are left alone
# (--clock-control none). Prints one row per kernel: time, DRAM bytes, % of peak DRAM
# throughput, registers, achieved occupancy.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/bielik-shaped-random}"
count="${2:-12}"
build="${BUILD:-build}"
cmake --build "$build" --target dump_logits >/dev/null
ncu --clock-control none --launch-count "$count" --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
  "$build/chapters/08_bielik/dump_logits" --model "$model" --device cuda --tokens 5,6 --out /tmp/profile_logits.npy \
  | tee "${NCU_RAW:-/dev/null}" | python3 scripts/ncu_table.py
