"""Golden cases for chapter 03 (the linear layer, matmul + bias).

    y = x @ W.T + b        x (T, C_in) bf16, W (C_out, C_in) bf16 (HuggingFace layout),
                           b (C_out,) bf16, y (T, C_out)

Every case stores x, W, b and two references, with and without the bias:
  <case>_x.npy, <case>_W.npy, <case>_b.npy            bf16 bits ('<u2')
  <case>_y_bias.npy, <case>_y_nobias.npy              float32 (see below) or bf16 bits

Random cases: the references are computed in float64 from the bf16-rounded inputs
(the exact answer for what the kernel sees) and stored as float32. Rounding that
float64 once to float32 costs a relative 6e-8, far below the 1e-2 tolerance of a bf16
output, and halves the golden data (the lm_head weight alone is 98 MB).

Exact cases (exact_*): small integers, so every product, every partial sum in fp32 and
the bf16 output are exact (|y| <= 256 fits bf16's 8-bit mantissa). Whatever order a
kernel sums in, its output must equal these bf16 bits.

Rounding cases (rounding_*): integers in -8..8 whose sums go far past 256 (|x W^T| <=
C_in * 64 < 2^17) and a bias in quarter steps (|b| < 64). Every partial sum and the sum
plus the bias are still exact in fp32 (at most 20 significant bits), in any order, but
not in bf16: the stored answer is the exact value rounded to bf16 once (nearest even),
which is what matmul.cuh promises ("bias added in fp32, one rounding to bf16"). A kernel
that rounds the sum to bf16 and then adds the bias rounds twice and misses many of
these bits (the generator checks that it would, and prints how many).

Rows of y are independent (y[t] depends on x[t] only), so the GEMV tests (T <= 8)
reuse the first rows of the T = 64 cases.
"""
import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

RANDOM_CASES = {
    # name: (T, C_in, C_out, seed)
    # odd sizes: none is a multiple of any tile; C_in = 100 is not a multiple of 8
    # (no 16-byte rows: the scalar paths), C_out = 263 is odd (no paired stores)
    "odd_a": (7, 100, 37, 301),
    "odd_b": (33, 72, 130, 302),
    "odd_c": (131, 520, 263, 303),
    # every Bielik projection at a prefill-sized T (C = 1536, F = 8960, V = 32000)
    "q_proj": (64, 1536, 1536, 311),     # also o_proj
    "kv_proj": (64, 1536, 256, 312),     # k_proj, v_proj: Hkv * D = 2 * 128
    "up_proj": (64, 1536, 8960, 313),    # also gate_proj
    "down_proj": (64, 8960, 1536, 314),
    "lm_head": (64, 1536, 32000, 315),
}

EXACT_CASES = {
    # name: (T, C_in, C_out, value range of x and W, bias range, seed)
    "exact_a": (37, 56, 45, 2, 4, 321),     # |y| <= 56*4 + 4 = 228
    "exact_b": (130, 200, 200, 1, 8, 322),  # |y| <= 200 + 8 = 208
    "exact_c": (9, 61, 33, 2, 4, 323),      # C_in % 8 != 0: |y| <= 61*4 + 4 = 248
}

ROUNDING_CASES = {
    # name: (T, C_in, C_out, value range of x and W, seed); bias: quarters in (-64, 64)
    "rounding_a": (70, 1536, 264, 8, 331),  # Bielik's C_in, the 16-byte paths
    "rounding_b": (19, 997, 131, 8, 332),   # C_in % 8 != 0, odd C_out: the scalar paths
}


def reference(x, W, b):
    """float64 x @ W.T (+ b), computed in slices of W to keep memory modest."""
    xd = x.astype(np.float64)
    out = np.empty((x.shape[0], W.shape[0]), dtype=np.float64)
    for start in range(0, W.shape[0], 4096):
        out[:, start:start + 4096] = xd @ W[start:start + 4096].astype(np.float64).T
    return out, out + b.astype(np.float64)


def main():
    out = parse_out_dir()
    for name, (T, C_in, C_out, seed) in RANDOM_CASES.items():
        r = rng(seed)
        x = to_bf16(r.standard_normal((T, C_in), dtype=np.float32))
        # W ~ N(0, 1/C_in) keeps y ~ N(0, 1) whatever C_in is, like a trained layer.
        W = to_bf16(r.standard_normal((C_out, C_in), dtype=np.float32) / np.sqrt(C_in))
        b = to_bf16(0.5 * r.standard_normal(C_out, dtype=np.float32))
        y_nobias, y_bias = reference(x, W, b)
        for suffix, array in (("x", x), ("W", W), ("b", b)):
            save(out, f"{name}_{suffix}", array)
        save(out, f"{name}_y_nobias", y_nobias.astype(np.float32))
        save(out, f"{name}_y_bias", y_bias.astype(np.float32))

    for name, (T, C_in, C_out, value, bias_value, seed) in EXACT_CASES.items():
        r = rng(seed)
        x = r.integers(-value, value + 1, size=(T, C_in))
        W = r.integers(-value, value + 1, size=(C_out, C_in))
        b = r.integers(-bias_value, bias_value + 1, size=C_out)
        y_nobias = x @ W.T  # int64: exact
        y_bias = y_nobias + b
        assert np.abs(y_bias).max() <= 256 and np.abs(y_nobias).max() <= 256
        for suffix, array in (("x", x), ("W", W), ("b", b), ("y_nobias", y_nobias), ("y_bias", y_bias)):
            save(out, f"{name}_{suffix}", to_bf16(array))  # integers <= 256: exact in bf16

    for name, (T, C_in, C_out, value, seed) in ROUNDING_CASES.items():
        r = rng(seed)
        x = r.integers(-value, value + 1, size=(T, C_in))
        W = r.integers(-value, value + 1, size=(C_out, C_in))
        b = r.integers(-255, 256, size=C_out) / 4.0  # 8 significant bits at most: exact in bf16
        y_nobias = x @ W.T  # int64: exact
        y_bias = y_nobias + b  # float64: exact (|y| < 2^17 in quarter steps)
        assert C_in * value * value < 2**17 and np.abs(y_bias).max() < 2**17
        # float32 holds every partial sum and y_bias exactly, so to_bf16 (float32 -> bf16,
        # nearest even) is the one rounding of the exact value.
        assert np.array_equal(y_bias.astype(np.float32).astype(np.float64), y_bias)
        single = to_bf16(y_bias)
        double = to_bf16(bf16_values(to_bf16(y_nobias)) + b)  # the sum rounded before the bias
        differ = np.mean(bf16_values(single) != bf16_values(double))
        assert differ > 0.1, f"{name}: a second rounding would change only {differ:.1%} of the outputs"
        print(f"{name}: T={T} C_in={C_in} C_out={C_out} max |y| {np.abs(y_bias).max():.0f}; "
              f"rounding before the bias would change {differ:.1%} of the outputs")
        for suffix, array in (("x", x), ("W", W), ("b", b), ("y_nobias", y_nobias), ("y_bias", y_bias)):
            save(out, f"{name}_{suffix}", to_bf16(array))


if __name__ == "__main__":
    main()
