"""Tests of scripts/step_vs_ceiling.py, on a machine with no GPU.

    python3 scripts/test_step_vs_ceiling.py

The parsers read the real outputs recorded from GPU runs (chapter 08's
bench_layer_chain_h100.txt and _h200.txt). The whole script runs against stand-in
programs that print made-up outputs in the real programs' formats, so the expected
numbers below are worked out by hand from those outputs, not by the code under test.
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
SCRIPT = os.path.join(SCRIPTS, "step_vs_ceiling.py")
CHAPTER = os.path.join(ROOT, "chapters", "08_bielik")
sys.path.insert(0, SCRIPTS)
import step_vs_ceiling  # noqa: E402

# bench_layer_chain's format, cut down to what the script reads, with the given step row.
CHAIN = textwrap.dedent("""\
    Made-up GPU X (sm_90, 132 SMs, 10 GiB); copy bandwidth {copy} GB/s; PDL yes
    one token reads 3.101 GB; 161 launches of 256 threads x 16 loads of 16 bytes = 64 KB a block

    ### layer_chain

    | launches a layer (a token) | us a token (median of rounds) | min / max | tokens/s | % of copy-BW floor | us a boundary beyond the bytes | check |
    |---|---|---|---|---|---|---|
    | the step's: QKV | attention | O | gate/up | down (161) | {us} | 1.0 / 2.0 | 999 | 90.0 | 0.30 | {check} |
    | attention + O in one: QKV | attention+O | gate/up | down (129) | 5.0 | 1.0 / 2.0 | 999 | 90.0 | 0.30 | ok |
    floor at this copy bandwidth: {floor} us a token = 1111 tokens/s; issue 7's target 1150 tokens/s = 869.6 us
    """)
DECODE = textwrap.dedent("""\
    bench_model: Made-up GPU X (sm_90, 132 SMs, 10 GiB), model m
    loaded in 0.6 s: C=1536 F=8960 L={layers} H=12 Hkv=2 D=128 V=32000, context 8192, PDL on
    decode only: 256 tokens after a 16-token prompt, {rate} tokens/s
    """)


def stand_in(folder, name, outputs, exits=None):
    """A program that prints outputs[i] and exits with exits[i] on its i-th call (the last, after)."""
    for i, text in enumerate(outputs):
        with open(os.path.join(folder, f"{name}.{i}.txt"), "w") as f:
            f.write(text)
    exits = exits or [0] * len(outputs)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(f"""\
            #!/usr/bin/env bash
            count_file="{folder}/{name}.count"
            i=$(cat "$count_file" 2>/dev/null || echo 0)
            echo $((i + 1)) > "$count_file"
            exits=({' '.join(str(e) for e in exits)})
            last=$(( ${{#exits[@]}} - 1 ))
            [ "$i" -gt "$last" ] && i=$last
            cat "{folder}/{name}.$i.txt"
            echo "$*" >> "{folder}/{name}.args"
            exit ${{exits[$i]}}
            """))
    os.chmod(path, 0o755)
    return path


class Parsers(unittest.TestCase):
    def read(self, name):
        with open(os.path.join(CHAPTER, name)) as f:
            return f.read()

    def test_the_h100_recording(self):
        chain = step_vs_ceiling.parse_chain(self.read("bench_layer_chain_h100.txt"), "h100")
        self.assertEqual(chain["gpu"], "NVIDIA H100 80GB HBM3")
        self.assertEqual(chain["device"], "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)")  # bench_model's words
        self.assertEqual(chain["copy_gbs"], 3016.0)
        self.assertEqual(chain["floor_us"], 1028.3)
        self.assertEqual(chain["ceiling_us"], 1063.1)

    def test_the_h200_recording(self):
        chain = step_vs_ceiling.parse_chain(self.read("bench_layer_chain_h200.txt"), "h200")
        self.assertEqual(chain["gpu"], "NVIDIA H200")
        self.assertEqual(chain["floor_us"], 738.5)
        self.assertEqual(chain["ceiling_us"], 801.5)

    def test_a_stale_read_is_refused(self):
        text = CHAIN.format(copy=3000, us=1000.0, check="stale read", floor=900.0)
        with self.assertRaisesRegex(step_vs_ceiling.ReadError, "chain A: .*stale read"):
            step_vs_ceiling.parse_chain(text, "chain A")

    def test_a_missing_row_names_what_is_missing(self):
        text = "\n".join(line for line in CHAIN.format(copy=3000, us=1000.0, check="ok", floor=900.0).splitlines()
                         if not line.startswith("| the step's"))
        with self.assertRaisesRegex(step_vs_ceiling.ReadError, "^chain B: no the step's row"):
            step_vs_ceiling.parse_chain(text, "chain B")
        with self.assertRaisesRegex(step_vs_ceiling.ReadError, "no the device line, no the floor line"):
            step_vs_ceiling.parse_chain("nothing here", "chain C")

    def test_decode(self):
        run = step_vs_ceiling.parse_decode(DECODE.format(layers=32, rate=821), "run 1")
        self.assertEqual(run, {"tokens_per_s": 821.0, "layers": 32})
        with self.assertRaisesRegex(step_vs_ceiling.ReadError, "run 2: no 'decode only"):
            step_vs_ceiling.parse_decode("loaded: L=32\n", "run 2")


class WholeScript(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.dir = self.folder.name

    def tearDown(self):
        self.folder.cleanup()

    def run_script(self, chain_outputs, decode_outputs, decode_exits=None, extra=()):
        chain = stand_in(self.dir, "chain", chain_outputs)
        decode = stand_in(self.dir, "decode", decode_outputs, decode_exits)
        return subprocess.run([sys.executable, SCRIPT, "--bench-layer-chain", chain, "--bench-model", decode,
                               "--model", "/some/model", "--rounds", "3", *extra],
                              capture_output=True, text=True)

    def test_the_step_over_its_ceiling(self):
        # Ceilings 1000 and 1002 us: 1001. Decodes 800, 810, 790 tokens/s: median 800, 1250 us.
        # Over the ceiling: 249 us a token, 249 / 32 = 7.78 us a layer. 1150 tokens/s is
        # 869.6 us, faster than the ceiling.
        out_json = os.path.join(self.dir, "out.json")
        done = self.run_script([CHAIN.format(copy=3000, us=us, check="ok", floor=900.0) for us in ("1000.0", "1002.0")],
                               [DECODE.format(layers=32, rate=r) for r in (800, 810, 790)], extra=["--out", out_json])
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("the step over its ceiling: 249.0 us a token, 7.78 us a layer", done.stdout)
        self.assertIn("| the step (median of 3 runs: 800 810 790 tokens/s) | 1250.0 | 800 | 72.0 |", done.stdout)
        self.assertIn("(before / after: 1000.0 / 1002.0) | 1001.0 | 999 | 89.9 |", done.stdout)
        self.assertIn("1150 tokens/s (869.6 us a token) is faster than the ceiling itself", done.stdout)
        with open(out_json) as f:
            numbers = json.load(f)
        self.assertAlmostEqual(numbers["step_over_ceiling_us"], 249.0)
        self.assertEqual(numbers["layers"], 32)
        self.assertEqual(numbers["device"], "Made-up GPU X (sm_90, 132 SMs, 10 GiB)")
        self.assertEqual(numbers["model"], "/some/model")
        self.assertRegex(numbers["finished_utc"], r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$")
        with open(os.path.join(self.dir, "decode.args")) as f:
            self.assertEqual(f.read().splitlines(), ["--model /some/model --decode-only"] * 3)

    def test_what_the_target_leaves(self):
        # Ceiling 800 us; 1150 tokens/s = 869.565 us leaves 69.6 us, 69.565 / 28 = 2.48 a layer.
        done = self.run_script([CHAIN.format(copy=4200, us="800.0", check="ok", floor=738.5)] * 2,
                               [DECODE.format(layers=28, rate=1000)] * 3)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("the step over its ceiling: 200.0 us a token, 7.14 us a layer", done.stdout)
        self.assertIn("leaves the step 69.6 us a token over the ceiling, 2.48 us a layer", done.stdout)

    def test_ceilings_from_two_gpus_are_refused(self):
        done = self.run_script([CHAIN.format(copy=3000, us="1000.0", check="ok", floor=900.0),
                                CHAIN.format(copy=3000, us="1000.0", check="ok", floor=900.0).replace("10 GiB", "20 GiB")],
                               [DECODE.format(layers=32, rate=800)] * 3)
        self.assertEqual(done.returncode, 1)
        self.assertIn("the two ceiling runs name different GPUs", done.stderr)

    def test_a_failed_decode_fails_the_script_and_says_which(self):
        done = self.run_script([CHAIN.format(copy=3000, us="1000.0", check="ok", floor=900.0)] * 2,
                               [DECODE.format(layers=32, rate=800), "CUDA error: out of memory\n"],
                               decode_exits=[0, 3])
        self.assertEqual(done.returncode, 1)
        self.assertIn("bench_model --decode-only, run 2: exit 3: CUDA error: out of memory", done.stderr)
        self.assertEqual(done.stdout, "")

    def test_a_missing_program_is_named(self):
        done = subprocess.run([sys.executable, SCRIPT, "--bench-layer-chain", os.path.join(self.dir, "absent")],
                              capture_output=True, text=True)
        self.assertEqual(done.returncode, 1)
        self.assertIn("bench_layer_chain (before): cannot run", done.stderr)


if __name__ == "__main__":
    unittest.main()
