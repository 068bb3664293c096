"""Turns one GPU run's benchmark outputs into docs/benchmarks.md and a PNG plot.

    python scripts/make_bench_report.py --bench-dir build-bench/bench --out docs \
        [--checkpoint-kind random|real|given]

Reads, from --bench-dir (scripts/bench_all.sh clears them at the start of each run, so
every file there is this run's):
  model.json      from bench_model (chapter 08): TTFT, decode tokens/s, GB/s, memory,
                  breakdown, the marginal table (on the H200, when decode misses its
                  target, the report says which kernels could not close the gap even at
                  no cost). Required: without it nothing is written (exit 1), so an
                  older report is never replaced by one without our numbers.
  pytorch.json    from scripts/bench_pytorch.py: the same measurements for HF transformers.
                  Used only when it names the same GPU and checkpoint as model.json;
                  otherwise left out with a note (our numbers stand on their own, but a
                  ratio across GPUs or checkpoints would be meaningless).
  llamacpp.json   from scripts/bench_llamacpp.py: llama.cpp's llama-bench on the same GPU
                  and checkpoint (decode tokens/s, prefill ms); same GPU and checkpoint
                  check. Issue 7's llama.cpp anchor (an H200 figure) stays beside it.
  hf_logits.json  from scripts/compare_hf_logits.py: our logits and transformers-bf16's
                  against a fp32 reference; same GPU and checkpoint check.
  step_vs_ceiling.json  from scripts/step_vs_ceiling.py: the decode step against the
                  ceiling of its launch shape (bench_layer_chain) on the same GPU, which
                  says where the gap to the decode target is; same GPU and checkpoint check.
  model_*.csv     bench_model's tables (BenchTable rows). The chapters' own bench_*
                  tables in the same folder are not included: this script cannot tell
                  whether they come from this run.
Writes docs/benchmarks.md (tables, ratios, the gap to each target) and
docs/benchmarks.png (decode tokens/s and TTFT side by side) for a run on an H200, the GPU
issue 7's targets are set on; a run on any other GPU writes its own pair, named after it
(docs/benchmarks_h100_80gb_hbm3.md for an "NVIDIA H100 80GB HBM3"), so that a report from
another GPU never replaces the H200's. --print-report-name prints that name (without .md)
and writes nothing. Without matplotlib there is no plot: a plot of that name left from an
earlier run is deleted (it would show other numbers beside this report), the report says
so, and a warning is printed.
"""
import argparse
import csv
import glob
import json
import os
import sys
from datetime import datetime, timezone

DECODE_TARGET_TOKENS_PER_S = 1150.0  # issue 7's decode target, on the H200

LLAMA_CPP = {"decode_tok_s": 218.0, "prefill_ms": {"512": 16.4, "2048": 63.0},
             "source": "issue 7 anchor: llama.cpp CUDA, F16, flash attention, early-2025 build, same GPU kind"}

CHECKPOINT_KINDS = {
    "random": "random weights of Bielik's shape (the same tensors and bytes per token as the real model, "
              "so the same speed; the logits check then tests arithmetic, not language)",
    "real": "the real Bielik-1.5B-v3.0-Instruct weights",
    "given": "the checkpoint given to the benchmark",
}


TARGETS_GPU = "NVIDIA H200"  # issue 7's targets and its llama.cpp anchor are this GPU's


def gpu_name(device):
    """bench_model writes 'NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79 GiB)': the name is
    the part before ' ('."""
    return device.split(" (")[0].strip()


def report_name(device):
    """'benchmarks' for the targets' GPU, else 'benchmarks_' + the GPU's name in lower case
    with every run of other characters made one '_' ('NVIDIA H100 80GB HBM3 (sm_90, ...)'
    -> 'benchmarks_h100_80gb_hbm3')."""
    name = gpu_name(device)
    if name == TARGETS_GPU:
        return "benchmarks"
    if name.startswith("NVIDIA "):
        name = name[len("NVIDIA "):]
    slug = "".join(c if c.isalnum() else "_" for c in name.lower())
    slug = "_".join(part for part in slug.split("_") if part)
    return "benchmarks_" + (slug or "unknown_gpu")


def load_json(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None


def table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def same_device(ours, theirs):
    """bench_model writes 'NVIDIA H200 (sm_90, 132 SMs, 139 GiB)', torch 'NVIDIA H200'."""
    if not ours or not theirs:
        return False
    return ours == theirs or ours.startswith(theirs + " (")


def same_checkpoint(ours, theirs):
    if not ours or not theirs:
        return False
    if os.path.normpath(ours) == os.path.normpath(theirs):
        return True
    return os.path.exists(ours) and os.path.exists(theirs) and os.path.samefile(ours, theirs)


def comparable(model, other, name):
    """None when `other` (pytorch.json or hf_logits.json) is from the same GPU and
    checkpoint as model.json, else the reason it is not, for the report's note."""
    if not same_device(model.get("device"), other.get("device")):
        return f"{name} names the GPU '{other.get('device')}', model.json '{model.get('device')}'"
    if not same_checkpoint(model.get("model"), other.get("model")):
        if other.get("model") is None:
            return f"{name} does not name its checkpoint (written by an older script)"
        return f"{name} names the checkpoint '{other.get('model')}', model.json '{model.get('model')}'"
    return None


def measured_when(model, logits, torch_result, llama=None):
    """ ", finished at ..." for each part of the report that records when its run ended
    (finished_utc), so a baseline measured in a later call says so; "" when none does."""
    parts = [(what, result.get("finished_utc")) for what, result in
             (("bench_model", model), ("the logits check", logits), ("the PyTorch baseline", torch_result),
              ("the llama.cpp baseline", llama))
             if result]
    parts = [f"{what} {when}" for what, when in parts if when]
    return f" (finished: {', '.join(parts)})" if parts else ""


def load_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def llama_label(llama):
    """'llama.cpp 0c1e570 (CUDA, f16, flash attention; this run)'."""
    commit = (llama.get("build_commit") or "").strip()
    return f"llama.cpp{' ' + commit if commit else ''} (CUDA, f16, flash attention; this run)"


def write_plot(plt, path, model, torch_result, title, with_anchor, llama=None):
    """with_anchor: draw the llama.cpp anchor's bar (only beside a run on its own GPU);
    llama: llamacpp.json's results from this run, drawn when present."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names, values = ["this project"], [model["decode_tok_s"]]
    if torch_result:
        for key, label in (("decode_eager_tok_s", "PyTorch eager"), ("decode_compiled_tok_s", "PyTorch compiled")):
            if key in torch_result:
                names.append(label)
                values.append(torch_result[key])
    if llama:
        names.append("llama.cpp (this run)")
        values.append(llama["decode_tok_s"])
    if with_anchor:
        names.append("llama.cpp (anchor)")
        values.append(LLAMA_CPP["decode_tok_s"])
    left.bar(names, values, color=["tab:green"] + ["tab:gray"] * (len(names) - 1))
    if model.get("floor_ms"):
        left.axhline(1000 / model["floor_ms"], color="tab:red", linestyle="--", label="bandwidth floor")
        left.legend()
    left.set_ylabel("decode tokens/s (higher is better)")
    left.tick_params(axis="x", labelrotation=20)
    ns = sorted(model.get("ttft_ms", {}).keys(), key=int)
    right.plot([int(n) for n in ns], [model["ttft_ms"][n] for n in ns], "o-", label="this project")
    if torch_result:
        tp = {str(k): v for k, v in torch_result.get("prefill_ms", {}).items()}
        right.plot([int(n) for n in ns if n in tp], [tp[n] for n in ns if n in tp], "s-", label="PyTorch eager")
    if llama:
        lp = {str(k): v for k, v in llama.get("prefill_ms", {}).items()}
        right.plot([int(n) for n in ns if n in lp], [lp[n] for n in ns if n in lp], "^-", label="llama.cpp")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("prompt tokens")
    right.set_ylabel("TTFT ms (lower is better)")
    right.legend()
    fig.suptitle(title)
    fig.tight_layout()
    # Written beside the final name and renamed: an interrupted run leaves no half plot.
    partial = path + ".partial.png"
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, path)


def logits_section(logits):
    """The 'Logits against HF transformers' section from compare_hf_logits.py's JSON."""
    out = ["## Logits against HF transformers", ""]
    out.append(f"The same {logits.get('tokens', '?')}-token random prompt through this project's CUDA backend and "
               "through transformers' LlamaForCausalLM twice: in bf16 (as its users run it) and in fp32 (the same "
               "bf16 weights, activations kept in fp32: the reference). Error: the relative norm error of a "
               "position's logits against fp32, over every position.")
    out.append("")
    rows = []
    for label, error_key, agreement_key in (
            ("this project (CUDA, bf16)", "ours_vs_fp32", "top1_agreement_ours_vs_fp32"),
            ("HF transformers, bf16", "hf_bf16_vs_fp32", "top1_agreement_hf_bf16_vs_fp32")):
        error = logits.get(error_key, {})
        rows.append([label, "fp32", f"{error.get('max', float('nan')):.4f}", f"{error.get('mean', float('nan')):.4f}",
                     f"{100 * logits.get(agreement_key, float('nan')):.1f}%"])
    error = logits.get("ours_vs_hf_bf16", {})
    rows.append(["this project", "HF transformers, bf16", f"{error.get('max', float('nan')):.4f}",
                 f"{error.get('mean', float('nan')):.4f}",
                 f"{100 * logits.get('top1_agreement_ours_vs_hf_bf16', float('nan')):.1f}%"])
    out.append(table(["logits of", "against", "max rel. error", "mean rel. error", "top-1 token agrees"], rows))
    out.append("")
    verdict = "passed" if logits.get("passed") else "**FAILED**"
    out.append(f"Verdict: {verdict}. The rule: {logits.get('rule', '?')}, tolerance {logits.get('tolerance', '?')}. "
               "Both bf16 paths round every activation, at different places, so ours is judged by its distance "
               "to fp32 beside transformers-bf16's own, not by its distance to transformers-bf16.")
    out.append("")
    return out


def ceiling_section(ceiling, on_targets_gpu):
    """'Where the decode time goes' from step_vs_ceiling.py's JSON: the floor, the ceiling
    of the step's launch shape and the step, measured together, and what the step costs
    over the ceiling."""
    floor = ceiling["floor_us"]

    def row(label, us):
        return [label, f"{us:.1f}", f"{1e6 / us:.0f}", f"{100 * floor / us:.1f}%"]

    each = " / ".join(f"{us:.1f}" for us in ceiling["ceiling_us_each"])
    rates = " ".join(f"{r:.0f}" for r in ceiling["step_tokens_per_s_each"])
    out = ["## Where the decode time goes: the step against its ceiling", ""]
    out.append("`scripts/step_vs_ceiling.py`, on this GPU in this run"
               + (f" (finished {ceiling['finished_utc']})" if ceiling.get("finished_utc") else "")
               + ": `bench_layer_chain` runs the step's launches with nothing in them but their weight "
               "reads, issued before their PDL waits as the real kernels issue theirs (the ceiling of the step's "
               "shape), then the step runs on its own (`bench_model --decode-only`), then the ceiling again.")
    out.append("")
    out.append(table(["", "us a token", "tokens/s", "% of the copy floor"], [
        row("the copy floor (the weights read once)", floor),
        row(f"the ceiling (before / after: {each})", ceiling["ceiling_us"]),
        row(f"the step (median of {len(ceiling['step_tokens_per_s_each'])} runs: {rates} tokens/s)",
            ceiling["step_us"])]))
    out.append("")
    text = (f"The step costs {ceiling['step_over_ceiling_us']:.0f} us a token over its ceiling "
            f"({ceiling['step_over_ceiling_us_a_layer']:.2f} us a layer over {ceiling['layers']} layers): its "
            "kernels' work after their waits, mostly round trips through L2 in the chain QKV -> attention -> O "
            "(chapter 08's README and DECODE_LOG.md).")
    target = ceiling["target_tokens_per_s"]
    if not on_targets_gpu:
        text += f" Issue 7's {target:.0f} tokens/s is an H200 figure, so it is not weighed here."
    elif ceiling["target_leaves_us"] > 0:
        text += (f" {target:.0f} tokens/s ({ceiling['target_us']:.1f} us a token) would leave it "
                 f"{ceiling['target_leaves_us']:.0f} us a token, {ceiling['target_leaves_us_a_layer']:.2f} us a layer.")
    else:
        text += (f" {target:.0f} tokens/s ({ceiling['target_us']:.1f} us a token) is faster than the ceiling "
                 "itself: no schedule of these launches reaches it.")
    out.append(text)
    out.append("")
    return out


def one_kernel_free(model, target=DECODE_TARGET_TOKENS_PER_S):
    """What bench_model's marginal table (the step with one kernel left out of every layer)
    says about the decode target: which kernels, even if they cost nothing, would leave the
    step below it. Lines for the targets section; none when the target is met or the run
    has no marginal table."""
    marginal = [m for m in model.get("decode_marginal", []) if m.get("tok_s")]
    if not marginal or model.get("decode_tok_s", 0) >= target:
        return []
    short = [m["left_out"] for m in marginal if m["tok_s"] < target]
    reach = [m["left_out"] for m in marginal if m["tok_s"] >= target]
    rates = "; ".join(f"without {m['left_out']} {m['tok_s']:.0f}" for m in marginal)
    text = ("How far any one kernel is from the decode gap: in this run's marginal table (the step with one "
            f"kernel left out of every layer, its values then meaningless) the step runs {rates} tokens/s.")
    if short:
        text += (f" So even at no cost, {' or '.join(short)} alone would leave decode below {target:.0f} tokens/s")
        text += (f"; only leaving out {' or '.join(reach)}, and its weights with it, reaches it." if reach else ".")
    return [text, ""]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-dir", default="build-bench/bench")
    parser.add_argument("--out", default="docs")
    parser.add_argument("--checkpoint-kind", choices=sorted(CHECKPOINT_KINDS), default="given",
                        help="what the checkpoint is, for the report's wording (bench_all.sh sets it)")
    parser.add_argument("--print-report-name", action="store_true",
                        help="print the report's file name without .md (it depends on the GPU) and write nothing")
    args = parser.parse_args(argv)

    model = load_json(os.path.join(args.bench_dir, "model.json"))
    if model is None:
        print(f"make_bench_report: {os.path.join(args.bench_dir, 'model.json')} is missing (bench_model failed or "
              f"did not run): no report written; every earlier report in {args.out} stays as it was.",
              file=sys.stderr)
        return 1
    name = report_name(model.get("device", ""))
    if args.print_report_name:
        print(name)
        return 0
    notes = []  # what this report leaves out, and why: printed at its top
    def companion(name, missing_note, left_out_note):
        """name's results when this run wrote them for model.json's GPU and checkpoint, else None
        and a note saying why (missing_note, or left_out_note with the reason in {})."""
        result = load_json(os.path.join(args.bench_dir, name))
        if result is None:
            notes.append(missing_note)
            return None
        reason = comparable(model, result, name)
        if reason:
            notes.append(left_out_note.format(reason))
            return None
        return result

    torch_result = companion("pytorch.json",
                             "PyTorch baseline: not in this report (no pytorch.json: not run yet, skipped, or "
                             "failed), so no PyTorch column or ratio below.",
                             "PyTorch baseline left out: {}. Ratios are only meaningful on the same GPU and "
                             "checkpoint.")
    logits = companion("hf_logits.json",
                       "Logits check against HF transformers: not in this run (no hf_logits.json: skipped or "
                       "failed before writing it).",
                       "Logits check left out: {}.")
    llama = companion("llamacpp.json",
                      "llama.cpp baseline: not measured in this run (no llamacpp.json: third_party/llama.cpp "
                      "not fetched, skipped, or failed).",
                      "llama.cpp baseline left out: {}. Ratios are only meaningful on the same GPU and checkpoint.")
    ceiling = companion("step_vs_ceiling.json",
                        "The decode step against its ceiling: not in this run (no step_vs_ceiling.json: skipped "
                        "or failed).",
                        "The decode step against its ceiling left out: {}.")
    plt = load_pyplot()
    png_path = os.path.join(args.out, name + ".png")
    if plt is None:
        notes.append("No plot: matplotlib is not installed where this report was generated "
                     "(`pip install -r scripts/requirements-bench.txt`).")

    # On the targets' GPU (the H200): issue 7's targets and its llama.cpp anchor were set
    # there, so this report is benchmarks.md and may divide by the anchor.
    on_targets_gpu = name == "benchmarks"
    out = []
    out.append("# Benchmarks" + ("" if on_targets_gpu else f" on the {gpu_name(model.get('device', '?'))}"))
    out.append("")
    out.append(f"Generated by `scripts/make_bench_report.py` "
               f"({datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}) from `scripts/bench_all.sh`'s "
               f"results{measured_when(model, logits, torch_result, llama)}. Batch 1, bf16. Every number below is a "
               "median; ratios compare results from the same GPU and checkpoint.")
    out.append("")
    if not on_targets_gpu:
        out.append(f"This is the {gpu_name(model.get('device', '?'))}'s report; [benchmarks.md](benchmarks.md) "
                   f"is the {TARGETS_GPU}'s, the GPU issue 7's targets are set on. Each GPU's report is replaced only "
                   "by a later run on the same GPU.")
        out.append("")
    for note in notes:
        out.append(f"> **Note:** {note}")
        out.append("")
    out.append(f"Device: {model.get('device', '?')}. Checkpoint: `{model.get('model', '?')}` "
               f"({model.get('weights_gb', 0):.2f} GB of weights): {CHECKPOINT_KINDS[args.checkpoint_kind]}."
               + (f" Copy bandwidth measured in the same run: {model.get('copy_gbs', 0):.0f} GB/s, so the decode "
                  f"floor (weights read once per token) is {model['floor_ms']:.3f} ms/token = "
                  f"{1000 / model['floor_ms']:.0f} tokens/s." if model.get("floor_ms") else ""))
    out.append("")
    if plt is not None:
        out.append(f"![decode tokens/s and TTFT against the baselines]({name}.png)")
        out.append("")
    decode_tokens = model.get("decode_tokens", 256)
    out.append(f"## Decode (one token at a time, KV cache, {decode_tokens} tokens, EOS ignored)")
    out.append("")
    rows = [["this project (CUDA graph)", f"{model['decode_tok_s']:.0f}", f"{1000 / model['decode_tok_s']:.3f}",
             f"{model.get('decode_gbs', 0):.0f}", f"{model.get('decode_pct_copy', 0):.1f}%", "1.00x"]]
    if torch_result:
        for key, label in (("decode_eager_tok_s", "PyTorch + HF transformers, eager"),
                           ("decode_compiled_tok_s", "PyTorch, StaticCache + torch.compile (CUDA graphs)")):
            if key in torch_result:
                v = torch_result[key]
                rows.append([label, f"{v:.0f}", f"{1000 / v:.3f}", "", "",
                             f"{model['decode_tok_s'] / v:.2f}x faster"])
    if llama:
        v = llama["decode_tok_s"]
        rows.append([llama_label(llama), f"{v:.0f}", f"{1000 / v:.3f}", "", "",
                     f"{model['decode_tok_s'] / v:.2f}x faster"])
    # Beside a run on another GPU a ratio to the llama.cpp anchor would mix two cards, so
    # there it is listed as an H200 figure only.
    anchor = LLAMA_CPP["decode_tok_s"]
    rows.append([("llama.cpp (anchor from issue 7, not run here)" if on_targets_gpu else
                  f"llama.cpp (anchor from issue 7, measured on the {TARGETS_GPU}, not run here)"),
                 f"{anchor:.0f}", f"{1000 / anchor:.3f}", "", "",
                 f"{model['decode_tok_s'] / anchor:.2f}x faster" if on_targets_gpu else "no ratio: another GPU"])
    out.append(table(["engine", "tokens/s", "ms/token", "GB/s", "% of copy BW", "this project vs engine"], rows))
    out.append("")
    if torch_result and torch_result.get("decode_tokens") not in (None, decode_tokens):
        out.append(f"PyTorch decoded {torch_result['decode_tokens']} tokens, this project {decode_tokens}.")
        out.append("")
    if llama:
        out.append(f"llama.cpp ran in this run on the same GPU ({llama.get('source') or 'source unknown'}, "
                   f"`scripts/bench_llamacpp.py`): `llama-bench` with every layer on the GPU "
                   f"(`-ngl {llama.get('n_gpu_layers', 99)}`) and flash attention on, the same checkpoint written as "
                   f"GGUF in f16 (`scripts/checkpoint_to_gguf.py`: the same tensors and bytes a token), each number the "
                   f"median of {llama.get('reps', '?')} repetitions after llama-bench's warm-up; decode "
                   f"{llama.get('decode_tokens', '?')} tokens one at a time after {llama.get('decode_depth', 0)} in the "
                   f"cache (`-n {llama.get('decode_tokens', '?')} -d {llama.get('decode_depth', 0)}`), prefill a "
                   "prompt's pass in a fresh context (`-p N`).")
        out.append("")
    out.append("## Prefill: time to first token")
    out.append("")
    eager = {str(k): v for k, v in model.get("ttft_eager_ms", {}).items()}
    if eager:
        out.append("A prompt length's first prefill launches its kernels from the host; from its second on, "
                   "the prefill replays a CUDA graph captured for that length (`CudaModelOptions::prefill_graphs`). "
                   "The main column is the replay (the median of 7 runs after two warm-ups), the next one every "
                   "run launched from the host, as a length seen for the first time is.")
        out.append("")
    torch_prefill = {str(k): v for k, v in torch_result.get("prefill_ms", {}).items()} if torch_result else {}
    llama_prefill = {str(k): v for k, v in llama.get("prefill_ms", {}).items()} if llama else {}
    rows = []
    for n, ms in sorted(model.get("ttft_ms", {}).items(), key=lambda item: int(item[0])):
        row = [n, f"{ms:.2f}"] + ([f"{eager[str(n)]:.2f}" if str(n) in eager else ""] if eager else []) + \
            [f"{int(n) / ms * 1000:.0f}"]
        if str(n) in torch_prefill:
            t = torch_prefill[str(n)]
            row += [f"{t:.2f}", f"{t / ms:.2f}x"]
        else:
            row += ["", ""]
        if llama_prefill:
            if str(n) in llama_prefill:
                t = llama_prefill[str(n)]
                row += [f"{t:.2f}", f"{t / ms:.2f}x"]
            else:
                row += ["", ""]
        if on_targets_gpu:
            row.append(f"{LLAMA_CPP['prefill_ms'][str(n)]:.1f}" if str(n) in LLAMA_CPP["prefill_ms"] else "")
        rows.append(row)
    out.append(table(["prompt tokens", "this project (ms)"] +
                     (["this project, launched from the host (ms)"] if eager else []) +
                     ["tokens/s", "PyTorch eager (ms)", "speed-up"] +
                     (["llama.cpp, this run (ms)", "speed-up vs llama.cpp"] if llama_prefill else []) +
                     (["llama.cpp anchor (ms)"] if on_targets_gpu else []), rows))
    out.append("")
    if "peak_memory_gb" in model:
        out.append("## GPU memory")
        out.append("")
        out.append(f"Peak {model['peak_memory_gb']:.2f} GB = weights {model.get('weights_gb', 0):.2f} GB + KV cache "
                   f"{model.get('kv_cache_gb', 0):.2f} GB + other {model['peak_memory_gb'] - model.get('weights_gb', 0) - model.get('kv_cache_gb', 0):.2f} GB.")
        out.append("")
    if logits:
        out += logits_section(logits)
    out.append("## Against the targets (issue 7)")
    out.append("")
    if not on_targets_gpu:
        # Issue 7's targets and its llama.cpp anchor are H200 figures: on another GPU the
        # verdicts below compare across cards, which the reader must be told.
        out.append(f"Issue 7's targets (like the llama.cpp anchor above) are H200 figures; this run is on "
                   f"{model.get('device', 'another GPU')}, so each verdict compares across GPUs. "
                   "The percentages of this run's own copy bandwidth are the comparable measure.")
        out.append("")
    rows = []
    decode = model["decode_tok_s"]
    target = DECODE_TARGET_TOKENS_PER_S
    rows.append(["decode tokens/s", f">= {target:.0f}", f"{decode:.0f}", "met" if decode >= target else
                 f"missed: {decode / target:.0%} of the target"])
    ttft = {str(k): v for k, v in model.get("ttft_ms", {}).items()}.get("512")
    if ttft is not None:
        measured = f"{ttft:.2f} ms"
        if "512" in eager:
            measured += f" (graph replayed; {eager['512']:.2f} ms launched from the host)"
        rows.append(["TTFT, 512-token prompt", "<= 4 ms", measured, "met" if ttft <= 4 else
                     f"missed by {100 * (ttft / 4 - 1):.0f}%"])
    if logits:
        rows.append(["logits vs HF transformers", "within bf16 tolerance (the rule above)",
                     f"max rel. error {logits['ours_vs_fp32']['max']:.3f} against transformers-bf16's "
                     f"{logits['hf_bf16_vs_fp32']['max']:.3f}, both vs fp32",
                     "met" if logits.get("passed") else "missed"])
    if "peak_memory_gb" in model and model.get("weights_gb"):
        base = model["weights_gb"] + model.get("kv_cache_gb", 0)
        over = 100 * (model["peak_memory_gb"] / base - 1)
        rows.append(["peak GPU memory", "<= weights + KV cache + 10%", f"+{over:.1f}%",
                     "met" if over <= 10 else "missed"])
    out.append(table(["what", "target", "measured", "verdict"], rows))
    out.append("")
    if on_targets_gpu:
        out += one_kernel_free(model)
    if ceiling:
        out += ceiling_section(ceiling, on_targets_gpu)
    if model.get("breakdown"):
        out.append("## One decode step, per kernel (summed over the layers)")
        out.append("")
        total = sum(k["us"] for k in model["breakdown"])
        # The events that time each kernel class also keep the next kernel from starting
        # early (PDL), so these times add up to more than the graph step takes: say so,
        # or a reader adds the column and finds a step twice as long as the headline.
        note = ("Measured on a step launched from the host, with a CUDA event after each kernel "
                "class. An event between two kernels keeps the second from starting while the "
                f"first drains (PDL), so the column adds up to {total:.0f} us")
        if model.get("decode_ms_per_token"):
            note += f", where the graph step takes {1000 * model['decode_ms_per_token']:.0f} us a token"
        note += (". Read it for each kernel's share, not for the step's time; chapter 08's README "
                 "has the graph step's timeline.")
        out.append(note)
        out.append("")
        out.append(table(["kernel", "us", "% of step", "GB/s"],
                         [[k["kernel"], f"{k['us']:.1f}", f"{100 * k['us'] / total:.1f}%",
                           f"{k.get('gbs', 0):.0f}" if k.get("gbs") else ""] for k in model["breakdown"]]))
        out.append("")
    if torch_result:
        method = []
        if "prefill_runs" in torch_result:
            method.append(f"TTFT the median of {torch_result['prefill_runs']} runs after two warm-ups, "
                          f"{torch_result.get('prefill_last_logits', '?')}, the last position's logits copied "
                          "to the host")
        if "decode_runs" in torch_result:
            method.append(f"decode the median of {torch_result['decode_runs']} runs of "
                          f"{torch_result.get('decode_tokens', '?')} tokens after an untimed "
                          f"{torch_result.get('decode_prompt_tokens', '?')}-token prefill")
        out.append(f"PyTorch {torch_result.get('torch')}, transformers {torch_result.get('transformers')}"
                   + (f"; {'; '.join(method)}" if method else "")
                   + (f"; compiled run failed: `{torch_result['decode_compiled_error']}`"
                      if "decode_compiled_error" in torch_result else "") + ".")
        out.append("")
    # Only bench_model's own tables: bench_all.sh clears model_*.csv before the run, so
    # these are this run's. Other CSVs in the folder (the chapters' bench_* programs, run
    # by `make bench`) may be older, so they stay out of a report dated by this run.
    csvs = sorted(glob.glob(os.path.join(args.bench_dir, "model_*.csv")))
    if csvs:
        out.append("## bench_model's tables")
        out.append("")
        for path in csvs:
            with open(path) as f:
                rows = list(csv.reader(f))
            if not rows:
                continue
            out.append(f"### {os.path.splitext(os.path.basename(path))[0]}")
            out.append("")
            out.append(table(rows[0], rows[1:]))
            out.append("")

    os.makedirs(args.out, exist_ok=True)
    if plt is not None:
        title = ("Bielik-1.5B-v3.0-Instruct" if args.checkpoint_kind == "real" else
                 "Bielik-shaped 1.6B, random weights" if args.checkpoint_kind == "random" else
                 os.path.basename(os.path.normpath(model.get("model", "?"))))
        write_plot(plt, png_path, model, torch_result, f"{title}, batch 1, bf16, {model.get('device', '')}",
                   on_targets_gpu, llama)
    elif os.path.exists(png_path):
        os.remove(png_path)
        print(f"make_bench_report: WARNING: matplotlib is not installed: deleted {png_path} (an earlier run's "
              "plot) and wrote the report without one. pip install -r scripts/requirements-bench.txt",
              file=sys.stderr)
    else:
        print("make_bench_report: WARNING: matplotlib is not installed: the report has no plot. "
              "pip install -r scripts/requirements-bench.txt", file=sys.stderr)
    for note in notes:
        print(f"make_bench_report: note: {note}", file=sys.stderr)
    md_path = os.path.join(args.out, name + ".md")
    with open(md_path + ".partial", "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(md_path + ".partial", md_path)
    print(f"make_bench_report: wrote {md_path}" + (f" and {png_path}" if plt is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
