"""Tests scripts/checkpoint_to_gguf.py on chapter 08's tiny Bielik-shaped checkpoint.

    python3 scripts/test_checkpoint_to_gguf.py      (ctest: test_checkpoint_to_gguf)

The file it writes is read back with gguf-py's GGUFReader (llama.cpp's own reader) and
checked against the safetensors it came from, value by value: llama.cpp's hyperparameter
keys, every tensor's name, type and shape, the q and k rows in llama.cpp's RoPE order
(written out index by index here, not with the converter's reshape), f16 values equal to
the bf16 ones, bf16 bits unchanged. Then broken inputs: each must stop with the file's
name and the problem, and leave no GGUF behind.

Needs numpy, ml_dtypes and gguf. Without gguf in this Python it re-runs itself with
.venv-models/bin/python (`make models` makes it, with gguf from PyPI; CI runs it first),
or uses third_party/llama.cpp/gguf-py (scripts/fetch_llamacpp.sh); with neither it exits
77, which ctest reports as skipped.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONVERTER = os.path.join(HERE, "checkpoint_to_gguf.py")
THIRD_PARTY_GGUF = os.path.join(ROOT, "third_party", "llama.cpp", "gguf-py")
MODELS_PYTHON = os.path.join(ROOT, ".venv-models", "bin", "python")

try:
    import gguf  # noqa: F401
    GGUF_ARGS = []
except ImportError:
    if os.path.isdir(os.path.join(THIRD_PARTY_GGUF, "gguf")):
        sys.path.insert(0, THIRD_PARTY_GGUF)
        GGUF_ARGS = ["--gguf-py", THIRD_PARTY_GGUF]
    elif os.access(MODELS_PYTHON, os.X_OK) and \
            os.path.realpath(sys.prefix) != os.path.realpath(os.path.dirname(os.path.dirname(MODELS_PYTHON))):
        os.execv(MODELS_PYTHON, [MODELS_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])
    else:
        print("SKIPPED: no gguf package (make models, or scripts/fetch_llamacpp.sh)")
        sys.exit(77)
    import gguf  # noqa: F401

import ml_dtypes
import numpy as np
from gguf import GGUFReader

FAILURES = []


def check(condition, what):
    if not condition:
        FAILURES.append(what)
        print(f"FAILED: {what}")


def convert(model, out, *extra):
    """The converter's exit status and stderr."""
    result = subprocess.run([sys.executable, CONVERTER, "--model", model, "--out", out] + GGUF_ARGS + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return result.returncode, result.stderr


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16", name
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=ml_dtypes.bfloat16).reshape(info["shape"])
    return out


def field_value(reader, key):
    f = reader.get_field(key)
    if f is None:
        return None
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]][0]


def llama_cpp_rope_order(w, heads):
    """HF rows per head (i, i + D/2 rotate together) in llama.cpp's order (2i, 2i + 1), index by index."""
    rows = w.shape[0]
    D = rows // heads
    out = np.empty_like(w)
    for h in range(heads):
        for i in range(D // 2):
            out[h * D + 2 * i] = w[h * D + i]
            out[h * D + 2 * i + 1] = w[h * D + D // 2 + i]
    return out


def check_file(path, cfg, hf, dtype):
    reader = GGUFReader(path)
    C, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, Hkv, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    D = cfg.get("head_dim") or C // H
    expected_keys = {
        "general.architecture": "llama", "llama.block_count": L, "llama.embedding_length": C,
        "llama.feed_forward_length": F, "llama.attention.head_count": H, "llama.attention.head_count_kv": Hkv,
        "llama.rope.dimension_count": D, "llama.attention.key_length": D, "llama.vocab_size": V,
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    }
    for key, want in expected_keys.items():
        check(field_value(reader, key) == want, f"{dtype}: {key} = {field_value(reader, key)!r}, expected {want!r}")
    check(abs(field_value(reader, "llama.rope.freq_base") - cfg["rope_theta"]) < 1e-3, f"{dtype}: rope freq base")
    check(abs(field_value(reader, "llama.attention.layer_norm_rms_epsilon") - cfg["rms_norm_eps"]) < 1e-12,
          f"{dtype}: rms eps")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    check(tokens is not None and len(tokens.data) == V, f"{dtype}: {V} tokens in the vocabulary")

    matrix_type = gguf.GGMLQuantizationType.F16 if dtype == "f16" else gguf.GGMLQuantizationType.BF16
    expected = {"token_embd.weight": (hf["model.embed_tokens.weight"], 0),
                "output_norm.weight": (hf["model.norm.weight"], 0)}
    if not cfg.get("tie_word_embeddings", False):
        expected["output.weight"] = (hf["lm_head.weight"], 0)
    names = {"attn_q": ("self_attn.q_proj", H), "attn_k": ("self_attn.k_proj", Hkv), "attn_v": ("self_attn.v_proj", 0),
             "attn_output": ("self_attn.o_proj", 0), "ffn_gate": ("mlp.gate_proj", 0), "ffn_up": ("mlp.up_proj", 0),
             "ffn_down": ("mlp.down_proj", 0)}
    for layer in range(L):
        p = f"model.layers.{layer}."
        expected[f"blk.{layer}.attn_norm.weight"] = (hf[p + "input_layernorm.weight"], 0)
        expected[f"blk.{layer}.ffn_norm.weight"] = (hf[p + "post_attention_layernorm.weight"], 0)
        for g, (h, heads) in names.items():
            expected[f"blk.{layer}.{g}.weight"] = (hf[p + h + ".weight"], heads)
            expected[f"blk.{layer}.{g}.bias"] = (hf[p + h + ".bias"], heads)
    found = {t.name: t for t in reader.tensors}
    check(set(found) == set(expected), f"{dtype}: tensor names: missing {sorted(set(expected) - set(found))}, "
          f"extra {sorted(set(found) - set(expected))}")
    for name, (source, heads) in expected.items():
        if name not in found:
            continue
        t = found[name]
        want = llama_cpp_rope_order(source, heads) if heads else source
        is_matrix = source.ndim == 2
        want_type = matrix_type if is_matrix else gguf.GGMLQuantizationType.F32
        check(t.tensor_type == want_type, f"{dtype}: {name} has type {t.tensor_type!r}, expected {want_type!r}")
        check(list(t.shape) == list(reversed(source.shape)),
              f"{dtype}: {name} has GGUF shape {list(t.shape)}, expected {list(reversed(source.shape))}")
        if want_type == gguf.GGMLQuantizationType.BF16:  # gguf-py hands bf16 over as raw bytes
            data = np.ascontiguousarray(t.data).view(np.uint16).reshape(source.shape)
            ok = np.array_equal(data, want.view(np.uint16))
        else:
            # bf16's 8-bit significand fits f16's 11 bits: equal unless a value falls
            # below f16's normal range (then within half an f16 subnormal step).
            data = np.asarray(t.data).reshape(source.shape)
            ok = np.allclose(data.astype(np.float64), want.astype(np.float64), rtol=0, atol=2.0 ** -25)
        check(ok, f"{dtype}: {name}'s values differ from the checkpoint's")
    check(any(found[f"blk.0.attn_q.weight"].data.reshape(-1)[:H * D] != 0), f"{dtype}: q rows are not all zero")


def rewrite_header(path, header):
    """Replaces a safetensors file's header (its data stays after it)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + n)
        data = f.read()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


def write_broken_copy(src, dst, change):
    shutil.copytree(src, dst)
    change(dst)


def main():
    tmp = tempfile.mkdtemp(prefix="test_gguf_")
    try:
        subprocess.run([sys.executable, os.path.join(ROOT, "golden", "gen_08_tiny_model.py"), "--out", tmp],
                       check=True, stdout=subprocess.DEVNULL)
        model = os.path.join(tmp, "tiny_bielik")
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        hf = read_safetensors(os.path.join(model, "model.safetensors"))
        for dtype in ("f16", "bf16"):
            out = os.path.join(tmp, f"tiny_{dtype}.gguf")
            status, err = convert(model, out, "--dtype", dtype)
            check(status == 0, f"{dtype}: the converter failed: {err}")
            if status == 0:
                check(not os.path.exists(out + ".partial"), f"{dtype}: a .partial file was left")
                check_file(out, cfg, hf, dtype)

        safetensors = "model.safetensors"
        broken = {
            "no model.safetensors": (lambda d: os.remove(os.path.join(d, safetensors)), [safetensors, "missing"]),
            "a truncated model.safetensors": (
                lambda d: os.truncate(os.path.join(d, safetensors), os.path.getsize(os.path.join(d, safetensors)) // 2),
                [safetensors, "do not hold shape"]),
            "a header length past the end": (
                lambda d: open(os.path.join(d, safetensors), "r+b").write(struct.pack("<Q", 1 << 40)),
                [safetensors, "runs past the end"]),
            "a malformed JSON header": (
                lambda d: (lambda f: (f.seek(8), f.write(b"{\"x")))(open(os.path.join(d, safetensors), "r+b")),
                [safetensors]),
            "a header that is a JSON list": (
                lambda d: rewrite_header(os.path.join(d, safetensors), b"[1, 2]"), [safetensors, "not a JSON object"]),
            "a tensor entry without data_offsets": (
                lambda d: rewrite_header(os.path.join(d, safetensors),
                                         json.dumps({"model.norm.weight": {"dtype": "BF16", "shape": [4]}}).encode()),
                [safetensors, "model.norm.weight", "data_offsets"]),
            "a config with a wider hidden size": (
                lambda d: json.dump(dict(cfg, hidden_size=cfg["hidden_size"] * 2), open(os.path.join(d, "config.json"), "w")),
                ["model.embed_tokens.weight", "has shape", "expected"]),
            "a config with a layer more than the weights": (
                lambda d: json.dump(dict(cfg, num_hidden_layers=cfg["num_hidden_layers"] + 1),
                                    open(os.path.join(d, "config.json"), "w")),
                [f"model.layers.{cfg['num_hidden_layers']}.", "is missing"]),
            "a config without vocab_size": (
                lambda d: json.dump({k: v for k, v in cfg.items() if k != "vocab_size"},
                                    open(os.path.join(d, "config.json"), "w")),
                ["config.json", "vocab_size"]),
        }
        for i, (what, (change, words)) in enumerate(broken.items()):
            folder = os.path.join(tmp, f"broken_{i}")
            write_broken_copy(model, folder, change)
            out = os.path.join(tmp, f"broken_{i}.gguf")
            status, err = convert(folder, out)
            check(status != 0, f"{what}: accepted")
            for word in words:
                check(word in err, f"{what}: the error does not say {word!r}: {err.strip()!r}")
            check("Traceback" not in err, f"{what}: a traceback instead of a message: {err.strip()[-300:]!r}")
            check(not os.path.exists(out) and not os.path.exists(out + ".partial"), f"{what}: a GGUF was left behind")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed")
        return 1
    print("test_checkpoint_to_gguf: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
