"""PyTorch + HF transformers baseline on the same checkpoint and GPU.

    python scripts/bench_pytorch.py --model models/bielik-shaped-random --out build/bench/pytorch.json

Measures, batch 1, bf16:
  * TTFT (prefill) at prompts of 16, 128, 512, 2048 tokens, eager;
  * decode tokens/s over --new-tokens tokens (EOS ignored), eager with HF's DynamicCache;
  * decode tokens/s with the strongest plain-PyTorch recipe: HF StaticCache, the
    one-token step under torch.compile(mode="reduce-overhead") (CUDA graphs),
    torch.compiler.cudagraph_mark_step_begin() before each step, outputs cloned.
Every time is the median of CUDA-event timings after warm-up.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def cuda_time_ms(fn, repeats=5, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def prompt(model, length, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (1, length), generator=g).cuda()


@torch.inference_mode()
def bench_prefill(model, lengths):
    return {n: cuda_time_ms(lambda: model(prompt(model, n), use_cache=True)) for n in lengths}


@torch.inference_mode()
def bench_decode_eager(model, new_tokens, prompt_len=16):
    from transformers import DynamicCache

    def run():
        cache = DynamicCache()
        out = model(prompt(model, prompt_len), past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(new_tokens):
            out = model(token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        return token

    run()  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return new_tokens / total


@torch.inference_mode()
def bench_decode_compiled(model, new_tokens, prompt_len=16):
    from transformers import StaticCache

    max_len = prompt_len + new_tokens + 8
    try:
        cache = StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:
        cache = StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len, device="cuda",
                            dtype=torch.bfloat16)

    def step(token, position):
        out = model(token, past_key_values=cache, cache_position=position, position_ids=position.unsqueeze(0),
                    use_cache=True)
        return out.logits[:, -1:].argmax(-1)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=False)

    def run():
        cache.reset()
        ids = prompt(model, prompt_len)
        positions = torch.arange(prompt_len, device="cuda")
        out = model(ids, past_key_values=cache, cache_position=positions, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        for i in range(new_tokens):
            torch.compiler.cudagraph_mark_step_begin()
            position = torch.tensor([prompt_len + i], device="cuda")
            token = compiled(token, position).clone()
        return token

    run()  # compile + capture
    run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return new_tokens / (time.perf_counter() - t0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--skip-compiled", action="store_true")
    args = parser.parse_args()

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import transformers

    result["transformers"] = transformers.__version__
    result["prefill_ms"] = bench_prefill(model, [16, 128, 512, 2048])
    print("eager prefill ms:", result["prefill_ms"], flush=True)
    result["decode_eager_tok_s"] = bench_decode_eager(model, args.new_tokens)
    print("eager decode tok/s:", result["decode_eager_tok_s"], flush=True)
    result["peak_memory_gb_eager"] = torch.cuda.max_memory_allocated() / 1e9
    if not args.skip_compiled:
        try:
            result["decode_compiled_tok_s"] = bench_decode_compiled(model, args.new_tokens)
            print("compiled static-cache decode tok/s:", result["decode_compiled_tok_s"], flush=True)
        except Exception as error:  # report, don't hide: the number is then missing
            result["decode_compiled_error"] = repr(error)[:500]
            print("compiled decode failed:", result["decode_compiled_error"], flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
