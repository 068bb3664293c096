"""Helpers shared by the golden generators (gen_NN_*.py).

Conventions (docs/conventions.md):
  * fixed seeds, so a case is the same on every machine;
  * bf16 tensors are rounded with ml_dtypes and stored as their raw bits ('<u2'),
    because numpy has no bf16 and np.save drops ml_dtypes' dtype;
  * references are computed in float64 from the bf16-rounded inputs, so the
    reference is the exact answer for the inputs the kernel really sees.
"""
import argparse
import os

import ml_dtypes
import numpy as np


def parse_out_dir():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="directory for the .npy cases")
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    return out


def rng(seed):
    return np.random.default_rng(seed)


def to_bf16(x):
    """Rounds to bf16 (nearest even); returns an ml_dtypes.bfloat16 array."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16)


def bf16_values(x):
    """The float64 values a bf16 tensor holds."""
    return np.asarray(x).astype(np.float64)


def save(out, name, array):
    """Saves one tensor; bf16 as '<u2' bits, everything else as is."""
    array = np.ascontiguousarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        array = array.view(np.uint16)
    np.save(os.path.join(out, name + ".npy"), array)
