"""PyTorch SDPA at the shapes of bench_attention, for the chapter 05 comparison.

Run it in the same GPU session as bench_attention:
    python3 chapters/05_flash_attention/bench_sdpa.py

Same method as common/bench.cu: warm-up calls, then the median of CUDA-event timings of
single calls, with the L2 cache scrubbed (a memset of twice its size) before each one.
One difference, in PyTorch's favour: a Python call to SDPA costs tens of microseconds
of CPU time, and if the GPU runs dry meanwhile the events would time that too. So a
~0.5 ms GPU sleep is queued before the start event: the GPU is busy while Python
dispatches, and the events see only the kernels, as they do for a C++ launch.
Same FLOP count: 4 * Tq * Tkv * D * H, halved for a causal square prompt.

The tensors are (1, H, T, D) contiguous, SDPA's native layout (our kernels read the
token-major (T, H, D) layout instead; the head-major copy is made outside the timing).
GQA: enable_gqa=True where this torch supports it with the chosen backend, otherwise
K/V are expanded to H heads with repeat_interleave beforehand (outside the timing); the
"gqa" column says which. Backends: FlashAttention-2 (the one we compare against) and,
for information, cuDNN attention when available.
"""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CASES = [
    # (model, Tq, Tkv, H, Hkv, D) -- keep in sync with bench_attention.cu
    ("Bielik", 512, 512, 12, 2, 128),
    ("Bielik", 2048, 2048, 12, 2, 128),
    ("Bielik", 8192, 8192, 12, 2, 128),
    ("SmolLM2", 2048, 2048, 9, 3, 64),
    ("Bielik decode", 1, 4096, 12, 2, 128),
]
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None))]


def time_ms(fn, scrub, warmup=3, repeats=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        scrub.fill_(i & 0xFF)
        torch.cuda._sleep(1_000_000)  # ~0.5 ms of GPU time that hides Python's dispatch
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def make_call(q, k, v, causal, H, Hkv):
    """Returns (callable, gqa mode); tries native GQA first."""
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)), "enable_gqa"
    except (RuntimeError, TypeError):
        k_full = k.repeat_interleave(H // Hkv, dim=1).contiguous()
        v_full = v.repeat_interleave(H // Hkv, dim=1).contiguous()
        F.scaled_dot_product_attention(q, k_full, v_full, is_causal=causal)
        return (lambda: F.scaled_dot_product_attention(q, k_full, v_full, is_causal=causal)), "repeat_interleave"


def main():
    device = torch.device("cuda")
    properties = torch.cuda.get_device_properties(device)
    l2_bytes = getattr(properties, "L2_cache_size", 50 << 20)
    scrub = torch.empty(2 * l2_bytes, dtype=torch.uint8, device=device)
    print(f"device: {properties.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    rows = []
    for model, Tq, Tkv, H, Hkv, D in CASES:
        generator = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(1, H, Tq, D, device=device, dtype=torch.bfloat16, generator=generator)
        k = torch.randn(1, Hkv, Tkv, D, device=device, dtype=torch.bfloat16, generator=generator)
        v = torch.randn(1, Hkv, Tkv, D, device=device, dtype=torch.bfloat16, generator=generator)
        square = Tq == Tkv
        # Tq = 1 sees every key: no mask needed (is_causal with Tq < Tkv would align the
        # diagonal top-left in PyTorch, which is not our bottom-right convention).
        causal = square
        flops = 4.0 * Tq * Tkv * D * H / (2 if square else 1)
        for backend_name, backend in BACKENDS:
            if backend is None:
                continue
            try:
                with sdpa_kernel(backend):
                    call, gqa = make_call(q, k, v, causal, H, Hkv)
                    ms = time_ms(call, scrub)
            except RuntimeError as error:
                rows.append((f"sdpa_{backend_name}", model, Tq, Tkv, "n/a", "n/a", str(error).splitlines()[0][:60]))
                continue
            rows.append((f"sdpa_{backend_name}", model, Tq, Tkv, f"{ms * 1e3:.1f}", f"{flops / (ms * 1e-3) / 1e12:.1f}",
                         gqa))
    header = ("version", "model", "Tq", "Tkv", "time (us)", "TFLOP/s", "gqa")
    print("\n### sdpa\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


if __name__ == "__main__":
    main()
