"""Golden cases for chapter 01 (embedding lookup).

    out = table[token_ids]            table (V, C) bf16, token_ids (T,) int32

A gather copies values, so the expected output is bit-exact and stored as bf16.
Cases: odd sizes that are not multiples of the 8-wide vectors (C = 100), a vector-
friendly odd size (C = 104), and Bielik's shape (V = 32000, C = 1536, T = 4096).
"""
import numpy as np

from golden_common import parse_out_dir, rng, save, to_bf16

CASES = {
    # name: (T, C, V, seed)
    "odd": (7, 100, 37, 101),
    "vec": (13, 104, 50, 102),
    "bielik": (4096, 1536, 32000, 103),
}


def main():
    out = parse_out_dir()
    for name, (T, C, V, seed) in CASES.items():
        r = rng(seed)
        table = to_bf16(r.standard_normal((V, C)))
        ids = r.integers(0, V, size=T).astype(np.int32)
        ids[0], ids[-1] = 0, V - 1  # both ends of the vocabulary
        save(out, f"{name}_table", table)
        save(out, f"{name}_ids", ids)
        save(out, f"{name}_expected", table[ids])


if __name__ == "__main__":
    main()
