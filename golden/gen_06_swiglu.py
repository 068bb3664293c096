"""Golden cases for chapter 06 (the SwiGLU MLP, with optional biases).

    g = x @ Wg.T + bg                 x (T, C), Wg (F, C), bg (F,)   (HuggingFace layout)
    u = x @ Wu.T + bu                 Wu (F, C), bu (F,)
    h = silu(g) * u                   silu(z) = z / (1 + exp(-z)),   h (T, F)
    y = bf16(h) @ Wd.T + bd           Wd (C, F), bd (C,),            y (T, C)

Every case stores the inputs as bf16 bits ('<u2') and four float32 references:
  <case>_x, _Wg, _bg, _Wu, _bu, _Wd, _bd            bf16 bits
  <case>_h_bias, <case>_h_nobias                     (T, F) float32
  <case>_y_bias, <case>_y_nobias                     (T, C) float32

The references are computed in float64 from the bf16-rounded inputs (the exact answer
for what the kernel sees) and stored as float32 (a relative 6e-8, far below the 1e-2
tolerance of a bf16 output). y is computed from h rounded to bf16, because that is
what the model stores between the two halves of the MLP (and what HuggingFace does in
bf16); the down projection then sees exactly those values.

Rows are independent (h[t] and y[t] depend on x[t] only), so the decode tests (T = 1..8)
use the first rows of the T = 64 Bielik case: one 83 MB case instead of two.
"""
import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

CASES = {
    # name: (T, C, F, gate scale, seed)
    # gate scale: the standard deviation of g = x Wg^T (1 like a trained layer's inputs
    # to the activation; 40 for "wide", whose silu inputs reach +-150: exp(-z) overflows
    # fp32 for z < -88 and must give silu = -0, never NaN).
    "odd_a": (7, 100, 37, 1.0, 601),     # C % 8 != 0: no 16-byte rows, the scalar paths
    "odd_b": (33, 72, 200, 1.0, 602),    # C = 72: two 32-wide k tiles and a tail of 8; F = 200 no tile multiple
    "odd_c": (131, 264, 391, 1.0, 603),  # several tiles in T and F, F odd (no paired stores), k tail of 8
    "wide": (9, 64, 48, 40.0, 604),      # saturated silu on both sides
    "bielik": (64, 1536, 8960, 1.0, 611),  # Bielik-1.5B: C = 1536, F = 8960
}


def silu(z):
    """z * sigmoid(z) in float64 without overflow warnings for large |z|."""
    e = np.exp(-np.abs(z))  # in (0, 1]
    sigmoid = np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return z * sigmoid


def linear(x, W, b=None):
    """float64 x @ W.T (+ b), in slices of W to keep memory modest."""
    out = np.empty((x.shape[0], W.shape[0]), dtype=np.float64)
    for start in range(0, W.shape[0], 4096):
        out[:, start:start + 4096] = x @ bf16_values(W[start:start + 4096]).T
    return out if b is None else out + bf16_values(b)


def main():
    out = parse_out_dir()
    for name, (T, C, F, gate_scale, seed) in CASES.items():
        r = rng(seed)
        x = to_bf16(r.standard_normal((T, C), dtype=np.float32))
        # W ~ N(0, 1/C) keeps x W^T ~ N(0, 1) whatever C is, like a trained layer.
        Wg = to_bf16(r.standard_normal((F, C), dtype=np.float32) * (gate_scale / np.sqrt(C)))
        Wu = to_bf16(r.standard_normal((F, C), dtype=np.float32) / np.sqrt(C))
        Wd = to_bf16(r.standard_normal((C, F), dtype=np.float32) / np.sqrt(F))
        bg = to_bf16(0.5 * gate_scale * r.standard_normal(F, dtype=np.float32))
        bu = to_bf16(0.5 * r.standard_normal(F, dtype=np.float32))
        bd = to_bf16(0.5 * r.standard_normal(C, dtype=np.float32))

        xd = bf16_values(x)
        g, u = linear(xd, Wg), linear(xd, Wu)
        h_nobias = silu(g) * u
        h_bias = silu(g + bf16_values(bg)) * (u + bf16_values(bu))
        y_nobias = linear(bf16_values(to_bf16(h_nobias)), Wd)
        y_bias = linear(bf16_values(to_bf16(h_bias)), Wd, bd)

        for suffix, array in (("x", x), ("Wg", Wg), ("bg", bg), ("Wu", Wu), ("bu", bu), ("Wd", Wd), ("bd", bd)):
            save(out, f"{name}_{suffix}", array)
        for suffix, array in (("h_nobias", h_nobias), ("h_bias", h_bias), ("y_nobias", y_nobias),
                              ("y_bias", y_bias)):
            assert np.isfinite(array).all()
            save(out, f"{name}_{suffix}", array.astype(np.float32))


if __name__ == "__main__":
    main()
