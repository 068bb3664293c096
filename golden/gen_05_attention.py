"""Golden cases for chapter 05 (causal attention with GQA, q_len <= kv_len).

    out[i, h] = softmax_j( q[i, h] . k[j, h // (H/Hkv)] / sqrt(D) ) @ v[:, h // (H/Hkv)]
    over keys j = 0 .. (Tkv - Tq + i)           (causal with a diagonal offset)

q (Tq, H, D), k and v (Tkv, Hkv, D) bf16, token-major as the QKV projection writes
them; the expected output (Tq, H, D) is float64, computed from the bf16 inputs.
Cases: T = 1, 7, 100, 513 and 2048 with Bielik's heads (H=12, Hkv=2, D=128);
SmolLM2's heads (H=9, Hkv=3, D=64) at odd T; queries appended to a longer context
(q 5 over kv 37, q 1 over kv 300, q 70 over kv 333); multi-query (Hkv=1) and plain
multi-head (Hkv=H) grouping; and "sharp" scores (q scaled by 40) where the softmax is
nearly one-hot and a missing max subtraction would overflow: half of its rows have a
largest score above 88.7, where exp() leaves fp32 (main() asserts the case gets there).
"""
import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

FP32_EXP_LIMIT = 88.72  # log(FLT_MAX): exp() of a larger score is inf in fp32

CASES = {
    # name: (Tq, Tkv, H, Hkv, D, q_scale, seed)
    "t1": (1, 1, 12, 2, 128, 1.0, 501),
    "t7": (7, 7, 12, 2, 128, 1.0, 502),
    "t100": (100, 100, 12, 2, 128, 1.0, 503),
    "t513": (513, 513, 12, 2, 128, 1.0, 504),
    "t2048": (2048, 2048, 12, 2, 128, 1.0, 505),
    "smollm2_t37": (37, 37, 9, 3, 64, 1.0, 506),
    "smollm2_t301": (301, 301, 9, 3, 64, 1.0, 507),
    "q5_kv37": (5, 37, 12, 2, 128, 1.0, 508),
    "q1_kv300": (1, 300, 12, 2, 128, 1.0, 509),
    "q70_kv333_d64": (70, 333, 9, 3, 64, 1.0, 510),
    "mqa_t65": (65, 65, 3, 1, 64, 1.0, 511),
    "mha_t33": (33, 33, 4, 4, 128, 1.0, 512),
    "sharp_t129": (129, 129, 12, 2, 128, 40.0, 513),
}


def visible_scores(q, k, h):
    """Head h's scaled scores (Tq, Tkv) float64, -inf where the key is in the future."""
    Tq, H, D = q.shape
    Tkv, Hkv, _ = k.shape
    visible = np.arange(Tkv)[None, :] <= (Tkv - Tq + np.arange(Tq))[:, None]
    scores = q[:, h, :] @ k[:, h // (H // Hkv), :].T / np.sqrt(D)
    return np.where(visible, scores, -np.inf)


def attention_reference(q, k, v):
    """q (Tq, H, D), k/v (Tkv, Hkv, D) float64 -> (Tq, H, D) float64."""
    Tq, H, D = q.shape
    group = H // k.shape[1]
    out = np.empty((Tq, H, D))
    for h in range(H):
        scores = visible_scores(q, k, h)
        scores -= scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[:, h // group, :]
    return out


def main():
    out = parse_out_dir()
    for name, (Tq, Tkv, H, Hkv, D, q_scale, seed) in CASES.items():
        r = rng(seed)
        q = to_bf16(q_scale * r.standard_normal((Tq, H, D)))
        k = to_bf16(r.standard_normal((Tkv, Hkv, D)))
        v = to_bf16(r.standard_normal((Tkv, Hkv, D)))
        if name.startswith("sharp"):
            # The case exists to catch a kernel that exponentiates without subtracting the
            # row max: it only does if some score really overflows exp() in fp32.
            largest = max(visible_scores(bf16_values(q), bf16_values(k), h).max() for h in range(H))
            if not largest > FP32_EXP_LIMIT:
                raise ValueError(f"{name}: largest score {largest:.1f} <= {FP32_EXP_LIMIT}; raise q_scale")
        save(out, f"{name}_q", q)
        save(out, f"{name}_k", k)
        save(out, f"{name}_v", v)
        save(out, f"{name}_expected", attention_reference(bf16_values(q), bf16_values(k), bf16_values(v)))


if __name__ == "__main__":
    main()
