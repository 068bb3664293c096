"""Turns `ncu --csv --page raw` output (stdin) into one line per kernel (see
scripts/profile_decode_step.sh for the metrics it expects)."""
import csv
import sys

SCALE_MB = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "B": 1e-6, "KB": 1e-3, "MB": 1.0, "GB": 1e3}
SCALE_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}


def main():
    lines = [line for line in sys.stdin if line.startswith('"')]
    if len(lines) < 3:
        print("ncu printed no kernel rows")
        sys.exit(1)
    rows = list(csv.reader(lines))
    head, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(head)}

    def value(row, name):
        return float(row[col[name]].replace(",", ""))

    print(f"{'kernel':58s} {'us':>8s} {'MB read':>8s} {'MB wr':>7s} {'GB/s':>6s} {'DRAM%':>6s} {'regs':>5s} "
          f"{'occ%':>5s} {'grid':>6s} {'block':>5s}")
    for r in data:
        us = value(r, "gpu__time_duration.sum") * SCALE_US[units[col["gpu__time_duration.sum"]]]
        read = value(r, "dram__bytes_read.sum") * SCALE_MB[units[col["dram__bytes_read.sum"]]]
        written = value(r, "dram__bytes_write.sum") * SCALE_MB[units[col["dram__bytes_write.sum"]]]
        print(f"{r[col['Kernel Name']][:58]:58s} {us:8.2f} {read:8.2f} {written:7.2f} {(read + written) / us * 1e3:6.0f} "
              f"{value(r, 'dram__throughput.avg.pct_of_peak_sustained_elapsed'):6.1f} "
              f"{r[col['launch__registers_per_thread']]:>5s} "
              f"{value(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f} "
              f"{r[col['launch__grid_size']]:>6s} {r[col['launch__block_size']]:>5s}")


if __name__ == "__main__":
    main()
