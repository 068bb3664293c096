"""Checks the CUDA backend's logits against HF transformers on the same checkpoint.

    python scripts/compare_hf_logits.py --model models/bielik-shaped-random \
        --dump-logits build/chapters/08_bielik/dump_logits [--tokens 64] [--out build/bench/hf_logits.json]

Draws a fixed random prompt, runs it through `dump_logits --device cuda` (this project)
and through transformers' LlamaForCausalLM in bf16 on the GPU (the model as its users
run it), and reports per-position relative norm error of the logits and how often the
top-1 token agrees. Both sides round activations to bf16, differently, so the bar is
the book's bf16 rule: relative norm error <= 2e-2 at every position. Exit code 1 if not.
"""
import argparse
import json
import os
import subprocess
import tempfile

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

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    with torch.inference_mode():
        theirs = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy().astype(np.float64)

    errors = np.linalg.norm(ours - theirs, axis=1) / np.linalg.norm(theirs, axis=1)
    top1 = float(np.mean(ours.argmax(1) == theirs.argmax(1)))
    result = {"model": args.model, "tokens": args.tokens, "max_rel_norm_error": float(errors.max()),
              "mean_rel_norm_error": float(errors.mean()), "top1_agreement": top1,
              "tolerance": args.tolerance, "passed": bool(errors.max() <= args.tolerance),
              "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    raise SystemExit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
