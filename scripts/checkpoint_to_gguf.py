"""Writes a HuggingFace Llama-family checkpoint as a GGUF file for llama.cpp's llama-bench.

    python scripts/checkpoint_to_gguf.py --model models/bielik-shaped-random \
        --out build-bench/llamacpp/bielik-f16.gguf [--dtype f16|bf16] \
        [--gguf-py third_party/llama.cpp/gguf-py]

The same-GPU llama.cpp baseline of issue 7 (scripts/bench_llamacpp.py) needs the benchmark
checkpoint in llama.cpp's format. llama.cpp's own converter (convert_hf_to_gguf.py) wants
the checkpoint's tokenizer, and the random Bielik-shaped checkpoint has none; llama-bench
feeds token ids, never text, so this writer gives the file a placeholder vocabulary of the
model's size instead (sentencepiece-style: <unk>, <s>, </s>, the 256 byte tokens, then
"<tN>"). The weights are the checkpoint's own: every tensor, bias included, in f16 (as
issue 7's llama.cpp anchor ran) or bf16, the q and k projections' rows reordered for
llama.cpp's RoPE, which rotates adjacent pairs (2i, 2i + 1) where HF rotates i with
i + D/2. So llama.cpp reads exactly the bytes a token costs here and computes the same
function: scripts/test_checkpoint_to_gguf.py checks the file against the checkpoint, and
once (2026-12-06) llama.cpp itself (commit 0c1e570, CPU build) ran chapter 08's tiny Bielik
checkpoint converted here, its logits at all 19 prompt positions within 0.14% (f16) and
0.8% (bf16) of the golden float64 reference, the same top token at each (DECODE_LOG.md,
sixty-third session).

The GGUF container is written with gguf-py, the writer that ships inside llama.cpp's tree
(scripts/fetch_llamacpp.sh fetches it; else the `gguf` package of this Python, as PyPI
has it); the safetensors files are read here with numpy
and ml_dtypes (bf16), no torch needed. A missing or malformed input stops with the file's
name and the problem; the output is written beside its final name and renamed when whole.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GGUF_PY = os.path.join(HERE, "..", "third_party", "llama.cpp", "gguf-py")

SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": np.float16, "F32": np.float32}


def fail(message):
    raise SystemExit(f"checkpoint_to_gguf: {message}")


def read_safetensors(path):
    """{name: numpy array (a view of the file)}; bf16 as ml_dtypes.bfloat16."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                fail(f"{path}: shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                fail(f"{path}: header length {header_len} runs past the end of the file ({size} bytes)")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    if not isinstance(header, dict):
        fail(f"{path}: the header is not a JSON object")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not isinstance(info.get("shape"), list) or \
                not isinstance(info.get("data_offsets"), list) or len(info["data_offsets"]) != 2:
            fail(f"{path}: tensor {name}'s entry has no shape or no [begin, end] data_offsets")
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            fail(f"{path}: tensor {name} has dtype {info.get('dtype')}, not one of {sorted(SAFETENSORS_DTYPES)}")
        if dtype == "bfloat16":
            import ml_dtypes
            dtype = ml_dtypes.bfloat16
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end > data.size or end - begin != int(np.prod(shape)) * np.dtype(dtype).itemsize:
            fail(f"{path}: tensor {name}'s bytes [{begin}, {end}) do not hold shape {shape} in the file")
        tensors[name] = data[begin:end].view(dtype).reshape(shape)
    return tensors


def read_checkpoint(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            fail(f"{path}: missing")
        tensors.update(read_safetensors(path))
    return tensors


def rope_pairs_adjacent(w, heads):
    """HF's q/k rows, per head [first halves of the pairs..., second halves...], reordered
    so that the two members of each rotated pair are adjacent (llama.cpp's RoPE)."""
    rows = w.shape[0]
    half = rows // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def placeholder_vocab(size):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    if size < len(tokens):
        fail(f"vocab_size {size} is smaller than the placeholder's {len(tokens)} fixed tokens")
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte (gguf's TokenType values)
    tokens += [f"<t{i}>" for i in range(len(tokens), size)]
    types += [1] * (size - len(types))  # normal
    return tokens, [0.0] * size, types


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="folder with config.json and model.safetensors")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    parser.add_argument("--gguf-py", default=DEFAULT_GGUF_PY, help="llama.cpp's gguf-py folder")
    args = parser.parse_args()

    if os.path.isdir(os.path.join(args.gguf_py, "gguf")):
        sys.path.insert(0, args.gguf_py)
    try:
        import gguf
    except ImportError:
        fail(f"no gguf package: none in {args.gguf_py} (scripts/fetch_llamacpp.sh fetches it) "
             "and none in this Python (pip install gguf)")

    config_path = os.path.join(args.model, "config.json")
    try:
        with open(config_path) as f:
            cfg = json.load(f)
        C, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
        H, Hkv, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"{config_path}: {e}")
    D = cfg.get("head_dim") or C // H
    tensors = read_checkpoint(args.model)

    def take(name, shape):
        if name not in tensors:
            fail(f"{args.model}: tensor {name} is missing")
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            fail(f"{args.model}: tensor {name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        return t

    out_dtype = np.float16 if args.dtype == "f16" else None

    def convert(t):
        if out_dtype is not None:
            return np.ascontiguousarray(t.astype(np.float32).astype(np.float16))
        import ml_dtypes
        return np.ascontiguousarray(t.astype(ml_dtypes.bfloat16)).view(np.uint16)

    raw_dtype = None if args.dtype == "f16" else gguf.GGMLQuantizationType.BF16
    writer_tensors = []

    def add(gguf_name, t, keep_f32=False):
        array = np.ascontiguousarray(t.astype(np.float32)) if keep_f32 else convert(t)
        writer_tensors.append((gguf_name, array, None if keep_f32 else raw_dtype))

    tied = cfg.get("tie_word_embeddings", False)
    add("token_embd.weight", take("model.embed_tokens.weight", (V, C)))
    add("output_norm.weight", take("model.norm.weight", (C,)), keep_f32=True)
    if not tied:
        add("output.weight", take("lm_head.weight", (V, C)))
    projections = {  # gguf name: (HF name, rows, RoPE heads or 0)
        "attn_q": ("self_attn.q_proj", H * D, H), "attn_k": ("self_attn.k_proj", Hkv * D, Hkv),
        "attn_v": ("self_attn.v_proj", Hkv * D, 0), "attn_output": ("self_attn.o_proj", C, 0),
        "ffn_gate": ("mlp.gate_proj", F, 0), "ffn_up": ("mlp.up_proj", F, 0), "ffn_down": ("mlp.down_proj", C, 0),
    }
    for layer in range(L):
        prefix = f"model.layers.{layer}."
        add(f"blk.{layer}.attn_norm.weight", take(prefix + "input_layernorm.weight", (C,)), keep_f32=True)
        add(f"blk.{layer}.ffn_norm.weight", take(prefix + "post_attention_layernorm.weight", (C,)), keep_f32=True)
        for gguf_name, (hf_name, rows, rope_heads) in projections.items():
            cols = {"attn_output": H * D, "ffn_down": F}.get(gguf_name, C)
            w = take(prefix + hf_name + ".weight", (rows, cols))
            if rope_heads:
                w = rope_pairs_adjacent(w, rope_heads)
            add(f"blk.{layer}.{gguf_name}.weight", w)
            bias_name = prefix + hf_name + ".bias"
            if bias_name in tensors:
                b = take(bias_name, (rows,))
                if rope_heads:
                    b = rope_pairs_adjacent(b, rope_heads)
                add(f"blk.{layer}.{gguf_name}.bias", b, keep_f32=True)

    writer = gguf.GGUFWriter(args.out + ".partial", "llama")
    writer.add_name(os.path.basename(os.path.normpath(args.model)))
    writer.add_context_length(cfg.get("max_position_embeddings", 4096))
    writer.add_embedding_length(C)
    writer.add_block_count(L)
    writer.add_feed_forward_length(F)
    writer.add_head_count(H)
    writer.add_head_count_kv(Hkv)
    writer.add_key_length(D)
    writer.add_value_length(D)
    writer.add_rope_dimension_count(D)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(V)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if args.dtype == "f16" else gguf.LlamaFileType.MOSTLY_BF16)
    tokens, scores, types = placeholder_vocab(V)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, array, dtype in writer_tensors:
        writer.add_tensor(name, array, raw_dtype=dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(args.out + ".partial", args.out)
    total = sum(a.nbytes for _, a, _ in writer_tensors)
    print(f"checkpoint_to_gguf: {args.out}: {len(writer_tensors)} tensors, {total / 1e9:.2f} GB, {args.dtype}")


if __name__ == "__main__":
    main()
