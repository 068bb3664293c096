"""Golden cases for chapter 08: tiny synthetic checkpoints and their reference forward.

Two checkpoints in HuggingFace layout (config.json + model.safetensors), each with a
float64 numpy forward that is written plainly here, independently of the C++:

  tiny_bielik/   Bielik's features: a bias on all seven projections (q, k, v, o,
                 gate, up, down), grouped-query attention (H=4 query heads sharing
                 Hkv=2 key/value heads), an untied lm_head, rope_theta 1e6, eps 1e-6.
                 C=64, D=16, F=96, 2 layers, V=300 (odd, not a tile multiple).
  tiny_smollm/   SmolLM2's features: no biases, lm_head tied to the embedding,
                 H=3 query heads on Hkv=1 key/value head, rope_theta 1e5, eps 1e-5.
  tiny_chat_d64/ tiny_smollm's features and tokenizer with D=64 (C=128, H=2, Hkv=1,
                 F=192, 2 layers): a head size the CUDA backend runs, for the chat
                 program on the GPU.

For each model <m> the generator writes, next to the checkpoint folder:
  <m>_prompt.npy   (T,) int32     a fixed token sequence
  <m>_logits.npy   (T, V) float64 logits at every position of the prompt (prefill)
  <m>_greedy.npy   (N,) int32     the greedy continuation of the prompt (N=16 tokens)
  <m>_margin.npy   (N,) float64   top-1 minus top-2 logit at each greedy step; the
                                  generator insists on a margin far above fp32 error,
                                  so "greedy ids match exactly" is a fair test.
  <m>_long_prompt.npy / <m>_long_logits.npy   tiny_bielik only: 150 tokens, longer than
                                  the C++ prefill chunk (128), at positions where RoPE
                                  has turned the slow frequencies too.

Each checkpoint folder also gets a tokenizer.json (byte-level BPE as GPT-2/SmolLM2:
special tokens, the 256 byte tokens, then merges up to V) and a tokenizer_config.json
with a ChatML chat template (tiny_bielik: BOS first, like Bielik; tiny_smollm: a default
system turn, like SmolLM2), so the chat program runs on them end to end. tiny_smollm
and tiny_chat_d64 have no merges, which makes their encoding plain enough to write here:
  <m>_chat_prompt.npy (T,) int32   ids of a rendered one-message chat prompt
  <m>_chat_reply.npy  (N,) int32   its greedy reply, up to <|im_end|> (not included)

model.safetensors is written by hand (no safetensors package): 8-byte little-endian
header length, a JSON header {name: {dtype, shape, data_offsets}}, then raw bytes.
Weights are bf16; the reference uses exactly the bf16-rounded values in float64.
"""
import json
import os
import struct

import numpy as np

from golden_common import bf16_values, parse_out_dir, rng, save, to_bf16

MODELS = {
    # name: architecture, the seed of its weights, its tokenizer's special tokens (ids 0..)
    "tiny_bielik": dict(C=64, H=4, Hkv=2, D=16, F=96, L=2, V=300, theta=1e6, eps=1e-6,
                        bias=True, tied=False, max_pos=192, seed=801,
                        specials=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]),
    "tiny_smollm": dict(C=48, H=3, Hkv=1, D=16, F=80, L=3, V=259, theta=1e5, eps=1e-5,
                        bias=False, tied=True, max_pos=96, seed=802,
                        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
    # tiny_smollm's features with D = 64, a head size the CUDA backend runs (64 or 128):
    # the chat program end to end on the GPU. Seed 833: its chat reply changes token
    # twice and every greedy margin is >= 1.6, far above bf16 activations' error.
    "tiny_chat_d64": dict(C=128, H=2, Hkv=1, D=64, F=192, L=2, V=259, theta=1e5, eps=1e-5,
                          bias=False, tied=True, max_pos=96, seed=833,
                          specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
}
# Models whose chat reply is a golden file too, and the least greedy margin each must have:
# the CUDA backend keeps activations in bf16, so its reply is compared only where no
# logit pair is closer than that.
CHAT_REPLY_MARGIN = {"tiny_smollm": 1e-2, "tiny_chat_d64": 0.5}
# ChatML templates in the two shapes the chat program meets: BOS first (Bielik), and a
# default system turn when the conversation has none (SmolLM2).
CHAT_TEMPLATES = {
    "tiny_bielik": ("{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
                    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "tiny_smollm": ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
                    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
                    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
}
CHAT_TEMPLATES["tiny_chat_d64"] = CHAT_TEMPLATES["tiny_smollm"]  # the same chat as tiny_smollm
TOKENIZER_CONFIG = {
    "tiny_bielik": {"bos_token": "<s>", "eos_token": "<|im_end|>", "add_bos_token": True},
    "tiny_smollm": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False},
}
TOKENIZER_CONFIG["tiny_chat_d64"] = TOKENIZER_CONFIG["tiny_smollm"]
MERGE_CORPUS = ("Witaj w rozmowie z modelem. Bielik to model jezykowy, a to jest maly model testowy. "
                "Hello there, this is a tiny test model that speaks in random bytes.")
GREEDY_TOKENS = 16
MIN_GREEDY_MARGIN = 1e-2  # logits are O(1); fp32 forward error is ~1e-6


def make_weights(m):
    """HF tensor names -> bf16 arrays. Linear weights are (out, in), as nn.Linear stores them."""
    r = rng(m["seed"])
    C, H, Hkv, D, F, V = m["C"], m["H"], m["Hkv"], m["D"], m["F"], m["V"]

    def linear(out_dim, in_dim):
        # 1/sqrt(in) keeps activations O(1) through the layers; the extra 1.5 makes the
        # attention and MLP contributions big enough that a wrong op shows in the logits.
        return to_bf16(r.standard_normal((out_dim, in_dim)) * 1.5 / np.sqrt(in_dim))

    def bias(dim):
        return to_bf16(r.standard_normal(dim) * 0.3)

    def norm(dim):
        return to_bf16(1.0 + 0.2 * r.standard_normal(dim))

    w = {"model.embed_tokens.weight": to_bf16(r.standard_normal((V, C)))}
    projections = {
        "self_attn.q_proj": (H * D, C), "self_attn.k_proj": (Hkv * D, C),
        "self_attn.v_proj": (Hkv * D, C), "self_attn.o_proj": (C, H * D),
        "mlp.gate_proj": (F, C), "mlp.up_proj": (F, C), "mlp.down_proj": (C, F),
    }
    for i in range(m["L"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(C)
        w[p + "post_attention_layernorm.weight"] = norm(C)
        for name, (out_dim, in_dim) in projections.items():
            w[p + name + ".weight"] = linear(out_dim, in_dim)
            if m["bias"]:
                w[p + name + ".bias"] = bias(out_dim)
    w["model.norm.weight"] = norm(C)
    if not m["tied"]:
        # Scaled up a little so the logits spread over a few units: softmax is not flat
        # and the greedy choice is decided by clear margins.
        w["lm_head.weight"] = to_bf16(r.standard_normal((V, C)) * 3.0 / np.sqrt(C))
    return w


def write_config(path, m):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m["C"],
        "intermediate_size": m["F"],
        "num_hidden_layers": m["L"],
        "num_attention_heads": m["H"],
        "num_key_value_heads": m["Hkv"],
        "head_dim": m["D"],
        "vocab_size": m["V"],
        "max_position_embeddings": m["max_pos"],
        "rope_theta": m["theta"],
        "rms_norm_eps": m["eps"],
        "tie_word_embeddings": m["tied"],
        "attention_bias": m["bias"],
        "mlp_bias": m["bias"],
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def write_safetensors(path, tensors):
    """The safetensors format by hand: u64 header size, JSON header, raw data."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name]).view(np.uint16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # the reference writer pads to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for chunk in chunks:
            f.write(chunk)


# ---- the tokenizer: byte-level BPE in tokenizer.json's layout ----

def byte_to_unicode():
    """GPT-2's printable stand-in for every byte: printable Latin-1 bytes stand for
    themselves, the other 68 are shifted to U+0100.. so no token contains a space or a
    control character."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
                 + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    mapping, shifted = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def learn_merges(count):
    """`count` BPE merges from MERGE_CORPUS: repeatedly join the most frequent adjacent
    pair inside words (ties: the pair seen first). Any merge list gives a valid
    tokenizer; learning it just makes the tokens look like text."""
    to_char = byte_to_unicode()
    words = []
    for i, word in enumerate(MERGE_CORPUS.split(" ")):
        text = (" " if i else "") + word  # GPT-2 style: the space belongs to the next word
        words.append([to_char[b] for b in text.encode("utf-8")])
    merges = []
    while len(merges) < count:
        pairs = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + 1
        if not pairs:
            break
        best = max(pairs.items(), key=lambda item: item[1])[0]  # first seen wins ties
        merges.append(best)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


def write_tokenizer(folder, name, m):
    specials = m["specials"]
    to_char = byte_to_unicode()
    vocab = {token: i for i, token in enumerate(specials)}
    for b in range(256):
        vocab[to_char[b]] = len(vocab)
    merges = learn_merges(m["V"] - len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    assert len(vocab) == m["V"], (name, len(vocab))
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
    config = dict(TOKENIZER_CONFIG[name])
    config.update({"chat_template": CHAT_TEMPLATES[name], "model_max_length": m["max_pos"],
                   "tokenizer_class": "PreTrainedTokenizerFast"})
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)


def encode_without_merges(text, specials):
    """Ids of `text` for a tokenizer with no merges: special tokens by name, every
    other byte as its own byte token (ids after the specials)."""
    ids, i = [], 0
    while i < len(text):
        special = next((s for s in specials if text.startswith(s, i)), None)
        if special:
            ids.append(specials.index(special))
            i += len(special)
        else:
            ids.extend(len(specials) + b for b in text[i].encode("utf-8"))
            i += 1
    return ids


# ---- the reference forward, float64, whole sequence at once (no KV cache) ----

def rmsnorm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, theta):
    """HF rotate-half RoPE. x: (T, heads, D); position of row t is t."""
    T, _, D = x.shape
    inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)      # (D/2,)
    angles = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos = np.concatenate([np.cos(angles), np.cos(angles)], axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angles), np.sin(angles)], axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., D // 2:], x[..., : D // 2]], axis=-1)
    return x * cos + rotated * sin


def forward(w, m, tokens):
    """Logits (T, V) for the token sequence, float64."""
    C, H, Hkv, D, V = m["C"], m["H"], m["Hkv"], m["D"], m["V"]
    T = len(tokens)
    f = {k: bf16_values(v) for k, v in w.items()}

    def linear(x, name):
        y = x @ f[name + ".weight"].T
        return y + f[name + ".bias"] if name + ".bias" in f else y

    x = f["model.embed_tokens.weight"][tokens]  # (T, C)
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    for i in range(m["L"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, f[p + "input_layernorm.weight"], m["eps"])
        q = rope(linear(h, p + "self_attn.q_proj").reshape(T, H, D), m["theta"])
        k = rope(linear(h, p + "self_attn.k_proj").reshape(T, Hkv, D), m["theta"])
        v = linear(h, p + "self_attn.v_proj").reshape(T, Hkv, D)
        out = np.empty((T, H, D))
        for head in range(H):
            kv = head // (H // Hkv)  # grouped-query attention: H/Hkv query heads per kv head
            scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(D) + causal
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            out[:, head, :] = probs @ v[:, kv, :]
        x = x + linear(out.reshape(T, H * D), p + "self_attn.o_proj")
        h = rmsnorm(x, f[p + "post_attention_layernorm.weight"], m["eps"])
        gate = linear(h, p + "mlp.gate_proj")
        up = linear(h, p + "mlp.up_proj")
        x = x + linear(gate / (1.0 + np.exp(-gate)) * up, p + "mlp.down_proj")
    x = rmsnorm(x, f["model.norm.weight"], m["eps"])
    head = f["model.embed_tokens.weight"] if m["tied"] else f["lm_head.weight"]
    return x @ head.T


def greedy(w, m, prompt, count, stop_id=None):
    """Up to `count` argmax tokens after `prompt`; stops before `stop_id`."""
    tokens, margins = list(prompt), []
    for _ in range(count):
        last = forward(w, m, np.array(tokens))[-1]
        top2 = np.sort(last)[-2:]
        margins.append(top2[1] - top2[0])
        if int(np.argmax(last)) == stop_id:
            break
        tokens.append(int(np.argmax(last)))
    return np.array(tokens[len(prompt):], dtype=np.int32), np.array(margins)


def main():
    out = parse_out_dir()
    for name, m in MODELS.items():
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        w = make_weights(m)
        write_config(os.path.join(folder, "config.json"), m)
        write_safetensors(os.path.join(folder, "model.safetensors"), w)
        write_tokenizer(folder, name, m)

        # A prompt that touches both ends of the vocabulary and repeats a token.
        prompt = rng(m["seed"] + 1000).integers(0, m["V"], size=19).astype(np.int32)
        prompt[0], prompt[5], prompt[11] = 1, m["V"] - 1, prompt[3]
        logits = forward(w, m, prompt)
        continuation, margins = greedy(w, m, prompt, GREEDY_TOKENS)
        assert margins.min() > MIN_GREEDY_MARGIN, (name, margins.min())
        assert np.abs(logits).std() > 0.5, (name, "logits too flat to test anything")
        save(out, f"{name}_prompt", prompt)
        save(out, f"{name}_logits", logits)
        save(out, f"{name}_greedy", continuation)
        save(out, f"{name}_margin", margins)
        if name in CHAT_REPLY_MARGIN:
            # The chat program's first turn, "Hi!", rendered by the template above.
            text = ("<|im_start|>system\nYou are a tiny test model.<|im_end|>\n"
                    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
            chat_prompt = np.array(encode_without_merges(text, m["specials"]), dtype=np.int32)
            reply, margins = greedy(w, m, chat_prompt, 12, stop_id=m["specials"].index("<|im_end|>"))
            assert margins.min() > CHAT_REPLY_MARGIN[name], (name, "chat", margins.min())
            save(out, f"{name}_chat_prompt", chat_prompt)
            save(out, f"{name}_chat_reply", reply)
        if name == "tiny_bielik":
            long_prompt = rng(m["seed"] + 2000).integers(0, m["V"], size=150).astype(np.int32)
            save(out, f"{name}_long_prompt", long_prompt)
            save(out, f"{name}_long_logits", forward(w, m, long_prompt))


if __name__ == "__main__":
    main()
