"""Tests of scripts/bench_llamacpp.py without a GPU or a llama.cpp build.

    python3 scripts/test_bench_llamacpp.py      (ctest: test_bench_llamacpp_script)

llama-bench is replaced by stand-in programs that print what llama-bench prints with
`-o json` (the fields bench_llamacpp.py reads, with round numbers) or fail, so the
medians, tokens/s and the file it writes are worked out by hand below, and a failed or
unreadable benchmark must stop with the reason instead of writing llamacpp.json.
"""
import contextlib
import io
import json
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_llamacpp  # noqa: E402


def entry(n_prompt, n_gen, samples_ns, n_depth=0):
    return {"build_commit": "0c1e570", "gpu_info": "NVIDIA H200", "model_type": "llama 1B F16",
            "n_gpu_layers": 99, "flash_attn": "on", "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth,
            "samples_ns": samples_ns}


# Prefill medians: 16 tokens 2 ms (of 3, 2, 1 ms: the middle value, not the mean of the
# first), 512 tokens 10 ms. Decode: 256 tokens in 512 ms (median of 510, 512, 600 ms):
# 500 tokens/s, 2 ms a token.
PREFILL = [entry(16, 0, [3_000_000, 2_000_000, 1_000_000]), entry(512, 0, [10_000_000, 11_000_000, 9_000_000])]
DECODE = [entry(0, 256, [510_000_000, 512_000_000, 600_000_000], n_depth=16)]


class SummarizeTest(unittest.TestCase):
    def test_medians_and_rates(self):
        result = bench_llamacpp.summarize(PREFILL, DECODE, "models/x", 3, "llama.cpp vendored by y")
        self.assertEqual(result["device"], "NVIDIA H200")
        self.assertEqual(result["model"], "models/x")
        self.assertEqual(result["build_commit"], "0c1e570")
        self.assertEqual(result["prefill_ms"], {"16": 2.0, "512": 10.0})
        self.assertAlmostEqual(result["decode_tok_s"], 500.0)
        self.assertAlmostEqual(result["decode_ms_per_token"], 2.0)
        self.assertEqual((result["decode_tokens"], result["decode_depth"], result["reps"]), (256, 16, 3))
        self.assertEqual(result["source"], "llama.cpp vendored by y")
        self.assertEqual(result["samples_ns"]["tg256@d16"], DECODE[0]["samples_ns"])

    def test_first_gpu_of_several(self):
        two = [dict(e, gpu_info="NVIDIA H100 80GB HBM3, NVIDIA H100 80GB HBM3") for e in PREFILL]
        self.assertEqual(bench_llamacpp.summarize(two, DECODE, "m", 3)["device"], "NVIDIA H100 80GB HBM3")

    def test_missing_parts_are_refused(self):
        for prefill, decode, words in ((PREFILL, [], "no generation test"), ([], [], "no tests"),
                                       ([entry(16, 0, [])], DECODE, "has no samples")):
            stderr = io.StringIO()
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(stderr):
                bench_llamacpp.summarize(prefill, decode, "m", 3)
            self.assertIn(words, stderr.getvalue())


class RunBenchTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def stand_in(self, body):
        path = os.path.join(self.tmp.name, "llama-bench")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body + "\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def test_its_json_is_read_and_kept(self):
        args_file = os.path.join(self.tmp.name, "args")
        binary = self.stand_in(f"echo \"$@\" > {args_file}\ncat <<'EOF'\n{json.dumps(DECODE)}\nEOF")
        raw = os.path.join(self.tmp.name, "raw.json")
        with contextlib.redirect_stdout(io.StringIO()):
            runs = bench_llamacpp.run_bench(binary, "model.gguf", ["-p", "0", "-n", "256", "-d", "16"], 5, raw)
        self.assertEqual(runs, DECODE)
        with open(raw) as f:
            self.assertEqual(json.load(f), DECODE)
        with open(args_file) as f:
            args = f.read().split()
        # Every layer on the GPU, flash attention on, the repetitions and JSON asked for.
        for flag, value in (("-m", "model.gguf"), ("-ngl", "99"), ("-fa", "on"), ("-r", "5"), ("-o", "json"),
                            ("-n", "256"), ("-d", "16")):
            self.assertEqual(args[args.index(flag) + 1], value, flag)

    def test_failure_and_garbage_stop_with_the_reason(self):
        for body, words in (("echo 'CUDA error: out of memory' >&2; exit 3", "exited with 3"),
                            ("echo 'not json'", "not JSON")):
            binary = self.stand_in(body)
            stderr = io.StringIO()
            with self.assertRaises(SystemExit), contextlib.redirect_stderr(stderr), \
                    contextlib.redirect_stdout(io.StringIO()):
                bench_llamacpp.run_bench(binary, "m.gguf", [], 5, os.path.join(self.tmp.name, "raw.json"))
            self.assertIn(words, stderr.getvalue())
            if "exited" in words:
                self.assertIn("out of memory", stderr.getvalue())

    def test_no_source_is_named(self):
        stderr = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(stderr):
            bench_llamacpp.build(os.path.join(self.tmp.name, "nowhere"), os.path.join(self.tmp.name, "b"), "90", 2)
        self.assertIn("fetch_llamacpp.sh", stderr.getvalue())


class MainTest(unittest.TestCase):
    """main()'s choices between building llama-bench and using one built before."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bench_dir = os.path.join(self.tmp.name, "bench")
        self.calls = []
        saved = {name: getattr(bench_llamacpp, name) for name in ("build", "convert", "run_bench", "pack")}
        self.addCleanup(lambda: [setattr(bench_llamacpp, n, f) for n, f in saved.items()])
        bench_llamacpp.build = lambda *a: self.calls.append("build") or "built/bin/llama-bench"
        bench_llamacpp.convert = lambda *a: self.calls.append("convert")
        bench_llamacpp.pack = lambda binary, packed: self.calls.append(("pack", binary)) or packed
        bench_llamacpp.run_bench = lambda binary, gguf, extra, reps, raw: (
            self.calls.append(("run", binary)) or (DECODE if "-d" in extra else PREFILL))

    def tearDown(self):
        self.tmp.cleanup()

    def main(self, *args):
        out, err = io.StringIO(), io.StringIO()
        code = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = bench_llamacpp.main(list(args))
            except SystemExit as e:
                code = e.code
        return code, out.getvalue(), err.getvalue()

    def executable(self, name="llama-bench", mode=0o755):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(path, mode)
        return path

    def test_a_binary_built_before_is_measured_without_a_build(self):
        binary = self.executable()
        code, _, err = self.main("--model", "models/x", "--bench-dir", self.bench_dir, "--llama-bench", binary)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.calls, ["convert", ("run", binary), ("run", binary)])
        with open(os.path.join(self.bench_dir, "llamacpp.json")) as f:
            result = json.load(f)
        self.assertTrue(result["source"].endswith("; llama-bench built before this run"), result["source"])
        self.assertAlmostEqual(result["decode_tok_s"], 500.0)

    def test_without_one_it_is_built_here(self):
        code, _, err = self.main("--model", "models/x", "--bench-dir", self.bench_dir)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.calls[:2], ["build", "convert"])
        with open(os.path.join(self.bench_dir, "llamacpp.json")) as f:
            self.assertTrue(json.load(f)["source"].endswith("; llama-bench built in this run"))

    def test_build_only_needs_no_checkpoint_and_measures_nothing(self):
        work = os.path.join(self.tmp.name, "work")
        code, out, err = self.main("--build-only", "--bench-dir", self.bench_dir, "--work-dir", work)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.calls, ["build", ("pack", "built/bin/llama-bench")])
        self.assertEqual(out.strip().splitlines()[-1], os.path.join(work, "llama-bench.xz"))
        self.assertFalse(os.path.exists(os.path.join(self.bench_dir, "llamacpp.json")))

    def test_wrong_arguments_are_refused_before_anything_runs(self):
        missing = os.path.join(self.tmp.name, "nowhere", "llama-bench")
        for args, words in (
                (("--build-only", "--llama-bench", self.executable()), "pass one of them"),
                (("--bench-dir", self.bench_dir), "--model is required"),
                (("--model", "m", "--llama-bench", missing), f"--llama-bench {missing}: no such file"),
                (("--model", "m", "--llama-bench", self.executable("plain", 0o644)), "not executable")):
            code, _, err = self.main(*args)
            self.assertNotEqual(code, 0, args)
            self.assertIn(words, err, args)
            self.assertEqual(self.calls, [], args)
            self.assertFalse(os.path.exists(os.path.join(self.bench_dir, "llamacpp.json")))



class PackTest(unittest.TestCase):
    """--build-only's llama-bench.xz, unpacked by --llama-bench on the GPU machine."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.binary = os.path.join(self.tmp.name, "llama-bench")
        # Not an ELF file, so strip refuses it and it is packed as it is: the bytes must
        # come back unchanged. os.urandom makes the compressed form's every byte matter.
        self.content = b"#!/bin/sh\necho stand-in\n#" + os.urandom(100_000)
        with open(self.binary, "wb") as f:
            f.write(self.content)
        with contextlib.redirect_stdout(io.StringIO()):
            self.packed = bench_llamacpp.pack(self.binary, os.path.join(self.tmp.name, "llama-bench.xz"))

    def tearDown(self):
        self.tmp.cleanup()

    def test_unpacked_binary_is_the_packed_one_and_runs(self):
        work = os.path.join(self.tmp.name, "work")
        with contextlib.redirect_stdout(io.StringIO()):
            unpacked = bench_llamacpp.prebuilt(self.packed, work)
        self.assertEqual(os.path.dirname(unpacked), work)
        with open(unpacked, "rb") as f:
            self.assertEqual(f.read(), self.content)
        self.assertTrue(os.access(unpacked, os.X_OK))
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["llama-bench", "llama-bench.xz", "work"])

    def test_a_truncated_pack_is_refused_and_leaves_nothing(self):
        with open(self.packed, "rb") as f:
            data = f.read()
        with open(self.packed, "wb") as f:
            f.write(data[: len(data) // 2])
        work = os.path.join(self.tmp.name, "work")
        stderr = io.StringIO()
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(stderr), \
                contextlib.redirect_stdout(io.StringIO()):
            bench_llamacpp.prebuilt(self.packed, work)
        self.assertIn(f"--llama-bench {self.packed}: not a complete xz file", stderr.getvalue())
        self.assertEqual(os.listdir(work), [])


if __name__ == "__main__":
    unittest.main()
