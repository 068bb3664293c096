"""Tests of scripts/make_bench_report.py on synthetic benchmark outputs (no GPU needed).

    python3 scripts/test_make_bench_report.py

The fixtures follow the writers' schemas (bench_model.cu's JSON at the end of its main,
scripts/bench_pytorch.py, scripts/compare_hf_logits.py) with round numbers, so every
expected figure below is worked out by hand. matplotlib is replaced by a stand-in that
writes a small file (present) or by an import that fails (missing), so both paths run
whether or not matplotlib is installed.
"""
import contextlib
import io
import json
import os
import sys
import tempfile
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_bench_report  # noqa: E402

DEVICE = "NVIDIA H200 (sm_90, 132 SMs, 139 GiB)"
CHECKPOINT = "models/bielik-shaped-random"


def model_json():
    return {"device": DEVICE, "model": CHECKPOINT, "weights_gb": 3.2, "kv_cache_gb": 0.3, "copy_gbs": 4000.0,
            "floor_ms": 0.8, "ttft_ms": {"16": 2.0, "128": 2.5, "512": 4.0, "2048": 12.0},
            "ttft_eager_ms": {"16": 2.1, "128": 2.6, "512": 4.2, "2048": 12.5}, "decode_tokens": 256,
            "decode_tok_s": 1000.0, "decode_ms_per_token": 1.0, "decode_gbs": 3200.0, "decode_pct_copy": 80.0, "peak_memory_gb": 3.7,
            "breakdown": [{"kernel": "gate_up_swiglu", "us": 600.0, "gbs": 2500.0},
                          {"kernel": "argmax", "us": 400.0}]}


def pytorch_json(**changes):
    result = {"device": "NVIDIA H200", "model": CHECKPOINT, "torch": "2.11.0", "transformers": "5.17.0",
              "prefill_runs": 7, "prefill_last_logits": "prefill with logits_to_keep=1", "decode_prompt_tokens": 16,
              "decode_tokens": 256, "decode_runs": 5,
              "prefill_ms": {"16": 20.0, "128": 20.0, "512": 24.0, "2048": 30.0},
              "decode_eager_tok_s": 40.0, "decode_compiled_tok_s": 250.0}
    result.update(changes)
    return result


def logits_json(**changes):
    result = {"model": CHECKPOINT, "tokens": 64, "device": "NVIDIA H200",
              "ours_vs_fp32": {"max": 0.035, "mean": 0.02, "first_position": 0.01, "last_position": 0.03},
              "hf_bf16_vs_fp32": {"max": 0.038, "mean": 0.021, "first_position": 0.01, "last_position": 0.03},
              "ours_vs_hf_bf16": {"max": 0.05, "mean": 0.03, "first_position": 0.02, "last_position": 0.04},
              "top1_agreement_ours_vs_fp32": 0.984375, "top1_agreement_hf_bf16_vs_fp32": 0.96875,
              "top1_agreement_ours_vs_hf_bf16": 0.953125,
              "rule": "ours_vs_fp32 <= max(tolerance, 1.25 * hf_bf16_vs_fp32) at every position",
              "tolerance": 0.02, "passed": True}
    result.update(changes)
    return result


def llamacpp_json(**changes):
    """bench_llamacpp.py's output: 500 tokens/s (1000 / 500 = 2.00x), prefill 16 ms at 512
    tokens (16 / 4 = 4.00x)."""
    result = {"engine": "llama.cpp", "device": "NVIDIA H200", "model": CHECKPOINT, "build_commit": "0c1e570",
              "source": "llama.cpp vendored by llama-cpp-python==0.3.36", "weights": "f16", "flash_attn": "on",
              "n_gpu_layers": 99, "decode_tokens": 256, "decode_depth": 16, "decode_tok_s": 500.0,
              "decode_ms_per_token": 2.0, "prefill_ms": {"16": 4.0, "128": 8.0, "512": 16.0, "2048": 60.0},
              "reps": 5}
    result.update(changes)
    return result


def ceiling_json(**changes):
    """step_vs_ceiling.py's output, worked out by hand: ceilings 800 and 802 us (801), the
    step's runs 990, 1000, 1010 tokens/s (median 1000: 1000 us), 199 us over the ceiling,
    199 / 32 = 6.21875 a layer; 1150 tokens/s = 869.565 us leaves 68.565, 2.1427 a layer."""
    result = {"device": DEVICE, "gpu": "NVIDIA H200", "model": CHECKPOINT, "copy_gbs": 4200.0, "layers": 32,
              "floor_us": 740.0, "ceiling_us_each": [800.0, 802.0], "ceiling_us": 801.0,
              "step_tokens_per_s_each": [990.0, 1000.0, 1010.0], "step_tokens_per_s": 1000.0, "step_us": 1000.0,
              "step_over_ceiling_us": 199.0, "step_over_ceiling_us_a_layer": 6.21875,
              "target_tokens_per_s": 1150.0, "target_us": 869.565, "target_leaves_us": 68.565,
              "target_leaves_us_a_layer": 2.1427, "finished_utc": "2026-12-06 08:00 UTC"}
    result.update(changes)
    return result


def bar_names(modules):
    """The decode panel's bar labels that a fake_matplotlib() stand-in was given."""
    left_panel = modules["matplotlib.pyplot"].subplots.return_value[1][0]
    return list(left_panel.bar.call_args[0][0])


def fake_matplotlib():
    """A stand-in whose savefig writes a few bytes: enough to see the plot path run."""
    figure = mock.MagicMock()
    figure.savefig.side_effect = lambda path, **kwargs: open(path, "wb").write(b"fake png")
    pyplot = mock.MagicMock()
    pyplot.subplots.return_value = (figure, (mock.MagicMock(), mock.MagicMock()))
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = lambda backend: None
    matplotlib.pyplot = pyplot
    return {"matplotlib": matplotlib, "matplotlib.pyplot": pyplot}


NO_MATPLOTLIB = {"matplotlib": None, "matplotlib.pyplot": None}  # `import matplotlib` raises ImportError


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.bench = os.path.join(self.tmp.name, "bench")
        self.docs = os.path.join(self.tmp.name, "docs")
        os.makedirs(self.bench)
        os.makedirs(self.docs)
        # What an earlier run left in docs/: must be replaced, or kept when nothing is written.
        for name, text in (("benchmarks.md", "OLD REPORT\n"), ("benchmarks.png", "OLD PLOT")):
            with open(os.path.join(self.docs, name), "w") as f:
                f.write(text)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, content):
        with open(os.path.join(self.bench, name), "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))

    def run_report(self, modules, *extra):
        stderr = io.StringIO()
        with mock.patch.dict(sys.modules, modules), contextlib.redirect_stderr(stderr), \
                contextlib.redirect_stdout(io.StringIO()):
            code = make_bench_report.main(["--bench-dir", self.bench, "--out", self.docs, *extra])
        return code, stderr.getvalue()

    def read(self, name):
        with open(os.path.join(self.docs, name)) as f:
            return f.read()

    def test_normal_report(self):
        self.write("model.json", model_json())
        self.write("pytorch.json", pytorch_json())
        self.write("hf_logits.json", logits_json())
        self.write("step_vs_ceiling.json", ceiling_json())
        self.write("llamacpp.json", llamacpp_json())
        self.write("model_decode.csv", "decode path,tokens/s\ngraph,1000\n")
        self.write("rmsnorm.csv", "version,GB/s\nv1,123456\n")  # a chapter table: not this run's to report
        plot = fake_matplotlib()
        code, _ = self.run_report(plot, "--checkpoint-kind", "random")
        self.assertEqual(code, 0)
        md = self.read("benchmarks.md")
        self.assertNotIn("OLD REPORT", md)
        self.assertIn("| llama.cpp (anchor from issue 7, not run here) | 218 | 4.587 |  |  | 4.59x faster |", md)
        self.assertEqual(bar_names(plot), ["this project", "PyTorch eager", "PyTorch compiled", "llama.cpp (this run)",
                                           "llama.cpp (anchor)"])
        self.assertNotIn("> **Note:**", md)
        # llama.cpp measured in this run: 1000 / 500 = 2.00x; 16 / 4 = 4.00x at 512 tokens.
        self.assertIn("| llama.cpp 0c1e570 (CUDA, f16, flash attention; this run) | 500 | 2.000 |  |  | 2.00x faster |",
                      md)
        self.assertIn("| 512 | 4.00 | 4.20 | 128000 | 24.00 | 6.00x | 16.00 | 4.00x | 16.4 |", md)
        self.assertIn("llama.cpp ran in this run on the same GPU (llama.cpp vendored by "
                      "llama-cpp-python==0.3.36", md)
        self.assertIn("median of 5 repetitions", md)
        # 1000 / 40 = 25, 1000 / 250 = 4, 1000 / 218 = 4.587; TTFT 24 / 4 = 6.
        self.assertIn("| PyTorch + HF transformers, eager | 40 | 25.000 |  |  | 25.00x faster |", md)
        self.assertIn("| PyTorch, StaticCache + torch.compile (CUDA graphs) | 250 | 4.000 |  |  | 4.00x faster |", md)
        self.assertIn("## Logits against HF transformers", md)
        self.assertIn("| this project (CUDA, bf16) | fp32 | 0.0350 | 0.0200 | 98.4% |", md)
        self.assertIn("| HF transformers, bf16 | fp32 | 0.0380 | 0.0210 | 96.9% |", md)
        self.assertIn("| this project | HF transformers, bf16 | 0.0500 | 0.0300 | 95.3% |", md)
        self.assertIn("Verdict: passed.", md)
        self.assertIn("| logits vs HF transformers |", md)
        self.assertIn("random weights of Bielik's shape", md)
        self.assertIn("![decode tokens/s and TTFT against the baselines](benchmarks.png)", md)
        self.assertIn("### model_decode", md)
        self.assertNotIn("rmsnorm", md)
        # The per-kernel table says its events make it add up past the graph step: 600 + 400
        # us against 1 ms a token here.
        self.assertIn("| gate_up_swiglu | 600.0 | 60.0% | 2500 |", md)
        self.assertIn("so the column adds up to 1000 us, where the graph step takes 1000 us a token.", md)
        self.assertIn("median of 5 runs of 256 tokens after an untimed 16-token prefill", md)
        # The step against its ceiling (ceiling_json's numbers): 1e6 / 740 = 1351, 1e6 / 801 =
        # 1248, 740 / 801 = 92.4%, 740 / 1000 = 74.0%.
        self.assertIn("## Where the decode time goes: the step against its ceiling", md)
        self.assertIn("on this GPU in this run (finished 2026-12-06 08:00 UTC)", md)
        self.assertIn("| the copy floor (the weights read once) | 740.0 | 1351 | 100.0% |", md)
        self.assertIn("| the ceiling (before / after: 800.0 / 802.0) | 801.0 | 1248 | 92.4% |", md)
        self.assertIn("| the step (median of 3 runs: 990 1000 1010 tokens/s) | 1000.0 | 1000 | 74.0% |", md)
        self.assertIn("The step costs 199 us a token over its ceiling (6.22 us a layer over 32 layers)", md)
        self.assertIn("1150 tokens/s (869.6 us a token) would leave it 69 us a token, 2.14 us a layer.", md)
        self.assertLess(md.index("## Against the targets"), md.index("## Where the decode time goes"))
        self.assertEqual(self.read("benchmarks.png"), "fake png")  # the old plot replaced
        self.assertFalse(os.path.exists(os.path.join(self.docs, "benchmarks.png.partial.png")))

    def test_header_says_when_each_part_finished(self):
        # A baseline run in a later call (bench_all.sh PYTORCH_ONLY=1) must not read as the
        # same run's: each writer's finished_utc is named; a writer without it is left out.
        self.write("model.json", dict(model_json(), finished_utc="2026-12-05 12:11 UTC"))
        self.write("pytorch.json", pytorch_json(finished_utc="2026-12-05 12:40 UTC"))
        self.write("hf_logits.json", logits_json())
        code, _ = self.run_report(fake_matplotlib())
        self.assertEqual(code, 0)
        header = self.read("benchmarks.md").splitlines()[2]
        self.assertIn("results (finished: bench_model 2026-12-05 12:11 UTC, "
                      "the PyTorch baseline 2026-12-05 12:40 UTC).", header)
        self.assertNotIn("logits check", header)

    def test_llamacpp_of_another_gpu_is_left_out(self):
        self.write("model.json", model_json())
        self.write("llamacpp.json", llamacpp_json(device="NVIDIA H100 80GB HBM3"))
        plot = fake_matplotlib()
        code, _ = self.run_report(plot)
        self.assertEqual(code, 0)
        md = self.read("benchmarks.md")
        self.assertIn("> **Note:** llama.cpp baseline left out: llamacpp.json names the GPU 'NVIDIA H100 80GB HBM3'", md)
        self.assertNotIn("this run) |", md)
        self.assertNotIn("llama.cpp, this run (ms)", md)
        self.assertNotIn("llama.cpp (this run)", bar_names(plot))

    def test_llamacpp_missing_is_said(self):
        self.write("model.json", model_json())
        self.write("pytorch.json", pytorch_json())
        code, _ = self.run_report(NO_MATPLOTLIB)
        self.assertEqual(code, 0)
        md = self.read("benchmarks.md")
        self.assertIn("> **Note:** llama.cpp baseline: not measured in this run (no llamacpp.json", md)
        self.assertIn("| 512 | 4.00 | 4.20 | 128000 | 24.00 | 6.00x | 16.4 |", md)

    def test_llamacpp_in_a_later_call_says_when(self):
        self.write("model.json", dict(model_json(), finished_utc="2026-12-06 10:00 UTC"))
        self.write("llamacpp.json", llamacpp_json(finished_utc="2026-12-06 10:08 UTC"))
        code, _ = self.run_report(NO_MATPLOTLIB)
        self.assertEqual(code, 0)
        header = self.read("benchmarks.md").splitlines()[2]
        self.assertIn("(finished: bench_model 2026-12-06 10:00 UTC, the llama.cpp baseline 2026-12-06 10:08 UTC)",
                      header)

    def test_header_without_times(self):
        self.write("model.json", model_json())
        code, _ = self.run_report(NO_MATPLOTLIB)
        self.assertEqual(code, 0)
        header = self.read("benchmarks.md").splitlines()[2]
        self.assertIn("from `scripts/bench_all.sh`'s results. Batch 1, bf16.", header)
        self.assertNotIn("finished", header)

    def test_missing_model_json_is_refused(self):
        self.write("pytorch.json", pytorch_json())
        self.write("hf_logits.json", logits_json())
        code, stderr = self.run_report(fake_matplotlib())
        self.assertEqual(code, 1)
        self.assertIn("model.json is missing", stderr)
        self.assertEqual(self.read("benchmarks.md"), "OLD REPORT\n")
        self.assertEqual(self.read("benchmarks.png"), "OLD PLOT")

    def test_baselines_from_another_gpu_are_left_out(self):
        self.write("model.json", model_json())
        self.write("pytorch.json", pytorch_json(device="NVIDIA H100 80GB HBM3"))
        self.write("hf_logits.json", logits_json(device="NVIDIA H100 80GB HBM3"))
        code, stderr = self.run_report(fake_matplotlib())
        self.assertEqual(code, 0)
        md = self.read("benchmarks.md")
        self.assertIn("PyTorch baseline left out: pytorch.json names the GPU 'NVIDIA H100 80GB HBM3'", md)
        self.assertIn("Logits check left out: hf_logits.json names the GPU 'NVIDIA H100 80GB HBM3'", md)
        self.assertNotIn("PyTorch + HF transformers, eager |", md)
        self.assertNotIn("x faster |", md.replace("4.59x faster |", ""))  # only the llama.cpp anchor's ratio
        self.assertNotIn("| 24.00 |", md)
        self.assertNotIn("## Logits against HF transformers", md)
        self.assertIn("PyTorch baseline left out", stderr)

    def test_baseline_of_another_checkpoint_or_unnamed_is_left_out(self):
        self.write("model.json", model_json())
        self.write("pytorch.json", pytorch_json(model="models/bielik-1.5b-v3.0-instruct"))
        self.assertEqual(self.run_report(fake_matplotlib())[0], 0)
        self.assertIn("names the checkpoint 'models/bielik-1.5b-v3.0-instruct'", self.read("benchmarks.md"))
        self.assertNotIn("25.00x faster", self.read("benchmarks.md"))
        old = pytorch_json()
        del old["model"]  # an older bench_pytorch.py's file (prefill inside its decode timing)
        self.write("pytorch.json", old)
        self.assertEqual(self.run_report(fake_matplotlib())[0], 0)
        self.assertIn("does not name its checkpoint", self.read("benchmarks.md"))
        self.assertNotIn("25.00x faster", self.read("benchmarks.md"))

    def test_same_checkpoint_spelled_differently_is_kept(self):
        self.write("model.json", model_json())
        self.write("pytorch.json", pytorch_json(model="./models/bielik-shaped-random/"))
        self.assertEqual(self.run_report(fake_matplotlib())[0], 0)
        self.assertIn("25.00x faster", self.read("benchmarks.md"))

    def test_without_matplotlib_the_stale_plot_goes(self):
        self.write("model.json", model_json())
        code, stderr = self.run_report(NO_MATPLOTLIB)
        self.assertEqual(code, 0)
        md = self.read("benchmarks.md")
        self.assertNotIn("OLD REPORT", md)
        self.assertNotIn("benchmarks.png", md)
        self.assertIn("No plot: matplotlib is not installed", md)
        self.assertFalse(os.path.exists(os.path.join(self.docs, "benchmarks.png")))
        self.assertIn("WARNING: matplotlib is not installed", stderr)
        self.assertIn("PyTorch baseline: not in this report", md)
        self.assertIn("Logits check against HF transformers: not in this run", md)

    def test_the_ceiling_missing_or_from_another_gpu_is_left_out(self):
        self.write("model.json", model_json())
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        md = self.read("benchmarks.md")
        self.assertIn("> **Note:** The decode step against its ceiling: not in this run (no step_vs_ceiling.json", md)
        self.assertNotIn("## Where the decode time goes", md)
        self.write("step_vs_ceiling.json", ceiling_json(device="NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        md = self.read("benchmarks.md")
        self.assertIn("> **Note:** The decode step against its ceiling left out: step_vs_ceiling.json names the GPU "
                      "'NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)'", md)
        self.assertNotIn("## Where the decode time goes", md)

    def test_the_ceiling_on_another_gpu_weighs_no_h200_target(self):
        h100 = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"
        self.write("model.json", dict(model_json(), device=h100))
        self.write("step_vs_ceiling.json", ceiling_json(device=h100, gpu="NVIDIA H100 80GB HBM3"))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        md = self.read("benchmarks_h100_80gb_hbm3.md")
        self.assertIn("The step costs 199 us a token over its ceiling", md)
        self.assertIn("Issue 7's 1150 tokens/s is an H200 figure, so it is not weighed here.", md)
        self.assertNotIn("would leave it", md)

    def test_a_ceiling_slower_than_the_target_says_so(self):
        self.write("model.json", model_json())
        self.write("step_vs_ceiling.json", ceiling_json(target_leaves_us=-20.0, target_leaves_us_a_layer=-0.625))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        self.assertIn("is faster than the ceiling itself: no schedule of these launches reaches it.",
                      self.read("benchmarks.md"))

    def test_the_marginal_table_says_which_kernels_cannot_close_the_gap(self):
        marginal = [{"left_out": "QKV + RoPE + append", "tok_s": 1113.4, "us_per_layer": 2.69},
                    {"left_out": "attention + O projection", "tok_s": 1104.6, "us_per_layer": 2.49},
                    {"left_out": "down projection", "tok_s": 1328.0, "us_per_layer": 7.24}]
        self.write("model.json", dict(model_json(), decode_marginal=marginal))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        self.assertIn("the step runs without QKV + RoPE + append 1113; without attention + O projection 1105; "
                      "without down projection 1328 tokens/s. So even at no cost, QKV + RoPE + append or "
                      "attention + O projection alone would leave decode below 1150 tokens/s; only leaving out "
                      "down projection, and its weights with it, reaches it.", self.read("benchmarks.md"))
        # Every removal short of the target: no "only leaving out" clause.
        self.write("model.json", dict(model_json(), decode_marginal=marginal[:2]))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        md = self.read("benchmarks.md")
        self.assertIn("alone would leave decode below 1150 tokens/s.", md)
        self.assertNotIn("only leaving out", md)
        # The target met, or another GPU (whose report weighs no H200 target): no such paragraph.
        self.write("model.json", dict(model_json(), decode_tok_s=1200.0, decode_marginal=marginal))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        self.assertNotIn("How far any one kernel", self.read("benchmarks.md"))
        h100 = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"
        self.write("model.json", dict(model_json(), device=h100, decode_marginal=marginal))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        self.assertNotIn("How far any one kernel", self.read("benchmarks_h100_80gb_hbm3.md"))

    def test_failed_logits_check_is_reported(self):
        self.write("model.json", model_json())
        self.write("hf_logits.json", logits_json(passed=False, ours_vs_fp32={"max": 0.2, "mean": 0.1}))
        self.assertEqual(self.run_report(NO_MATPLOTLIB)[0], 0)
        md = self.read("benchmarks.md")
        self.assertIn("Verdict: **FAILED**.", md)
        self.assertIn("max rel. error 0.200 against transformers-bf16's 0.038, both vs fp32 | missed |", md)

    def test_real_checkpoint_wording_and_other_gpu_note(self):
        real = model_json()
        real["model"] = "models/bielik-1.5b-v3.0-instruct"
        real["device"] = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"
        self.write("model.json", real)
        self.assertEqual(self.run_report(NO_MATPLOTLIB, "--checkpoint-kind", "real")[0], 0)
        md = self.read("benchmarks_h100_80gb_hbm3.md")
        self.assertIn("the real Bielik-1.5B-v3.0-Instruct weights", md)
        self.assertIn("this run is on NVIDIA H100 80GB HBM3", md)

    def test_another_gpu_writes_its_own_report_and_keeps_the_h200_one(self):
        other = model_json()
        other["device"] = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"
        self.write("model.json", other)
        self.write("pytorch.json", pytorch_json(device="NVIDIA H100 80GB HBM3"))
        plot = fake_matplotlib()
        code, _ = self.run_report(plot)
        self.assertEqual(code, 0)
        # The H200's report and plot are untouched.
        self.assertEqual(self.read("benchmarks.md"), "OLD REPORT\n")
        self.assertEqual(self.read("benchmarks.png"), "OLD PLOT")
        md = self.read("benchmarks_h100_80gb_hbm3.md")
        self.assertTrue(md.startswith("# Benchmarks on the NVIDIA H100 80GB HBM3\n"))
        self.assertIn("[benchmarks.md](benchmarks.md) is the NVIDIA H200's", md)
        self.assertIn("](benchmarks_h100_80gb_hbm3.png)", md)
        self.assertIn("| PyTorch, StaticCache + torch.compile (CUDA graphs) | 250 | 4.000 |", md)
        self.assertEqual(self.read("benchmarks_h100_80gb_hbm3.png"), "fake png")
        # The llama.cpp anchor is an H200 figure: listed as such, with no ratio to this
        # GPU's run, no prefill column and no bar in the plot.
        self.assertIn("| llama.cpp (anchor from issue 7, measured on the NVIDIA H200, not run here) | 218 | 4.587 "
                      "|  |  | no ratio: another GPU |", md)
        self.assertNotIn("4.59x faster", md)
        self.assertNotIn("llama.cpp anchor (ms)", md)
        self.assertIn("| 512 | 4.00 | 4.20 | 128000 | 24.00 | 6.00x |\n", md)
        self.assertEqual(bar_names(plot), ["this project", "PyTorch eager", "PyTorch compiled"])

    def test_report_names(self):
        name = make_bench_report.report_name
        self.assertEqual(name("NVIDIA H200 (sm_90, 132 SMs, 139 GiB)"), "benchmarks")
        self.assertEqual(name("NVIDIA H200"), "benchmarks")
        self.assertEqual(name("NVIDIA H200 NVL (sm_90, 132 SMs, 140 GiB)"), "benchmarks_h200_nvl")
        self.assertEqual(name("NVIDIA GeForce RTX 4090 (sm_89, 128 SMs, 24 GiB)"), "benchmarks_geforce_rtx_4090")
        self.assertEqual(name("NVIDIA A100-SXM4-80GB"), "benchmarks_a100_sxm4_80gb")
        self.assertEqual(name(""), "benchmarks_unknown_gpu")

    def test_print_report_name_writes_nothing(self):
        other = model_json()
        other["device"] = "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)"
        self.write("model.json", other)
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = make_bench_report.main(["--bench-dir", self.bench, "--out", self.docs, "--print-report-name"])
        self.assertEqual(code, 0)
        self.assertEqual(stdout.getvalue(), "benchmarks_h100_80gb_hbm3\n")
        self.assertEqual(sorted(os.listdir(self.docs)), ["benchmarks.md", "benchmarks.png"])


if __name__ == "__main__":
    unittest.main()
