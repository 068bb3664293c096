"""Golden cases for chapter 07 (KV cache, decode attention over the cache).

The claim the chapter tests: decoding one token over a cache that holds the keys and
values of positions 0..p gives exactly row p of a full-sequence causal attention,

    out[p, h] = softmax(q[p, h] . K[0..p, h // G]^T / sqrt(D)) V[0..p, h // G]

with G = H / Hkv query heads per kv head (GQA, HF's repeat_kv order). So every case is
one sequence of T tokens, and the expected rows are those of causal attention over it,
in float64 from the bf16-rounded inputs.

Decode cases (q rows saved only at the tested positions, K and V for the whole sequence):
  bielik_decode   H=12, Hkv=2, D=128, T=4097; kv lengths 1, 7, 100, 1000, 4097
  smollm2_decode  H=9,  Hkv=3, D=64,  T=4097; same lengths, q scaled x20 so the scores
                  have a spread of ~20 and exp() without the running max would overflow
Step cases (every row; the test prefills part of the sequence, then decodes token by token):
  odd_steps       H=5, Hkv=1, D=64,  T=301  (a group of 5: not a power of two)
  mha_steps       H=3, Hkv=3, D=128, T=77   (G=1: plain multi-head attention)
Prefill case (chapters 04 + 05 + 07 together: RoPE, then attention over the cache):
  prefill_rope    H=12, Hkv=2, D=128, T=777, theta=1e6; q, k before RoPE; expected is
                  causal attention after rotate-half RoPE at positions 0..T-1, all float64.
"""
import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

DECODE_LENGTHS = [1, 7, 100, 1000, 4097]

DECODE_CASES = {
    # name: (H, Hkv, D, T, q_scale, seed)
    "bielik_decode": (12, 2, 128, 4097, 1.0, 701),
    "smollm2_decode": (9, 3, 64, 4097, 20.0, 702),
}
STEP_CASES = {
    "odd_steps": (5, 1, 64, 301, 1.5, 703),
    "mha_steps": (3, 3, 128, 77, 1.0, 704),
}
PREFILL_CASE = ("prefill_rope", 12, 2, 128, 777, 1.0e6, 705)


def causal_attention_rows(q_rows, positions, k, v):
    """Rows `positions` of causal attention. q_rows (R, H, D), k and v (T, Hkv, D), float64.

    Row p attends to keys 0..p only; this is the same number as the p-th row of the full
    (T, T) masked attention, without building the T x T matrix."""
    R, H, D = q_rows.shape
    Hkv = k.shape[1]
    G = H // Hkv
    out = np.empty((R, H, D), dtype=np.float64)
    for r, p in enumerate(positions):
        keys = k[: p + 1]  # (p+1, Hkv, D)
        values = v[: p + 1]
        for h in range(H):
            scores = keys[:, h // G, :] @ q_rows[r, h] / np.sqrt(D)  # (p+1,)
            weights = np.exp(scores - scores.max())
            out[r, h] = weights @ values[:, h // G, :] / weights.sum()
    return out


def rope_rotate_half(x, positions, theta):
    """HF Llama RoPE in float64: pair i with i + D/2. x (T, heads, D)."""
    D = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # (D/2,)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None, :]  # (T, 1, D)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., D // 2:], x[..., : D // 2]], axis=-1)
    return x * cos + rotated * sin


def random_qkv(r, H, Hkv, D, T, q_scale):
    q = to_bf16(r.standard_normal((T, H, D)) * q_scale)
    k = to_bf16(r.standard_normal((T, Hkv, D)))
    v = to_bf16(r.standard_normal((T, Hkv, D)))
    return q, k, v


def main():
    out = parse_out_dir()
    for name, (H, Hkv, D, T, q_scale, seed) in DECODE_CASES.items():
        q, k, v = random_qkv(rng(seed), H, Hkv, D, T, q_scale)
        positions = np.array([n - 1 for n in DECODE_LENGTHS], dtype=np.int32)
        expected = causal_attention_rows(bf16_values(q)[positions], positions, bf16_values(k), bf16_values(v))
        save(out, f"{name}_q_rows", q[positions])  # (R, H, D)
        save(out, f"{name}_positions", positions)  # (R,)
        save(out, f"{name}_k", k)  # (T, Hkv, D)
        save(out, f"{name}_v", v)
        save(out, f"{name}_expected", expected)  # (R, H, D) float64

    for name, (H, Hkv, D, T, q_scale, seed) in STEP_CASES.items():
        q, k, v = random_qkv(rng(seed), H, Hkv, D, T, q_scale)
        positions = np.arange(T)
        expected = causal_attention_rows(bf16_values(q), positions, bf16_values(k), bf16_values(v))
        save(out, f"{name}_q", q)  # (T, H, D)
        save(out, f"{name}_k", k)
        save(out, f"{name}_v", v)
        save(out, f"{name}_expected", expected)  # (T, H, D) float64

    name, H, Hkv, D, T, theta, seed = PREFILL_CASE
    q, k, v = random_qkv(rng(seed), H, Hkv, D, T, 1.0)
    positions = np.arange(T)
    q_rot = rope_rotate_half(bf16_values(q), positions, theta)
    k_rot = rope_rotate_half(bf16_values(k), positions, theta)
    expected = causal_attention_rows(q_rot, positions, k_rot, bf16_values(v))
    save(out, f"{name}_q", q)  # (T, H, D), before RoPE
    save(out, f"{name}_k", k)  # (T, Hkv, D), before RoPE
    save(out, f"{name}_v", v)
    save(out, f"{name}_theta", np.array([theta], dtype=np.float64))
    save(out, f"{name}_expected", expected)  # (T, H, D) float64


if __name__ == "__main__":
    main()
