#!/usr/bin/env python3
"""HF transformers' greedy answer on our SmolLM2 checkpoint: the reference for CpuModel.

tests/test_smollm2_reference.cpp runs our CPU backend on the same prompt ids and must
produce the same greedy ids. Both read the SAME files (models/smollm2-135m-instruct,
written by scripts/prepare_smollm2.py), so this checks our loader, tokenizer, chat
template and forward pass against HF's LlamaForCausalLM and HF's tokenizer on
identical weights; it says nothing about how faithful the GGUF conversion is (that is
prepare_smollm2.py's own check).

What is computed, and why this way:
  * the prompt text comes from HF's apply_chat_template (the Jinja in
    tokenizer_config.json, with SmolLM2's default system turn), and is asserted equal
    to the text chapter 08's ChatTemplate::render writes for one user message with no
    system prompt of ours -- what `bielik-chat --prompt` sends;
  * ids: HF's tokenizer on that text, no BOS (the template does not render bos_token);
  * the model in float32 (the bf16 weights widened exactly, as our CPU backend does),
    eager attention, on the CPU;
  * greedy: argmax at every step, 24 new tokens, not stopped at <|im_end|> (the test
    generates the same fixed count; the ids after the answer's <|im_end|> are the
    model rambling on, still a fixed function of the weights, so still compared).
    Each step's top1 - top2 logit margin is stored so a mismatch can be told apart
    from a near-tie.

Needs torch, transformers, tokenizers, safetensors, in a separate venv (.venv-ref,
git-ignored). `pip install torch transformers safetensors tokenizers` works but pulls
every CUDA library torch's Linux wheel depends on (several GB). Where a CUDA toolkit is
installed (as here: /usr/local/cuda-13.0), torch 2.15's wheel runs on the CPU with
only the few libraries the toolkit lacks (~0.9 GB in all):

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install --no-deps torch==2.15.0 nvidia-cufile nvidia-cusparselt-cu13==0.8.1 \
        nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7
    .venv-ref/bin/pip install filelock typing-extensions sympy networkx jinja2 fsspec \
        numpy transformers safetensors tokenizers
    .venv-ref/bin/python scripts/reference_smollm2_hf.py     # ~1 min on 2 cores

Writes tests/data/smollm2_hf_reference.json (commit it; it is small).
"""
import argparse
import json
import os
import re
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTION = "What is the capital of France?"
NEW_TOKENS = 24
TOP = 5


def our_render(system_default, user_text):
    """chapter 08's ChatTemplate::render for [user] with the template's default system turn."""
    return (f"<|im_start|>system\n{system_default}<|im_end|>\n"
            f"<|im_start|>user\n{user_text}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def compact_lists(text):
    """Indented JSON with each list of numbers on one line (readable diffs, short file)."""
    def one_line(match):
        return json.dumps(json.loads(match.group(0)))
    return re.sub(r"\[[-0-9.e,\s]+\]", one_line, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "smollm2-135m-instruct"))
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "smollm2_hf_reference.json"))
    args = parser.parse_args()
    torch.manual_seed(0)  # nothing is random; fixed anyway

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompt_text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                                add_generation_prompt=True)
    expected = our_render("You are a helpful AI assistant named SmolLM, trained by Hugging Face", QUESTION)
    if prompt_text != expected:
        sys.exit(f"HF's chat template renders {prompt_text!r}, chapter 08 renders {expected!r}")
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    # Greedy, each step a full forward over prompt + answer so far (no KV cache: 24
    # short forwards are cheap, and the reference then depends on no cache API).
    greedy, margins, first_top = [], [], None
    with torch.no_grad():
        for step in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([prompt_ids + greedy], dtype=torch.long)).logits[0, -1]
            values, indices = torch.topk(logits.float(), TOP)
            if step == 0:
                first_top = {"ids": [int(i) for i in indices], "values": [float(v) for v in values]}
            greedy.append(int(indices[0]))
            margins.append(float(values[0] - values[1]))

    answer_end = greedy.index(stop_id) if stop_id in greedy else len(greedy)
    reference = {
        "about": "HF transformers greedy decode of SmolLM2-135M-Instruct (our converted checkpoint), "
                 "written by scripts/reference_smollm2_hf.py; checked by tests/test_smollm2_reference.cpp",
        "model_dir": os.path.relpath(args.model, ROOT),
        "model_source": json.load(open(os.path.join(args.model, "config.json"))).get("_source", ""),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "dtype": "float32 (bf16 weights widened)",
        "attn_implementation": "eager",
        "question": QUESTION,
        "prompt_text": prompt_text,
        "prompt_ids": prompt_ids,
        "new_tokens": NEW_TOKENS,
        "greedy_ids": greedy,
        "greedy_text": tokenizer.decode(greedy),
        "answer_text": tokenizer.decode(greedy[:answer_end]),
        "stop_id": stop_id,
        "step_margins": [round(m, 5) for m in margins],
        "first_step_top": first_top,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(compact_lists(json.dumps(reference, ensure_ascii=False, indent=1)) + "\n")
    print(f"prompt: {len(prompt_ids)} ids; greedy: {greedy}")
    print(f"answer: {reference['answer_text']!r}")
    print(f"smallest step margin: {min(margins):.4f} (step {margins.index(min(margins))})")
    print(f"wrote {os.path.relpath(args.out, ROOT)}")


if __name__ == "__main__":
    main()
