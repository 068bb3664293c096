/// @file tokenizer.hpp
/// @brief A HuggingFace tokenizer.json (BPE) read and run by hand: text <-> token ids.
///
/// encode(text), in the order HF tokenizers runs it:
///   1. added tokens ("<|im_start|>", "<s>", ...) are found in the raw text first,
///      leftmost, longest match first; they become their ids directly;
///   2. each stretch of text between them is normalized ("normalizer": none, or
///      Prepend / Replace, as in older Llama tokenizers);
///   3. pre-tokenized into words (pretokenizer.hpp: ByteLevel, Digits, Metaspace);
///   4. each word goes through BPE (tokenizer_bpe.hpp).
/// decode(ids) runs the "decoder" steps (ByteLevel, Metaspace, Replace, ByteFallback,
/// Fuse, Strip) on each token and joins the bytes.
///
/// Supported: the byte-level BPE of GPT-2 / SmolLM2 and the SentencePiece-style BPE with
/// Metaspace and byte fallback (Llama, Mistral, Bielik). Anything else in the file is
/// refused with an error naming the file and the unsupported type.
///
/// One known difference from HF: for a run of <0xNN> byte tokens that is not valid
/// UTF-8, HF's ByteFallback writes one U+FFFD per byte token, we write one per maximal
/// invalid subsequence (as for byte-level models, where HF does the same). Valid text
/// decodes identically.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pretokenizer.hpp"
#include "tokenizer_bpe.hpp"

namespace bielik {

class Tokenizer {
 public:
  /// Reads tokenizer.json. Throws std::runtime_error naming the file: missing file, bad
  /// JSON, no "model", unsupported model / normalizer / pre-tokenizer / decoder type.
  static Tokenizer from_file(const std::string& tokenizer_json_path);

  /// Text -> ids: added/special tokens matched first, then normalize, pre-tokenize, BPE.
  /// No BOS is added here. Throws std::invalid_argument("input is not valid UTF-8 at
  /// byte N") for invalid input.
  std::vector<int32_t> encode(const std::string& text) const;

  /// Ids -> text, special tokens included (HF's skip_special_tokens=False). Throws
  /// std::out_of_range for an id outside [0, vocab_size()) or one with no token.
  std::string decode(const std::vector<int32_t>& ids) const;
  /// Same, leaving out special tokens when `skip_special` (for printing a reply).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;

  /// The decoded bytes of one token, as if it were not the first token of a text (so
  /// "▁Hello" gives " Hello"). May be an incomplete UTF-8 sequence (one byte of "ł").
  std::string token_text(int32_t id) const;
  /// The token's string in tokenizer.json ("Ġworld", "▁świat", "<|im_end|>").
  const std::string& token_string(int32_t id) const;
  /// Id of a token string (added tokens first, then the vocabulary), -1 if absent.
  int32_t token_to_id(const std::string& token) const;
  /// One more than the highest id (vocabulary and added tokens together).
  int32_t vocab_size() const { return int32_t(strings_.size()); }
  /// True for added tokens marked "special" (<s>, </s>, <|im_start|>, ...).
  bool is_special(int32_t id) const;
  const std::string& path() const { return path_; }

 private:
  friend class StreamDecoder;

  struct AddedToken {
    std::string content;  // as matched (normalized first if `normalized`)
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
  };
  struct Segment {  // a stretch of input: either an added token or text to tokenize
    std::string text;
    int32_t added_id;  // -1 for plain text
    bool at_start;     // begins at byte 0 of the input
  };
  // The decoder as a list of per-token steps plus whole-text effects.
  struct DecodeStep {
    enum Kind { ByteLevel, Replace, ByteFallback, Metaspace, Fuse, Strip } kind;
    std::string from, to;      // Replace; Metaspace: from = replacement
    bool strip_first = false;  // Metaspace: drop the replacement in the first token
    std::string strip_char;    // Strip
    int strip_start = 0, strip_stop = 0;
  };

  static Tokenizer from_json(const nlohmann::json& root, const std::string& path);
  std::vector<Segment> split_added(const std::vector<Segment>& in, bool normalized) const;
  std::string normalize(const std::string& text) const;
  void check_id(int32_t id) const;
  /// Decoded bytes of token `id`; `first` = it is the first token of the text.
  std::string decode_token(int32_t id, bool first) const;
  /// Whole-text leading strip after Fuse: how many `text_strip_char_` to remove.
  int text_strip_count() const { return text_strip_count_; }

  std::string path_;
  BpeModel model_;
  PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_;             // sorted longest content first
  std::vector<std::string> strings_;          // id -> token string
  std::vector<uint8_t> special_;              // id -> 1 if special
  std::unordered_map<std::string, int32_t> added_ids_;
  std::vector<std::pair<std::string, std::string>> normalizer_;  // ("", x) = Prepend x, (a, b) = Replace a -> b
  std::vector<DecodeStep> decoder_;
  bool has_decoder_ = false;    // without a decoder HF joins tokens with spaces
  std::string text_strip_char_;
  int text_strip_count_ = 0;
  std::vector<std::string> token_bytes_;      // cache: decode_token(id, false)
};

/// Streaming decode for a chat loop: push ids as the model samples them and print what
/// comes back. It holds back bytes that may still become a character, so it never
/// returns half a UTF-8 character; push(...) + ... + flush() equals decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer);
  /// The text completed by this token (possibly empty).
  std::string push(int32_t id);
  /// Whatever is held back; bytes that never completed a character become U+FFFD.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool first_ = true;       // the next token is the first of the text
  int strip_left_ = 0;      // leading strip characters still to remove (Strip decoder)
  std::string pending_;     // bytes of an incomplete character
};

}  // namespace bielik
