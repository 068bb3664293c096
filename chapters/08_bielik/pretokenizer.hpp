/// @file pretokenizer.hpp
/// @brief Pre-tokenization: cutting text into the "words" BPE works on, as tokenizer.json's
/// "pre_tokenizer" describes it.
///
/// BPE never merges across a pre-token boundary, so these rules decide, for example,
/// that " world" is one unit in GPT-2-style models while "1234" becomes four digits in
/// SmolLM2. Implemented steps (HF tokenizers names):
///
///   ByteLevel  GPT-2's regex split, then every byte is written as one printable
///              character of a 256-character alphabet (so the vocabulary is plain text)
///   Digits     digits isolated, one by one or as runs
///   Metaspace  spaces become "▁" (U+2581), "▁" prepended, split before each "▁"
///   Sequence   the steps above in order, each applied to every piece of the last
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bielik {

// --- Unicode classes used by the GPT-2 regex and Digits -------------------------------

/// General category L* (Lu Ll Lt Lm Lo: the regex's `\p{L}`), every plane, from the
/// generated unicode_tables.inc. Combining marks (M*) are not letters, as in HF.
bool is_letter(uint32_t cp);
/// General category N* (Nd, Nl, No: 0-9, ², ½, Ⅻ, ١, ...): `\p{N}` and Rust's
/// char::is_numeric (HF's Digits), every plane.
bool is_number(uint32_t cp);
/// `\w` of the Rust regex crate (Alphabetic + M + Nd + Pc + Join_Control: letters, marks,
/// decimal digits, letter numbers, '_' and the other connector punctuation, ZWNJ / ZWJ,
/// circled Latin letters), every plane: what HF tokenizers asks of the characters beside a
/// `single_word` added token. Not the regex's letters or numbers: ² is a number but no word
/// character, a combining accent the reverse.
bool is_word_char(uint32_t cp);
/// The Unicode version of those tables ("14.0.0"): code points assigned after it count
/// as neither letter nor number (HF's engines use newer tables; see unicode_tables.inc).
const char* unicode_tables_version();
/// `\s` of HF's regex engine (Oniguruma, Unicode): U+0009..U+000D, U+0085, Zs, Zl, Zp;
/// the same set as the White_Space property (`\s` in the Rust regex crate).
bool is_whitespace(uint32_t cp);

// --- The pieces ------------------------------------------------------------------------

/// One pre-token. `at_start` is true only for the piece that begins at the very start
/// of the user's text (Metaspace's prepend_scheme "first" prepends "▁" only there).
struct Piece {
  std::string text;
  bool at_start = false;
};

/// GPT-2's split, written out by hand instead of with a regex engine:
/// \verbatim
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// \endverbatim
/// `text` must be valid UTF-8. Concatenating the result gives back `text`.
std::vector<std::string> split_gpt2(const std::string& text);

/// GPT-2's byte -> character table: the 188 printable bytes map to themselves as code
/// points, the other 68 (controls, space, ...) to U+0100 upward, so " " becomes "Ġ"
/// and "\n" becomes "Ċ". Returns the UTF-8 of the character for `byte`.
const std::string& byte_to_char(uint8_t byte);
/// The inverse: the byte for a code point of that alphabet, or -1.
int char_to_byte(uint32_t cp);

/// A pre-tokenizer built from tokenizer.json's "pre_tokenizer" (null: one piece per
/// input segment). Throws std::runtime_error naming `path` for an unsupported type.
class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& spec, const std::string& path);
  std::vector<Piece> run(std::vector<Piece> pieces) const;

 private:
  enum class Kind { ByteLevel, Digits, Metaspace };
  enum class Prepend { Always, First, Never };
  struct Step {
    Kind kind;
    bool add_prefix_space = false;   // ByteLevel
    bool use_regex = true;           // ByteLevel
    bool individual_digits = false;  // Digits
    std::string replacement;         // Metaspace, usually "▁"
    Prepend prepend = Prepend::Always;
    bool split = true;               // Metaspace
  };
  static void add_steps(const nlohmann::json& spec, const std::string& path, std::vector<Step>& steps);
  static std::vector<Piece> apply(const Step& step, const Piece& piece);

  std::vector<Step> steps_;
};

}  // namespace bielik
