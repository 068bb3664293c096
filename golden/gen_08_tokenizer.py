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
  bytelevel_added.json  the byte-level model with added tokens that are single_word,
                    lstrip or rstrip (ADDED_TOKENS), tested on TEST_STRINGS and
                    ADDED_TOKEN_STRINGS: where such a token matches and where not.

cases.json lists, per tokenizer, every test string with the ids `tokenizers` gives
(add_special_tokens=False) and its decode (skip_special_tokens=False).
word_char_runs.npy lists, as runs (int32, shape (R, 3): first, last, 1 word / 0 not),
which code points HF tokenizers itself counts as word characters beside a single_word
added token (the Rust regex crate's \\w), probed by encoding the token before and after
every code point (~10 s).
unicode_class_runs.npy lists Python's Unicode class (int32, shape (R, 3): first, last,
class with 0 other, 1 letter, 2 number, 3 space) for every code point 0..0x10FFFF except
the surrogates, as runs, and unicode_version.txt the version of unicodedata it comes from.
"""
import json
import os
import sys
import unicodedata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_common import parse_out_dir  # noqa: E402

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

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
    # Letters and numbers of every plane before an apostrophe: a character we took for
    # "other" would glue to the "'" (ours "ﬁ'" "s", HF "ﬁ" "'s"). Marks (M*) are neither.
    "ﬁ's ﬂ'll ﬃ'd",              # ligatures (Ll)
    "क's नमस्ते'll हिन्दी",         # Devanagari: letters and combining vowel signs (Mc, Mn)
    "ก'll สวัสดีครับ's",           # Thai
    "𠀀'll 𠀁𪚥's",                # CJK Extension B (plane 2)
    "１２３'s ４'ll",            # fullwidth digits (Nd)
    "Ⅻ's Ⅻ2 ⅷ'd",                # Roman numerals (Nl)
    "x²'s ³'ll ½'d ⑳'m",         # superscripts, fractions, circled numbers (No)
    "cafe\u0301's e\u0301'll",   # combining acute after a letter
    "ᎣᏏᏲ's ⴰⵣⵓⵍ'll 𐐷's",         # Cherokee, Tifinagh, Deseret (plane 1)
    "a\u00a0b\u3000\u3000c\u2029d\x1ce\x85 f",  # Unicode spaces; U+001C is not \s
]

# Added tokens with the flags HF applies around a match (normalized=False: matched in the
# raw text). "ab!" and "ab" share a start: HF searches leftmost-longest and, when a
# single_word match touches a word, drops it and searches on from its end.
ADDED_TOKENS = [
    AddedToken("[T]", single_word=True, normalized=False),
    AddedToken("ab!", single_word=True, normalized=False),
    AddedToken("ab", single_word=True, normalized=False),
    AddedToken("<mask>", lstrip=True, normalized=False),
    AddedToken("<sep>", rstrip=True, normalized=False),
]

ADDED_TOKEN_STRINGS = [
    "[T] x[T] [T]x x [T] y",       # alone, after a letter, before a letter
    "ab ab! ab!x xab ab_ ab-",     # "ab!" refused before x leaves "ab" unmatched there too
    "ab!x ab!! (ab) ab.",
    "[T]\u0301 \u0301[T] [T]\u203f [T]\u200d",  # a combining mark, U+203F (Pc), ZWJ: word chars
    "[T]\u00b2 [T]\u2167 [T]\u24b6 [T]\u2460",  # ² (No): no; Ⅷ (Nl), Ⓐ (So, Alphabetic): yes; ① (No): no
    "[T]\u0661 [T]\uff3f [T]\u3000 [T]\u00a0x",  # Arabic-Indic 1 (Nd), fullwidth _ (Pc), spaces
    "a   <mask> b <mask>c\t\t<mask>",  # lstrip swallows the whitespace before
    "<sep>   a <sep>\n\nb<sep>",       # rstrip the whitespace after
    "x<mask><mask>  <sep>  <sep>y",
    "<mask>[T]<sep>ab",
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


def bytelevel_added_from(bytelevel):
    tokenizer = Tokenizer.from_str(bytelevel.to_str())
    tokenizer.add_tokens(ADDED_TOKENS)
    return tokenizer


def word_char_runs():
    """Which code points HF tokenizers counts as word characters (\\w) beside a single_word
    added token, as int32 runs (first, last, 1 / 0): the token is encoded with each code
    point after it and before it, and it is a word character where the token did not
    match. The two sides must agree."""
    probe = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    probe.add_tokens([AddedToken("\u00a7\u00a7", single_word=True, normalized=False)])
    token_id = probe.token_to_id("\u00a7\u00a7")
    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    after = probe.encode_batch(["\u00a7\u00a7" + chr(cp) for cp in code_points], add_special_tokens=False)
    before = probe.encode_batch([chr(cp) + "\u00a7\u00a7" for cp in code_points], add_special_tokens=False)
    word = {}
    for cp, a, b in zip(code_points, after, before):
        word[cp] = int(token_id not in a.ids)
        if word[cp] != int(token_id not in b.ids):
            raise SystemExit(f"U+{cp:04X}: HF's single_word check differs before and after the token")
    return np.array(class_runs([(0, 0x10FFFF)], word.__getitem__), dtype=np.int32)


def cases_for(tokenizer, extra_strings=()):
    cases = []
    for text in list(TEST_STRINGS) + list(extra_strings):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=False)})
    return cases


def unicode_class(cp):
    """The class the ByteLevel regex's \\p{L}, \\p{N} and \\s see: "L", "N", "space" or "other".
    \\s is Oniguruma's Unicode \\s (HF's regex engine): U+0009..U+000D, U+0085 and the
    categories Zs Zl Zp (Python's isspace() also counts U+001C..U+001F, which it does not)."""
    cat = unicodedata.category(chr(cp))
    if 0x09 <= cp <= 0x0D or cp == 0x85 or cat in ("Zs", "Zl", "Zp"):
        return "space"
    return cat[0] if cat[0] in "LN" else "other"


def class_runs(blocks, class_of=unicode_class):
    """[[first, last, class], ...]: maximal runs of one class_of(cp) within `blocks`,
    surrogates left out."""
    runs = []
    for first, last in blocks:
        for cp in range(first, last + 1):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            cls = class_of(cp)
            if runs and runs[-1][1] == cp - 1 and runs[-1][2] == cls:
                runs[-1][1] = cp
            else:
                runs.append([cp, cp, cls])
    return runs


def unicode_class_runs():
    """Every code point's class as int32 runs (first, last, code), for test_ch08_unicode.
    Python 3.11's unicodedata is Unicode 14.0; HF's regex (Oniguruma) uses 16.0 and its
    Digits (Rust's char::is_numeric) 17.0, so HF also sees letters and numbers among the
    code points unassigned in 14.0 that this expectation (and our table) call "other"."""
    codes = {"other": 0, "L": 1, "N": 2, "space": 3}
    runs = class_runs([(0, 0x10FFFF)])
    return np.array([[first, last, codes[cls]] for first, last, cls in runs], dtype=np.int32)


def main():
    out = parse_out_dir()
    bytelevel = train_bytelevel()
    metaspace = train_metaspace()
    tokenizers_ = {"bytelevel": bytelevel, "bytelevel_string_merges": string_merges_from(bytelevel),
                   "bytelevel_prefix": bytelevel_prefix_from(bytelevel),
                   "metaspace": metaspace, "metaspace_nosplit": metaspace_nosplit_from(metaspace),
                   "metaspace_always": metaspace_always_from(metaspace),
                   "llama_legacy": llama_legacy_from(metaspace),
                   "bytelevel_added": bytelevel_added_from(bytelevel)}
    cases = {}
    for name, tokenizer in tokenizers_.items():
        text = tokenizer if isinstance(tokenizer, str) else tokenizer.to_str()
        with open(os.path.join(out, f"{name}.json"), "w", encoding="utf-8") as f:
            f.write(text)
        extra = ADDED_TOKEN_STRINGS if name == "bytelevel_added" else ()
        cases[name] = cases_for(Tokenizer.from_str(text), extra)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    np.save(os.path.join(out, "unicode_class_runs.npy"), unicode_class_runs())
    np.save(os.path.join(out, "word_char_runs.npy"), word_char_runs())
    with open(os.path.join(out, "unicode_version.txt"), "w") as f:
        f.write(unicodedata.unidata_version + "\n")


if __name__ == "__main__":
    main()
