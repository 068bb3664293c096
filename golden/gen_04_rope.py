"""Golden cases for chapter 04 (rotary position embedding, HF "rotate half" layout).

    inv_freq[i] = theta ** (-2 i / D),  i < D/2
    x[i]       = x[i] * cos(pos * inv_freq[i]) - x[i + D/2] * sin(pos * inv_freq[i])
    x[i + D/2] = x[i + D/2] * cos(...)          + x[i] * sin(...)

q (T, H, D) and k (T, Hkv, D) are bf16; the expected outputs are float64, computed
with float64 angles from the bf16 inputs. Positions reach 8191 (the end of Bielik's
context), where a float32 angle pos * inv_freq is visibly off (printed below).
Cases: odd head counts (H=3, Hkv=1, T=7) at D=64 and D=128, SmolLM2's heads
(theta 1e5, D=64), Bielik's heads (theta 1e6, D=128) for a 512-token prompt appended
after 7680 cached tokens, a single decode token, and D=40: even but not a multiple of
16, so v1 and v2 must handle it and v3 must refuse it.
"""
import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

MAX_POSITIONS = 8192

CASES = {
    # name: (T, H, Hkv, D, theta, positions or None for random, seed)
    "odd64": (7, 3, 1, 64, 1e5, [0, 1, 2, 100, 4095, 8190, 8191], 401),
    "odd128": (7, 3, 1, 128, 1e6, [8191, 0, 17, 3000, 1, 8000, 511], 402),
    "smollm2": (33, 9, 3, 64, 1e5, list(range(33)), 403),
    "bielik": (512, 12, 2, 128, 1e6, list(range(7680, 8192)), 404),
    "decode": (1, 12, 2, 128, 1e6, [5000], 405),
    "d40": (9, 5, 1, 40, 1e4, [0, 1, 2, 3, 1000, 4096, 8000, 8190, 8191], 406),
}


def rope_reference(x, positions, theta, angle_dtype=np.float64):
    """x (T, heads, D) float64; the angle is computed in angle_dtype (float32 = HF's way)."""
    D = x.shape[-1]
    half = D // 2
    exponents = (np.arange(0, D, 2, dtype=angle_dtype) / angle_dtype(D)).astype(angle_dtype)
    inv_freq = (angle_dtype(1.0) / (angle_dtype(theta) ** exponents)).astype(angle_dtype)
    angles = (np.asarray(positions, dtype=angle_dtype)[:, None] * inv_freq[None, :]).astype(angle_dtype)
    c = np.cos(angles.astype(np.float64))[:, None, :]
    s = np.sin(angles.astype(np.float64))[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rel_err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def main():
    out = parse_out_dir()
    for name, (T, H, Hkv, D, theta, positions, seed) in CASES.items():
        r = rng(seed)
        q = to_bf16(r.standard_normal((T, H, D)))
        k = to_bf16(r.standard_normal((T, Hkv, D)))
        positions = np.asarray(positions, dtype=np.int32)
        assert positions.shape == (T,) and positions.max() < MAX_POSITIONS
        q_expected = rope_reference(bf16_values(q), positions, theta)
        k_expected = rope_reference(bf16_values(k), positions, theta)
        save(out, f"{name}_q", q)
        save(out, f"{name}_k", k)
        save(out, f"{name}_positions", positions)
        save(out, f"{name}_theta", np.array([theta], dtype=np.float64))
        save(out, f"{name}_q_expected", q_expected)
        save(out, f"{name}_k_expected", k_expected)
        # What the two unavoidable error sources cost, for the README: storing the
        # result in bf16, and HF's float32 angles (v1 computes them the same way).
        bf16_rounding = rel_err(bf16_values(to_bf16(q_expected)), q_expected)
        float32_angles = rel_err(rope_reference(bf16_values(q), positions, theta, np.float32), q_expected)
        print(f"{name}: T={T} H={H} Hkv={Hkv} D={D} theta={theta:g} max pos={positions.max()}  "
              f"bf16 rounding rel err {bf16_rounding:.2e}, float32 angles rel err {float32_angles:.2e}")


if __name__ == "__main__":
    main()
