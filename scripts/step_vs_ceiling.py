#!/usr/bin/env python3
"""The decode step against the ceiling of its launch shape, measured on one machine.

    python3 scripts/step_vs_ceiling.py [--bench-model PATH] [--bench-layer-chain PATH]
        [--model DIR] [--rounds 5] [--target 1150] [--out FILE.json]

`bench_layer_chain` runs the step's 161 launches a token with nothing in them but their
weight reads (the ceiling of that shape, chapter 08's README); `bench_model --decode-only`
runs the real step (256 tokens after a 16-token prompt). This script runs the ceiling,
then the step `--rounds` times, then the ceiling again, all on the same GPU, and prints:

* the copy-bandwidth floor, the ceiling (before / after) and the step, in us a token;
* what the step costs over the ceiling, a token and a layer: its kernels' work after their
  PDL waits, which the ceiling leaves out (DECODE_LOG.md, thirty-seventh and fifty-ninth
  sessions);
* how much of that a target speed (issue 7's 1150 tokens/s) would leave.

Why one machine: the ceiling and the step move together with the machine (shared
hardware), and only their difference on one machine says how far the step is from what
its shape allows. Exit status 1 when a program fails or prints something this script
cannot read (it names which); nothing is averaged over a failed run.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The ceiling's row: the step's five launches a layer, each only reading its weights.
STEP_ROW_PREFIX = "| the step's: QKV | attention | O | gate/up | down ("
FLOOR_LINE = re.compile(r"floor at this copy bandwidth: ([0-9.]+) us a token")
DEVICE_LINE = re.compile(r"^((.+?) \(sm_\d+, [^;]*\)); copy bandwidth ([0-9.]+) GB/s", re.MULTILINE)
DECODE_LINE = re.compile(r"^decode only: (\d+) tokens after a (\d+)-token prompt, ([0-9.]+) tokens/s$", re.MULTILINE)
LAYERS_FIELD = re.compile(r"\bL=(\d+)\b")


class ReadError(Exception):
    """A program's output that does not hold what this script reads from it."""


def parse_chain(text, source):
    """The ceiling from one bench_layer_chain output: its GPU, copy GB/s, floor and step row (us a token)."""
    device = DEVICE_LINE.search(text)
    floor = FLOOR_LINE.search(text)
    rows = [line for line in text.splitlines() if line.startswith(STEP_ROW_PREFIX)]
    if not device or not floor or not rows:
        missing = [name for name, found in (("the device line", device), ("the floor line", floor),
                                            ("the step's row", rows)) if not found]
        raise ReadError(f"{source}: no {', no '.join(missing)} in its output")
    # The row's name holds '|' itself, so its cells are counted from the right:
    # ... | us a token | min / max | tokens/s | % of floor | us a boundary | check |
    cells = [cell.strip() for cell in rows[0].strip().strip("|").split("|")]
    if cells[-1] != "ok":
        raise ReadError(f"{source}: the step's row says '{cells[-1]}' (a stale read: its numbers mean nothing)")
    try:
        step_us = float(cells[-6])
    except ValueError:
        raise ReadError(f"{source}: the step's row has no number where its us a token belong: {rows[0]!r}")
    # "device" in bench_model's words ('NVIDIA H200 (sm_90, 132 SMs, 139 GiB)'), so that
    # make_bench_report.py can tell whether these numbers are from model.json's GPU.
    return {"device": device.group(1).strip(), "gpu": device.group(2).strip(), "copy_gbs": float(device.group(3)),
            "floor_us": float(floor.group(1)), "ceiling_us": step_us}


def parse_decode(text, source):
    """One bench_model --decode-only run: its tokens/s and the model's layer count."""
    decode = DECODE_LINE.search(text)
    layers = LAYERS_FIELD.search(text)
    if not decode or not layers:
        missing = [name for name, found in (("'decode only: ...' line", decode), ("layer count (L=)", layers))
                   if not found]
        raise ReadError(f"{source}: no {', no '.join(missing)} in its output")
    return {"tokens_per_s": float(decode.group(3)), "layers": int(layers.group(1))}


def summarize(ceilings, decodes, target_tokens_per_s):
    """The numbers the table prints, from parsed runs (two ceilings, one or more decodes)."""
    devices = {c["device"] for c in ceilings}
    if len(devices) != 1:
        raise ReadError(f"the two ceiling runs name different GPUs: {sorted(devices)}")
    layers = {d["layers"] for d in decodes}
    if len(layers) != 1:
        raise ReadError(f"the decode runs name different layer counts: {sorted(layers)}")
    n_layers = layers.pop()
    ceiling_us = statistics.fmean(c["ceiling_us"] for c in ceilings)
    floor_us = statistics.fmean(c["floor_us"] for c in ceilings)
    step_tokens_per_s = statistics.median(d["tokens_per_s"] for d in decodes)
    step_us = 1e6 / step_tokens_per_s
    over_us = step_us - ceiling_us
    target_us = 1e6 / target_tokens_per_s
    return {
        "device": devices.pop(),
        "gpu": ceilings[0]["gpu"],
        "copy_gbs": statistics.fmean(c["copy_gbs"] for c in ceilings),
        "layers": n_layers,
        "floor_us": floor_us,
        "ceiling_us_each": [c["ceiling_us"] for c in ceilings],
        "ceiling_us": ceiling_us,
        "step_tokens_per_s_each": [d["tokens_per_s"] for d in decodes],
        "step_tokens_per_s": step_tokens_per_s,
        "step_us": step_us,
        "step_over_ceiling_us": over_us,
        "step_over_ceiling_us_a_layer": over_us / n_layers,
        "target_tokens_per_s": target_tokens_per_s,
        "target_us": target_us,
        # What the target leaves the step's work over the ceiling (negative: the ceiling
        # alone is slower than the target).
        "target_leaves_us": target_us - ceiling_us,
        "target_leaves_us_a_layer": (target_us - ceiling_us) / n_layers,
    }


def format_report(s):
    def pct(us):
        return f"{100.0 * s['floor_us'] / us:.1f}"

    ceilings = " / ".join(f"{us:.1f}" for us in s["ceiling_us_each"])
    rounds = " ".join(f"{r:.0f}" for r in s["step_tokens_per_s_each"])
    lines = [
        f"{s['gpu']}, copy bandwidth {s['copy_gbs']:.0f} GB/s, {s['layers']} layers",
        "",
        "| | us a token | tokens/s | % of the copy floor |",
        "|---|---|---|---|",
        f"| the copy floor (the weights once) | {s['floor_us']:.1f} | {1e6 / s['floor_us']:.0f} | 100.0 |",
        f"| the ceiling: the step's launches, only their reads (before / after: {ceilings}) | "
        f"{s['ceiling_us']:.1f} | {1e6 / s['ceiling_us']:.0f} | {pct(s['ceiling_us'])} |",
        f"| the step (median of {len(s['step_tokens_per_s_each'])} runs: {rounds} tokens/s) | "
        f"{s['step_us']:.1f} | {s['step_tokens_per_s']:.0f} | {pct(s['step_us'])} |",
        "",
        f"the step over its ceiling: {s['step_over_ceiling_us']:.1f} us a token, "
        f"{s['step_over_ceiling_us_a_layer']:.2f} us a layer",
    ]
    if s["target_leaves_us"] > 0:
        lines.append(f"{s['target_tokens_per_s']:.0f} tokens/s ({s['target_us']:.1f} us a token) leaves the step "
                     f"{s['target_leaves_us']:.1f} us a token over the ceiling, "
                     f"{s['target_leaves_us_a_layer']:.2f} us a layer")
    else:
        lines.append(f"{s['target_tokens_per_s']:.0f} tokens/s ({s['target_us']:.1f} us a token) is faster than "
                     f"the ceiling itself on this GPU: no schedule of these launches reaches it")
    return "\n".join(lines)


def run(command, source):
    """A program's stdout and stderr; a failure raises ReadError naming it."""
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise ReadError(f"{source}: cannot run {command[0]}: {error.strerror}")
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["(no output)"]
        raise ReadError(f"{source}: exit {done.returncode}: {tail[0]}")
    return done.stdout + done.stderr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    build = os.path.join(ROOT, "build", "chapters", "08_bielik")
    parser.add_argument("--bench-model", default=os.path.join(build, "bench_model"))
    parser.add_argument("--bench-layer-chain", default=os.path.join(build, "bench_layer_chain"))
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "bielik-shaped-random"))
    parser.add_argument("--rounds", type=int, default=5, help="decode runs between the two ceilings")
    parser.add_argument("--target", type=float, default=1150.0, help="tokens/s (issue 7's, on the H200)")
    parser.add_argument("--out", help="also write the numbers here as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.target <= 0:
        parser.error("--rounds must be at least 1 and --target positive")
    try:
        ceilings = [parse_chain(run([args.bench_layer_chain], "bench_layer_chain (before)"),
                                "bench_layer_chain (before)")]
        decodes = []
        for round_ in range(1, args.rounds + 1):
            source = f"bench_model --decode-only, run {round_}"
            decodes.append(parse_decode(run([args.bench_model, "--model", args.model, "--decode-only"], source),
                                        source))
        ceilings.append(parse_chain(run([args.bench_layer_chain], "bench_layer_chain (after)"),
                                    "bench_layer_chain (after)"))
        summary = summarize(ceilings, decodes, args.target)
    except ReadError as error:
        print(f"step_vs_ceiling: {error}", file=sys.stderr)
        return 1
    print(format_report(summary))
    # The checkpoint and the time, as bench_model's model.json records them, for the report.
    summary["model"] = args.model
    summary["finished_utc"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.out:
        with open(args.out, "w") as out:
            json.dump(summary, out, indent=2)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
