"""Golden cases for chapter 02 (RMSNorm and the fused residual add + RMSNorm).

    y[t, c] = x[t, c] / sqrt(mean_c(x[t, :]^2) + eps) * w[c]
        x (T, C) bf16, w (C,) bf16, y (T, C): float64 reference

    fused:  residual[t, :] = bf16(residual[t, :] + x[t, :])   (written back, bf16)
            y = rmsnorm(residual) * w                          (of the rounded sum)

The residual stream stays in bf16 like the HuggingFace model keeps it, so the new
residual is rounded to bf16 (through float32, exactly what a GPU does: one fp32 add,
one fp32 -> bf16 rounding) and stored bit-exact. y is the float64 RMSNorm of the
rounded residual: the exact answer for the values the next layer really sees.

Cases (files <case>_x, <case>_w, <case>_eps, <case>_y; fused: fused_<case>_residual,
fused_<case>_x, fused_<case>_w, fused_<case>_eps, fused_<case>_residual_out,
fused_<case>_y):
  odd       T=7,    C=100   C % 8 != 0: the scalar path; row 3 is all zeros (y = 0)
  vec       T=5,    C=104   C % 8 == 0 but 13 vectors: a warp only partly busy
  bielik    T=4096, C=1536  Bielik's hidden size at a prefill length, eps 1e-6
  bielik_t1 T=1,    C=1536  one decode token
  large     T=16,   C=1536  values ~1e3 with outliers ~3e4: the fp32 sum of squares
                            must neither overflow nor lose the small channels
  tiny      T=8,    C=576   SmolLM2's size, values ~1e-3 so mean(x^2) ~ eps: a kernel
                            that forgets eps (or adds it after the sqrt) fails
"""
import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

CASES = {
    # name: (T, C, eps, seed)
    "odd": (7, 100, 1e-5, 201),
    "vec": (5, 104, 1e-6, 202),
    "bielik": (4096, 1536, 1e-6, 203),
    "bielik_t1": (1, 1536, 1e-6, 204),
    "large": (16, 1536, 1e-6, 205),
    "tiny": (8, 576, 1e-5, 206),
}

FUSED_CASES = {
    "odd": (7, 100, 1e-5, 211),
    "vec": (5, 104, 1e-6, 212),
    "bielik": (4096, 1536, 1e-6, 213),
    "bielik_t1": (1, 1536, 1e-6, 214),
    # a residual ~1e3 plus updates ~1: the bf16 sum drops most of the update's bits,
    # which is what the model does too; the kernel must round exactly like that
    "large": (16, 1536, 1e-6, 215),
}


def rmsnorm_reference(x, w, eps):
    """float64 RMSNorm of bf16 values."""
    x64, w64 = bf16_values(x), bf16_values(w)
    mean_square = np.mean(x64 * x64, axis=-1, keepdims=True)
    return x64 / np.sqrt(mean_square + eps) * w64


def activations(r, name, T, C):
    """Inputs shaped like the model's: N(0,1), or large / tiny ones for the edge cases."""
    x = r.standard_normal((T, C))
    if name == "large":
        x *= 1e3
        outliers = r.choice(C, size=4, replace=False)  # a few "massive activation" channels
        x[:, outliers] = 3e4 * np.sign(r.standard_normal((T, 4)))
    elif name == "tiny":
        x *= 1e-3
    elif name == "odd":
        x[3, :] = 0.0  # an all-zero row: 0 / sqrt(0 + eps) = 0, never NaN
    return x


def norm_weight(r, C):
    # Trained norm weights sit around 1 with a spread; a few negative ones catch sign bugs.
    return to_bf16(1.0 + 0.5 * r.standard_normal(C))


def main():
    out = parse_out_dir()
    for name, (T, C, eps, seed) in CASES.items():
        r = rng(seed)
        x = to_bf16(activations(r, name, T, C))
        w = norm_weight(r, C)
        save(out, f"{name}_x", x)
        save(out, f"{name}_w", w)
        save(out, f"{name}_eps", np.array([eps], dtype=np.float64))
        save(out, f"{name}_y", rmsnorm_reference(x, w, eps))

    for name, (T, C, eps, seed) in FUSED_CASES.items():
        r = rng(seed)
        residual = to_bf16(activations(r, name, T, C))
        update = r.standard_normal((T, C)) * (1.0 if name == "large" else 0.5)
        x = to_bf16(update)
        w = norm_weight(r, C)
        # float64 sum of two bf16 values is exact; to_bf16 rounds it to fp32 and then
        # to bf16, the same two roundings as an fp32 add followed by __float2bfloat16_rn.
        residual_out = to_bf16(bf16_values(residual) + bf16_values(x))
        save(out, f"fused_{name}_residual", residual)
        save(out, f"fused_{name}_x", x)
        save(out, f"fused_{name}_w", w)
        save(out, f"fused_{name}_eps", np.array([eps], dtype=np.float64))
        save(out, f"fused_{name}_residual_out", residual_out)
        save(out, f"fused_{name}_y", rmsnorm_reference(residual_out, w, eps))


if __name__ == "__main__":
    main()
