"""Chapter 08 golden data for the tokenizer: small tokenizers trained with the
HuggingFace `tokenizers` package, and the ids / decodes it gives for test strings.

tokenizer.json files, trained here on the small Polish + English corpus below (no
download; training takes well under a second):

  bytelevel.json    byte-level BPE like GPT-2 / SmolLM2: pre-tokenizer
                    Sequence[Digits(individual_digits), ByteLevel(use_regex)],
                    ByteLevel decoder, specials <|endoftext|> <|im_start|> <|im_end|>.
  bytelevel_string_merges.json  the same with merges in the older "a b" string form.
  metaspace.json    SentencePiece-style BPE with byte fallback: Metaspace("▁",
                    prepend_scheme "first", split) pre-tokenizer, decoder
                    Sequence[ByteFallback, Metaspace], <0x00>..<0xFF> in the
                    vocabulary, specials <unk> <s> </s> <|im_start|> <|im_end|>.
  metaspace_nosplit.json  the same model as transformers' Llama converter writes it
                    today: Metaspace(split=False), decoder
                    Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)].
  metaspace_always.json  Metaspace with prepend_scheme "always" (a "▁" before every
                    stretch of text, also after special tokens), as older files have it.
  bytelevel_prefix.json  the byte-level model with ByteLevel(add_prefix_space=True).
  llama_legacy.json the same model in the older Llama-2 layout: normalizer
                    Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer, the
                    Replace/ByteFallback/Fuse/Strip decoder.

cases.json lists, per tokenizer, every test string with the ids `tokenizers` gives
(add_special_tokens=False) and its decode (skip_special_tokens=False).
unicode_classes.json lists Python's Unicode category (L, N, or other) for every code
point of the blocks the C++ pre-tokenizer's table claims to cover.
"""
import json
import os
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import parse_out_dir  # noqa: E402

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

CORPUS = [
    "Zażółć gęślą jaźń. Łódź leży w centrum Polski, a Kraków na południu.",
    "Dzień dobry! Jak się masz? Cześć, miło cię poznać 👋🏽 😀",
    "Bielik to polski model językowy; potrafi rozmawiać po polsku i po angielsku.",
    "The quick brown fox jumps over the lazy dog. It's 2024 and we've got 1234567 tokens.",
    "Hello world!  Two spaces,   three spaces,\n\nnew lines\tand tabs.",
    "W 1999 roku było 42 kotów i 7 psów; w 2023 już 100 000 zwierząt.",
    "Ósma godzina, źdźbło trawy, żółw i łabędź płyną po stawie.",
    "I'm sure they'll say you'd done it; she's here, we're there.",
    "def main():\n    return 0  # four-space indent\n",
    "Émile et Zoë sont allés à Saint-Étienne.",
] * 4

TEST_STRINGS = [
    "Zażółć gęślą jaźń",
    "Łódź",
    "👋🏽 cześć",
    "Hello world",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "line one\nline two\n\n\nthree newlines",
    "\t tab and space \t",
    "1234567",
    "x1 22 333 4444 1.5e-3",
    "It's they'll we've I'M",
    "Mixed: Zażółć 2024 👋🏽 hello!!! ???",
    "<|im_start|>user\nHej<|im_end|>",
    "<|im_start|>system\nJesteś pomocnym asystentem.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_end|><|im_end|>x<|im_start|>",
    "€ ¥ ñ 中文 ﬁ ß",            # characters the corpus never saw: byte fallback
    "Ж Ω ١٢٣ ² ½",               # Cyrillic, Greek, Arabic-Indic digits, superscript, fraction
    "🦜🦜 Bielik🦅",
    "",
    " ",
    "\n",
    "a",
    "<s> not special in the byte-level model </s>",
    "<0x41> is text, not a byte token",
]

BYTELEVEL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
METASPACE_SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def train_bytelevel():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=BYTELEVEL_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def train_metaspace():
    """BPE over Metaspace pieces; then the 256 <0xNN> byte tokens are moved into the
    model's vocabulary (not added tokens), as in Llama / Mistral tokenizer.json files."""
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(),
                                           decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=METASPACE_SPECIALS + byte_tokens,
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tokenizer.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in byte_tokens]
    return Tokenizer.from_str(json.dumps(spec))


def llama_decoder():
    return json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0)]).__getstate__())


def metaspace_nosplit_from(metaspace):
    spec = json.loads(metaspace.to_str())
    spec["pre_tokenizer"] = json.loads(
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False).__getstate__())
    spec["decoder"] = llama_decoder()
    return Tokenizer.from_str(json.dumps(spec))


def metaspace_always_from(metaspace):
    spec = json.loads(metaspace.to_str())
    spec["pre_tokenizer"] = json.loads(
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always").__getstate__())
    spec["decoder"] = json.loads(decoders.Sequence([
        decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")]).__getstate__())
    return Tokenizer.from_str(json.dumps(spec))


def bytelevel_prefix_from(bytelevel):
    spec = json.loads(bytelevel.to_str())
    spec["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    return Tokenizer.from_str(json.dumps(spec))


def llama_legacy_from(metaspace):
    spec = json.loads(metaspace.to_str())
    spec["normalizer"] = json.loads(normalizers.Sequence([
        normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]).__getstate__())
    spec["pre_tokenizer"] = None
    spec["decoder"] = llama_decoder()
    return Tokenizer.from_str(json.dumps(spec))


def string_merges_from(tokenizer):
    """Merges as "a b" strings (tokenizers < 0.20 wrote them so; many hub files still do).
    Returned as the JSON text: Tokenizer.save would write them back as pairs."""
    spec = json.loads(tokenizer.to_str())
    spec["model"]["merges"] = [" ".join(pair) for pair in spec["model"]["merges"]]
    return json.dumps(spec, ensure_ascii=False)


def cases_for(tokenizer):
    cases = []
    for text in TEST_STRINGS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=False)})
    return cases


def unicode_classes():
    """[[first, last, class], ...] runs over the blocks tokenizer_unicode.cpp covers."""
    blocks = [(0x0000, 0x06FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x3400, 0x9FFF),
              (0xAC00, 0xD7AF), (0xFF00, 0xFFEF), (0x1F000, 0x1FAFF)]
    runs = []
    for first, last in blocks:
        for cp in range(first, last + 1):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            cat = unicodedata.category(chr(cp))[0]
            cls = cat if cat in "LN" else "other"
            # Rust's regex \s is Unicode White_Space; Python's isspace() also counts the
            # information separators U+001C..U+001F, which White_Space does not.
            if chr(cp).isspace() and not 0x1C <= cp <= 0x1F:
                cls = "space"
            if runs and runs[-1][1] == cp - 1 and runs[-1][2] == cls:
                runs[-1][1] = cp
            else:
                runs.append([cp, cp, cls])
    return {"unicode_version": unicodedata.unidata_version, "runs": runs}


def main():
    out = parse_out_dir()
    bytelevel = train_bytelevel()
    metaspace = train_metaspace()
    tokenizers_ = {"bytelevel": bytelevel, "bytelevel_string_merges": string_merges_from(bytelevel),
                   "bytelevel_prefix": bytelevel_prefix_from(bytelevel),
                   "metaspace": metaspace, "metaspace_nosplit": metaspace_nosplit_from(metaspace),
                   "metaspace_always": metaspace_always_from(metaspace),
                   "llama_legacy": llama_legacy_from(metaspace)}
    cases = {}
    for name, tokenizer in tokenizers_.items():
        text = tokenizer if isinstance(tokenizer, str) else tokenizer.to_str()
        with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
            f.write(text)
        cases[name] = cases_for(Tokenizer.from_str(text))
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, "unicode_classes.json"), "w") as f:
        json.dump(unicode_classes(), f)


if __name__ == "__main__":
    main()
