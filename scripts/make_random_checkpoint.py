"""Writes a full-size Bielik-shaped checkpoint with random weights (HF layout).

    python scripts/make_random_checkpoint.py --out models/bielik-shaped-random \
        [--config ../shared/models/bielik-1.5b-v3-config.json]

It has the real model's tensors, names, shapes and dtype (bf16), so it reads exactly
the same bytes per token as the real Bielik-1.5B-v3.0-Instruct: what a speed benchmark
needs. Values: normal(0, 0.02) weights (a common initialisation), small biases, unit
norm weights, so activations stay in a realistic range. Needs torch + safetensors (the
GPU machine has both); random numbers are drawn on the GPU when there is one.

model.safetensors is written last, beside its final name and renamed when whole, so a
folder with that file is complete: an interrupted run leaves none, and the next run
starts again. Refuses a folder that holds a real checkpoint's files (a tokenizer, a
shard index), so random weights never land beside real ones.
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, "..", "..", "shared", "models", "bielik-1.5b-v3-config.json")
PROJECT_CONFIG = os.path.join(HERE, "..", "models", "bielik-1.5b-v3-config.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default=PROJECT_CONFIG if os.path.exists(PROJECT_CONFIG) else DEFAULT_CONFIG)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    done = os.path.join(args.out, "model.safetensors")
    if os.path.exists(done) and os.path.exists(os.path.join(args.out, "config.json")):
        print(f"{args.out}: already there")
        return
    real = [f for f in ("tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json")
            if os.path.exists(os.path.join(args.out, f))]
    if real:
        raise SystemExit(f"make_random_checkpoint: {args.out} holds {', '.join(real)}, a real checkpoint's "
                         "files: not writing random weights there (choose another --out)")
    with open(args.config) as f:
        cfg = json.load(f)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    C, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, Hkv, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    D = cfg.get("head_dim", C // H)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def randn(*shape, std=0.02):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * std).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": randn(V, C), "model.norm.weight": ones(C)}
    if not cfg.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = randn(V, C)
    for i in range(L):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ones(C)
        tensors[p + "post_attention_layernorm.weight"] = ones(C)
        for name, rows in (("q_proj", H * D), ("k_proj", Hkv * D), ("v_proj", Hkv * D)):
            tensors[p + f"self_attn.{name}.weight"] = randn(rows, C)
            if cfg.get("attention_bias"):
                tensors[p + f"self_attn.{name}.bias"] = randn(rows, std=0.01)
        tensors[p + "self_attn.o_proj.weight"] = randn(C, H * D)
        if cfg.get("attention_bias"):
            tensors[p + "self_attn.o_proj.bias"] = randn(C, std=0.01)
        for name, shape in (("gate_proj", (F, C)), ("up_proj", (F, C)), ("down_proj", (C, F))):
            tensors[p + f"mlp.{name}.weight"] = randn(*shape)
            if cfg.get("mlp_bias"):
                tensors[p + f"mlp.{name}.bias"] = randn(shape[0], std=0.01)

    os.makedirs(args.out, exist_ok=True)
    # config.json first, the weights last: each written to a partial file and renamed, so
    # model.safetensors exists only when both are whole. The partial names are fixed, so
    # a run killed outright leaves one file the next run overwrites, not a pile.
    config_partial, weights_partial = os.path.join(args.out, ".config.json.partial"), done + ".partial"
    try:
        with open(config_partial, "w") as f:
            json.dump(cfg, f, indent=1)
        os.replace(config_partial, os.path.join(args.out, "config.json"))
        save_file(tensors, weights_partial, metadata={"format": "pt"})
        os.replace(weights_partial, done)
    except BaseException:  # Ctrl-C included: leave nothing half written
        for path in (config_partial, weights_partial):
            if os.path.exists(path):
                os.remove(path)
        raise
    params = sum(t.numel() for t in tensors.values())
    print(f"{args.out}: {len(tensors)} tensors, {params:,} parameters, {2 * params / 1e9:.2f} GB bf16")


if __name__ == "__main__":
    main()
