// Pre-tokenizers: Unicode classes, GPT-2's split by hand, the byte-level alphabet,
// Digits and Metaspace, driven by tokenizer.json's "pre_tokenizer".
#include "pretokenizer.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "utf8.hpp"

namespace bielik {

namespace {

struct Range {
  uint32_t first, last;
};

// kLetters (general category L: Lu Ll Lt Lm Lo), kNumbers (N: Nd Nl No), kWordChars
// (the Rust regex crate's \w, for single_word added tokens) and kUnicodeVersion, generated for every plane from Python's unicodedata by
// scripts/gen_unicode_tables.py: HF's ByteLevel regex decides by \p{L} and \p{N}, so a
// letter we called "other" would glue to a following apostrophe ("ﬁ'" "s" where HF
// gives "ﬁ" "'s"). test_ch08_unicode checks every code point against unicodedata.
#include "unicode_tables.inc"

template <size_t N>
bool in_ranges(const Range (&ranges)[N], uint32_t cp) {
  // Binary search: the first range whose last >= cp, then check its first.
  const Range* it = std::lower_bound(std::begin(ranges), std::end(ranges), cp,
                                     [](const Range& r, uint32_t value) { return r.last < value; });
  return it != std::end(ranges) && it->first <= cp;
}

}  // namespace

// ASCII, most of the text, skips the binary search over ~650, ~130 and ~760 ranges.
bool is_letter(uint32_t cp) { return cp < 0x80 ? (cp | 0x20) - 'a' < 26 : in_ranges(kLetters, cp); }
bool is_number(uint32_t cp) { return cp < 0x80 ? cp - '0' < 10 : in_ranges(kNumbers, cp); }
bool is_word_char(uint32_t cp) {
  return cp < 0x80 ? (cp | 0x20) - 'a' < 26 || cp - '0' < 10 || cp == '_' : in_ranges(kWordChars, cp);
}

const char* unicode_tables_version() { return kUnicodeVersion; }

// Oniguruma's Unicode \s (U+0009..U+000D, U+0085 and categories Zs Zl Zp), short enough
// to list; the same set as the White_Space property that Rust's regex \s uses.
bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// ---------------------------------------------------------------------------------------
// GPT-2's split. The regex tries its alternatives in order at each position; we do the
// same with one function per alternative on the code points of the text.
namespace {

enum class Class { Letter, Number, Space, Other };

Class classify(uint32_t cp) {
  if (is_whitespace(cp)) return Class::Space;
  if (is_letter(cp)) return Class::Letter;
  if (is_number(cp)) return Class::Number;
  return Class::Other;
}

// Index one past the end of the match that starts at code point i.
size_t gpt2_match(const std::vector<uint32_t>& cps, const std::vector<Class>& cls, size_t i) {
  size_t n = cps.size();
  // 's 't 're 've 'm 'll 'd : English contractions, ASCII apostrophe, lowercase only.
  if (cps[i] == '\'' && i + 1 < n) {
    uint32_t a = cps[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if (i + 2 < n) {
      uint32_t b = cps[i + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
  }
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional single space (U+0020 only),
  // then a run of one class. The space glues to the word after it: " world".
  size_t start = (cps[i] == ' ' && i + 1 < n) ? i + 1 : i;
  for (Class wanted : {Class::Letter, Class::Number, Class::Other}) {
    if (cls[start] != wanted) continue;
    size_t end = start;
    while (end < n && cls[end] == wanted) ++end;
    return end;
  }
  // "\s+(?!\S)": a whitespace run, but if a non-space follows, leave the run's last
  // character for that word (so "a   b" gives "a", "  ", " b"). A run of one before a
  // non-space falls to the last alternative "\s+" and matches alone.
  size_t end = i;
  while (end < n && cls[end] == Class::Space) ++end;
  if (end == n) return end;
  return end - i >= 2 ? end - 1 : i + 1;
}

}  // namespace

std::vector<std::string> split_gpt2(const std::string& text) {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;  // byte offset of each code point, plus the end
  for (size_t i = 0; i < text.size();) {
    size_t length;
    offsets.push_back(i);
    cps.push_back(utf8::decode(text, i, &length));
    i += length;
  }
  offsets.push_back(text.size());
  std::vector<Class> cls(cps.size());
  for (size_t k = 0; k < cps.size(); ++k) cls[k] = classify(cps[k]);

  std::vector<std::string> pieces;
  for (size_t i = 0; i < cps.size();) {
    size_t end = gpt2_match(cps, cls, i);
    pieces.push_back(text.substr(offsets[i], offsets[end] - offsets[i]));
    i = end;
  }
  return pieces;
}

// ---------------------------------------------------------------------------------------
// The byte-level alphabet. Printable Latin-1 bytes stand for themselves; the rest are
// numbered upward from U+0100 in byte order.
namespace {

bool printable_byte(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct ByteAlphabet {
  static constexpr uint32_t kEnd = 0x100 + 68;  // one past the highest code point used
  std::array<std::string, 256> chars;           // byte -> UTF-8 of its character
  std::array<int, kEnd> bytes;                  // code point -> byte, -1 if not in the alphabet
  ByteAlphabet() {
    bytes.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = printable_byte(b) ? uint32_t(b) : next++;
      chars[b] = utf8::encode(cp);
      bytes[cp] = b;
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet table;
  return table;
}

}  // namespace

const std::string& byte_to_char(uint8_t byte) { return alphabet().chars[byte]; }

int char_to_byte(uint32_t cp) { return cp < ByteAlphabet::kEnd ? alphabet().bytes[cp] : -1; }

// ---------------------------------------------------------------------------------------
// The configurable pre-tokenizer.

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

bool flag(const nlohmann::json& spec, const char* key, bool fallback) {
  return spec.contains(key) && spec[key].is_boolean() ? spec[key].get<bool>() : fallback;
}

// Splits `text` so every occurrence of `mark` starts a new piece ("▁a▁▁b" -> "▁a" "▁" "▁b"):
// HF's SplitDelimiterBehavior::MergedWithNext.
std::vector<std::string> split_before(const std::string& text, const std::string& mark) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at = text.find(mark, 1); at != std::string::npos; at = text.find(mark, at + mark.size())) {
    out.push_back(text.substr(start, at - start));
    start = at;
  }
  out.push_back(text.substr(start));
  if (!out.empty() && out.front().empty()) out.erase(out.begin());
  return out;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

}  // namespace

void PreTokenizer::add_steps(const nlohmann::json& spec, const std::string& path, std::vector<Step>& steps) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    fail(path, "pre_tokenizer entry has no \"type\": " + spec.dump().substr(0, 200));
  std::string type = spec["type"].get<std::string>();
  Step step;
  if (type == "Sequence") {
    if (!spec.contains("pretokenizers") || !spec["pretokenizers"].is_array())
      fail(path, "pre_tokenizer Sequence has no \"pretokenizers\" list");
    for (const auto& inner : spec["pretokenizers"]) add_steps(inner, path, steps);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::ByteLevel;
    step.add_prefix_space = flag(spec, "add_prefix_space", false);
    step.use_regex = flag(spec, "use_regex", true);
  } else if (type == "Digits") {
    step.kind = Kind::Digits;
    step.individual_digits = flag(spec, "individual_digits", false);
  } else if (type == "Metaspace") {
    step.kind = Kind::Metaspace;
    step.replacement = spec.value("replacement", std::string("\xE2\x96\x81"));
    if (utf8::find_invalid(step.replacement) != std::string::npos || step.replacement.empty())
      fail(path, "Metaspace replacement is not one valid character");
    // Newer files say prepend_scheme; older ones said add_prefix_space (true = always).
    std::string scheme = spec.contains("prepend_scheme") && spec["prepend_scheme"].is_string()
                             ? spec["prepend_scheme"].get<std::string>()
                             : (flag(spec, "add_prefix_space", true) ? "always" : "never");
    if (scheme == "always")
      step.prepend = Prepend::Always;
    else if (scheme == "first")
      step.prepend = Prepend::First;
    else if (scheme == "never")
      step.prepend = Prepend::Never;
    else
      fail(path, "Metaspace prepend_scheme '" + scheme + "' is unknown (always, first, never)");
    step.split = flag(spec, "split", true);
  } else {
    fail(path, "pre_tokenizer type '" + type +
                   "' is not supported (implemented: ByteLevel, Digits, Metaspace, Sequence of these)");
  }
  steps.push_back(step);
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& spec, const std::string& path) {
  PreTokenizer pre;
  if (!spec.is_null()) add_steps(spec, path, pre.steps_);
  return pre;
}

std::vector<Piece> PreTokenizer::apply(const Step& step, const Piece& piece) {
  std::vector<Piece> out;
  auto emit = [&](std::string text) {
    // Only the first piece cut from a piece that started the text keeps at_start.
    if (!text.empty()) out.push_back({std::move(text), piece.at_start && out.empty()});
  };
  switch (step.kind) {
    case Kind::ByteLevel: {
      std::string text = piece.text;
      if (step.add_prefix_space && text.compare(0, 1, " ") != 0) text = " " + text;
      std::vector<std::string> parts = step.use_regex ? split_gpt2(text) : std::vector<std::string>{text};
      for (const std::string& part : parts) {
        std::string mapped;
        for (unsigned char b : part) mapped += byte_to_char(b);
        emit(mapped);
      }
      break;
    }
    case Kind::Digits: {
      // Digits means Unicode N* here (Rust's char::is_numeric), not just 0-9.
      std::string run;
      bool run_is_digits = false;
      for (size_t i = 0; i < piece.text.size();) {
        size_t length;
        bool digit = is_number(utf8::decode(piece.text, i, &length));
        if (!run.empty() && (digit != run_is_digits || (digit && step.individual_digits))) {
          emit(run);
          run.clear();
        }
        run_is_digits = digit;
        run.append(piece.text, i, length);
        i += length;
      }
      emit(run);
      break;
    }
    case Kind::Metaspace: {
      std::string text = replace_all(piece.text, " ", step.replacement);
      bool starts_with_mark = text.compare(0, step.replacement.size(), step.replacement) == 0;
      if (!starts_with_mark &&
          (step.prepend == Prepend::Always || (step.prepend == Prepend::First && piece.at_start)))
        text = step.replacement + text;
      if (step.split) {
        for (std::string& part : split_before(text, step.replacement)) emit(std::move(part));
      } else {
        emit(std::move(text));
      }
      break;
    }
  }
  return out;
}

std::vector<Piece> PreTokenizer::run(std::vector<Piece> pieces) const {
  for (const Step& step : steps_) {
    std::vector<Piece> next;
    for (const Piece& piece : pieces)
      for (Piece& part : apply(step, piece)) next.push_back(std::move(part));
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace bielik
