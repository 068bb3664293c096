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
  | python3 -c '
import csv, sys
rows = [r for r in csv.reader(line for line in sys.stdin if line.startswith("\""))]
head, units, data = rows[0], rows[1], rows[2:]
col = {name: i for i, name in enumerate(head)}
print(f"{\"kernel\":60s} {\"us\":>8s} {\"MB read\":>9s} {\"MB wr\":>7s} {\"DRAM %\":>7s} {\"regs\":>5s} {\"occ %\":>6s} {\"grid\":>6s} {\"block\":>6s}")
for r in data:
    name = r[col["Kernel Name"]][:60]
    t = float(r[col["gpu__time_duration.sum"]]) / (1000 if units[col["gpu__time_duration.sum"]] == "nsecond" else 1)
    def mb(k):
        scale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}[units[col[k]]]
        return float(r[col[k]].replace(",", "")) * scale
    print(f"{name:60s} {t:8.2f} {mb(\"dram__bytes_read.sum\"):9.2f} {mb(\"dram__bytes_write.sum\"):7.2f} "
          f"{float(r[col[\"dram__throughput.avg.pct_of_peak_sustained_elapsed\"]]):7.1f} {r[col[\"launch__registers_per_thread\"]]:>5s} "
          f"{float(r[col[\"sm__warps_active.avg.pct_of_peak_sustained_active\"]]):6.1f} {r[col[\"launch__grid_size\"]]:>6s} {r[col[\"launch__block_size\"]]:>6s}")
'
