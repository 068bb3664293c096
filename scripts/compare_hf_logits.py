"""Checks the CUDA backend's logits against HF transformers on the same checkpoint.

    python scripts/compare_hf_logits.py --model models/bielik-shaped-random \
        --dump-logits build/chapters/08_bielik/dump_logits [--tokens 64] [--out build/bench/hf_logits.json]

Draws a fixed random prompt, runs it through `dump_logits --device cuda` (this project)
and through transformers' LlamaForCausalLM twice on the GPU: in bf16 (the model as its
users run it) and in fp32 (the same bf16 weights, activations kept in fp32: the ground
truth). Reports, per position, the relative norm error of the logits and how often the
top-1 token agrees.

Why an fp32 reference: both bf16 runs round every activation to bf16, at different
places, and with random weights 32 layers amplify that rounding (no trained structure
damps it), so "ours vs HF bf16" alone cannot tell a bug from rounding. The bar: our
error against fp32 at most max(tolerance, 1.25 x HF bf16's own error against fp32)
at every position, i.e. we are as close to the exact answer as HF's bf16 path is.
Exit code 1 if not.
"""
import argparse
import json
import os
import subprocess
import tempfile
from datetime import datetime, timezone

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dump-logits", required=True, help="path of the dump_logits program")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--tolerance", type=float, default=2e-2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    ids = np.random.default_rng(1234).integers(3, vocab, size=args.tokens).tolist()

    with tempfile.TemporaryDirectory() as tmp:
        ours_path = os.path.join(tmp, "ours.npy")
        subprocess.run([args.dump_logits, "--model", args.model, "--device", "cuda", "--tokens",
                        ",".join(map(str, ids)), "--out", ours_path], check=True)
        ours = np.load(ours_path).astype(np.float64)

    def hf_logits(dtype):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
        model = model.to(dtype).cuda().eval()  # fp32: the bf16 weights widened exactly
        with torch.inference_mode():
            out = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy().astype(np.float64)
        del model
        torch.cuda.empty_cache()
        return out

    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference really in fp32
    torch.backends.cudnn.allow_tf32 = False
    hf_bf16 = hf_logits(torch.bfloat16)
    exact = hf_logits(torch.float32)

    def rel(a, b):
        return np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)

    ours_vs_exact, hf_vs_exact, ours_vs_hf = rel(ours, exact), rel(hf_bf16, exact), rel(ours, hf_bf16)
    bar = np.maximum(args.tolerance, 1.25 * hf_vs_exact)

    def summary(errors):
        return {"max": float(errors.max()), "mean": float(errors.mean()), "first_position": float(errors[0]),
                "last_position": float(errors[-1])}

    result = {"model": args.model, "tokens": args.tokens,
              "ours_vs_fp32": summary(ours_vs_exact), "hf_bf16_vs_fp32": summary(hf_vs_exact),
              "ours_vs_hf_bf16": summary(ours_vs_hf),
              "top1_agreement_ours_vs_fp32": float(np.mean(ours.argmax(1) == exact.argmax(1))),
              "top1_agreement_hf_bf16_vs_fp32": float(np.mean(hf_bf16.argmax(1) == exact.argmax(1))),
              "top1_agreement_ours_vs_hf_bf16": float(np.mean(ours.argmax(1) == hf_bf16.argmax(1))),
              "rule": "ours_vs_fp32 <= max(tolerance, 1.25 * hf_bf16_vs_fp32) at every position",
              "tolerance": args.tolerance, "passed": bool(np.all(ours_vs_exact <= bar)),
              "torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    raise SystemExit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
