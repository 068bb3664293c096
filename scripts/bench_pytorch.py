"""PyTorch + HF transformers baseline on the same checkpoint and GPU.

    python scripts/bench_pytorch.py --model models/bielik-shaped-random --out build-bench/bench/pytorch.json \
        [--new-tokens 256] [--runs 5] [--prefill-runs 7] [--skip-compiled]

Measures, batch 1, bf16, the way bench_model (chapter 08) measures this project, so the
report's ratios compare like with like:
  * TTFT (prefill) at prompts of 16, 128, 512, 2048 tokens, eager, each from an empty
    cache: the forward pass with the lm_head on the last position only (logits_to_keep=1,
    or num_logits_to_keep on transformers 4.45-4.49; every position's logits on older
    ones, which the JSON then says) and that position's logits copied to the host. The
    median of --prefill-runs host-clock runs after two warm-ups; prompts made beforehand.
  * decode tokens/s over --new-tokens greedy tokens (EOS ignored) after a 16-token
    prompt, eager with HF's DynamicCache. The prefill runs before the clock starts; the
    clock covers the decode steps only (argmax on the GPU, no host round trip per
    token). The median of --runs runs after one warm-up.
  * the same with the strongest plain-PyTorch recipe: HF StaticCache, the one-token step
    under torch.compile(mode="reduce-overhead") (CUDA graphs),
    torch.compiler.cudagraph_mark_step_begin() before each step, the step's output
    cloned. Position tensors are made before the clock starts. Two warm-up runs
    (compile, then graph capture), then the median of --runs runs.
Writes JSON for scripts/make_bench_report.py: the device and checkpoint (the report
checks both against model.json), versions, the methodology's counts, the results.
"""
import argparse
import inspect
import json
import statistics
import time
from datetime import datetime, timezone

import torch
from transformers import AutoModelForCausalLM

PROMPT_LENGTHS = [16, 128, 512, 2048]
DECODE_PROMPT_TOKENS = 16


def utc_now():
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def prompt(model, length, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (1, length), generator=g).cuda()


class ForwardArguments:
    """The names this transformers' forward() takes, looked up in its signature rather than
    tried: recent forward()s take **kwargs, which would swallow a name they do not know.
      keep_last: the argument that computes the lm_head on the last position only, as this
        project's prefill does (logits_to_keep from 4.50, num_logits_to_keep in 4.45-4.49,
        none before: then every position's logits, which `keep_last_text` says);
      cache: the KV cache's name (past_key_values; `cache` from the 5.x releases that
        renamed it, which still map the old name until they drop it);
      cache_position: whether positions in a StaticCache are passed in (before the 5.x
        releases whose StaticCache counts its own length on the GPU)."""

    def __init__(self, model):
        parameters = inspect.signature(model.forward).parameters
        self.keep_last, self.keep_last_text = {}, "prefill computing every position's logits (no logits_to_keep)"
        for name in ("logits_to_keep", "num_logits_to_keep"):
            if name in parameters:
                self.keep_last, self.keep_last_text = {name: 1}, f"prefill with {name}=1"
                break
        self.cache = "cache" if "cache" in parameters else "past_key_values"
        self.takes_cache_position = "cache_position" in parameters

    def with_cache(self, cache, positions=None, **kwargs):
        kwargs[self.cache] = cache
        if positions is not None and self.takes_cache_position:
            kwargs["cache_position"] = positions
        return kwargs


@torch.inference_mode()
def bench_prefill(model, lengths, runs, forward_args, warmup=2):
    result = {}
    for n in lengths:
        ids = prompt(model, n, seed=100 + n)  # made before the clock starts

        def run():
            out = model(ids, use_cache=True, **forward_args.keep_last)  # a fresh DynamicCache each call: empty
            return out.logits[0, -1].float().cpu()  # the first token's logits on the host, as ours

        times = []
        for r in range(warmup + runs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()  # .cpu() waits for the GPU
            if r >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
        result[n] = statistics.median(times)
    return result


def decode_rate(prefill, step, new_tokens, runs, warmup):
    """Median tokens/s of `runs` runs after `warmup` ones: prefill() (untimed) fills a
    fresh cache and returns the first token, then new_tokens calls of step(token, i) are
    timed, queued back to back, with one synchronize at the end."""
    rates = []
    for r in range(warmup + runs):
        token = prefill()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(new_tokens):
            token = step(token, i)
        torch.cuda.synchronize()
        if r >= warmup:
            rates.append(new_tokens / (time.perf_counter() - start))
    return statistics.median(rates)


@torch.inference_mode()
def bench_decode_eager(model, new_tokens, runs, forward_args):
    from transformers import DynamicCache

    ids = prompt(model, DECODE_PROMPT_TOKENS, seed=7)
    state = {}

    def prefill():
        state["cache"] = DynamicCache()
        out = model(ids, use_cache=True, **forward_args.with_cache(state["cache"], **forward_args.keep_last))
        return out.logits[:, -1:].argmax(-1)

    def step(token, i):
        out = model(token, use_cache=True, **forward_args.with_cache(state["cache"]))
        return out.logits[:, -1:].argmax(-1)

    return decode_rate(prefill, step, new_tokens, runs, warmup=1)


@torch.inference_mode()
def bench_decode_compiled(model, new_tokens, runs, forward_args):
    from transformers import StaticCache

    max_len = DECODE_PROMPT_TOKENS + new_tokens + 8
    try:
        cache = StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:  # transformers before the lazily allocated StaticCache
        cache = StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len, device="cuda",
                            dtype=torch.bfloat16)

    def one_token(token, position):
        out = model(token, position_ids=position.unsqueeze(0), use_cache=True,
                    **forward_args.with_cache(cache, position))
        return out.logits[:, -1:].argmax(-1)

    compiled = torch.compile(one_token, mode="reduce-overhead", fullgraph=False)
    ids = prompt(model, DECODE_PROMPT_TOKENS, seed=7)
    prefill_positions = torch.arange(DECODE_PROMPT_TOKENS, device="cuda")
    # One small tensor per step, copied to the GPU now rather than inside the timed loop.
    positions = [torch.tensor([DECODE_PROMPT_TOKENS + i], device="cuda") for i in range(new_tokens)]

    def prefill():
        cache.reset()
        out = model(ids, use_cache=True,
                    **forward_args.with_cache(cache, prefill_positions, **forward_args.keep_last))
        return out.logits[:, -1:].argmax(-1)

    def step(token, i):
        torch.compiler.cudagraph_mark_step_begin()
        # The graph's output buffer is overwritten by the next replay: keep a copy.
        return compiled(token, positions[i]).clone()

    return decode_rate(prefill, step, new_tokens, runs, warmup=2)  # compile, then capture


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5, help="timed decode runs (the median is reported)")
    parser.add_argument("--prefill-runs", type=int, default=7, help="timed prefill runs per prompt length")
    parser.add_argument("--skip-compiled", action="store_true")
    args = parser.parse_args()
    for name in ("new_tokens", "runs", "prefill_runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")

    import transformers

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    forward_args = ForwardArguments(model)
    result = {"device": torch.cuda.get_device_name(), "model": args.model, "torch": torch.__version__,
              "transformers": transformers.__version__, "prefill_runs": args.prefill_runs,
              "prefill_last_logits": forward_args.keep_last_text, "decode_prompt_tokens": DECODE_PROMPT_TOKENS,
              "decode_tokens": args.new_tokens, "decode_runs": args.runs}
    result["prefill_ms"] = bench_prefill(model, PROMPT_LENGTHS, args.prefill_runs, forward_args)
    print("eager prefill ms:", result["prefill_ms"], flush=True)
    result["decode_eager_tok_s"] = bench_decode_eager(model, args.new_tokens, args.runs, forward_args)
    print("eager decode tok/s:", result["decode_eager_tok_s"], flush=True)
    result["peak_memory_gb_eager"] = torch.cuda.max_memory_allocated() / 1e9
    if not args.skip_compiled:
        try:
            result["decode_compiled_tok_s"] = bench_decode_compiled(model, args.new_tokens, args.runs, forward_args)
            print("compiled static-cache decode tok/s:", result["decode_compiled_tok_s"], flush=True)
        except Exception as error:  # report, don't hide: the number is then missing
            result["decode_compiled_error"] = repr(error)[:500]
            print("compiled decode failed:", result["decode_compiled_error"], flush=True)
    result["finished_utc"] = utc_now()  # the report says when each of its parts was measured
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
