// tokenizer.json -> Tokenizer: added tokens, normalizer, pre-tokenizer, BPE, decoder.
#include "tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "utf8.hpp"

namespace bielik {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string type_of(const json& spec, const std::string& path, const char* what) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    fail(path, std::string(what) + " entry has no \"type\": " + spec.dump().substr(0, 200));
  return spec["type"].get<std::string>();
}

// Replace's pattern is {"String": " "} (or {"Regex": ...}, which we do not implement).
std::string string_pattern(const json& spec, const std::string& path, const char* what) {
  const json& pattern = spec.value("pattern", json());
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string())
    return pattern["String"].get<std::string>();
  fail(path, std::string(what) + " Replace with pattern " + pattern.dump() +
                 " is not supported (only {\"String\": ...} patterns)");
}

// The Unicode code point that ends just before byte `end` (end > 0).
size_t previous_char_start(const std::string& text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

// "<0xNN>" -> NN, or -1: what HF's ByteFallback decoder recognises.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  int high = hex(token[3]), low = hex(token[4]);
  return high < 0 || low < 0 ? -1 : high * 16 + low;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Loading

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open tokenizer file (tokenizer.json)");
  json root;
  try {
    root = json::parse(in);
  } catch (const json::exception& error) {  // parse_error, or out_of_range for a number like 4e335
    fail(path, std::string("malformed JSON: ") + error.what());
  }
  if (!root.is_object()) fail(path, "tokenizer.json is not a JSON object");
  if (!root.contains("model")) fail(path, "has no \"model\" (the BPE vocabulary and merges)");
  try {
    return from_json(root, path);
  } catch (const json::exception& error) {  // a field of an unexpected JSON type
    fail(path, std::string("unexpected content: ") + error.what());
  }
}

Tokenizer Tokenizer::from_json(const json& root, const std::string& path) {
  Tokenizer t;
  t.path_ = path;
  t.model_ = BpeModel::from_json(root["model"], path);
  t.pre_tokenizer_ = PreTokenizer::from_json(root.value("pre_tokenizer", json()), path);

  // Normalizer: only the two string edits SentencePiece-converted Llama files use.
  std::vector<json> normalizers;
  const json& normalizer = root.value("normalizer", json());
  if (!normalizer.is_null()) {
    if (type_of(normalizer, path, "normalizer") == "Sequence")
      for (const json& n : normalizer.value("normalizers", json::array())) normalizers.push_back(n);
    else
      normalizers.push_back(normalizer);
  }
  for (const json& n : normalizers) {
    std::string type = type_of(n, path, "normalizer");
    if (type == "Prepend")
      t.normalizer_.push_back({"", n.value("prepend", std::string())});
    else if (type == "Replace")
      t.normalizer_.push_back({string_pattern(n, path, "normalizer"), n.value("content", std::string())});
    else
      fail(path, "normalizer type '" + type + "' is not supported (implemented: Prepend, Replace, Sequence)");
  }

  // Decoder.
  const json& decoder = root.value("decoder", json());
  t.has_decoder_ = !decoder.is_null();
  std::vector<json> decoders;
  if (t.has_decoder_) {
    if (type_of(decoder, path, "decoder") == "Sequence")
      for (const json& d : decoder.value("decoders", json::array())) decoders.push_back(d);
    else
      decoders.push_back(decoder);
  }
  bool fused = false;
  for (const json& d : decoders) {
    std::string type = type_of(d, path, "decoder");
    DecodeStep step;
    if (type == "ByteLevel") {
      step.kind = DecodeStep::ByteLevel;
    } else if (type == "ByteFallback") {
      step.kind = DecodeStep::ByteFallback;
    } else if (type == "Fuse") {
      step.kind = DecodeStep::Fuse;
      fused = true;
    } else if (type == "Replace") {
      step.kind = DecodeStep::Replace;
      step.from = string_pattern(d, path, "decoder");
      step.to = d.value("content", std::string());
    } else if (type == "Metaspace") {
      step.kind = DecodeStep::Metaspace;
      step.from = d.value("replacement", std::string("\xE2\x96\x81"));
      std::string scheme = d.contains("prepend_scheme") && d["prepend_scheme"].is_string()
                               ? d["prepend_scheme"].get<std::string>()
                               : (d.value("add_prefix_space", true) ? "always" : "never");
      step.strip_first = scheme != "never";
    } else if (type == "Strip") {
      step.kind = DecodeStep::Strip;
      step.strip_char = d.value("content", std::string(" "));
      step.strip_start = d.value("start", 0);
      step.strip_stop = d.value("stop", 0);
      if (fused) {  // after Fuse there is one token: the strip applies to the whole text
        if (step.strip_stop != 0)
          fail(path, "decoder Strip with stop > 0 after Fuse is not supported (it cannot stream)");
        t.text_strip_char_ = step.strip_char;
        t.text_strip_count_ = step.strip_start;
        continue;
      }
    } else {
      fail(path, "decoder type '" + type +
                     "' is not supported (implemented: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)");
    }
    t.decoder_.push_back(step);
  }

  // Added tokens: the strings matched before anything else.
  int64_t size = t.model_.size();  // int64: an id of INT32_MAX + 1 must not wrap
  const json& added = root.value("added_tokens", json::array());
  if (!added.is_array()) fail(path, "\"added_tokens\" is not a list");
  const int64_t entries = int64_t(t.model_.entries()) + int64_t(added.size());
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > INT32_MAX)
      fail(path, "added token " + a.dump() + " needs an integer \"id\" and a string \"content\"");
    if (a["id"].get<int64_t>() > max_token_id(entries))
      fail(path, "added token " + a.dump() + " has an id far beyond the " + std::to_string(entries) +
                     " tokens of the file (vocabulary and added tokens; ids must be numbered from 0)");
    AddedToken token{a["content"].get<std::string>(), a["id"].get<int32_t>(), a.value("special", false),
                     a.value("lstrip", false), a.value("rstrip", false), a.value("single_word", false),
                     a.value("normalized", false)};
    if (token.content.empty()) fail(path, "added token " + std::to_string(token.id) + " has empty content");
    t.added_ids_[token.content] = token.id;
    t.added_.push_back(token);
    size = std::max(size, int64_t(token.id) + 1);
  }
  for (AddedToken& token : t.added_)
    if (token.normalized) token.content = t.normalize(token.content);
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });

  t.strings_.assign(size_t(size), std::string());
  t.special_.assign(size_t(size), 0);
  for (int32_t id = 0; id < t.model_.size(); ++id) t.strings_[size_t(id)] = t.model_.token(id);
  for (const json& a : added) {
    int32_t id = a["id"].get<int32_t>();
    t.strings_[size_t(id)] = a["content"].get<std::string>();
    t.special_[size_t(id)] = a.value("special", false);
  }
  t.token_bytes_.resize(size_t(size));
  for (int32_t id = 0; id < int32_t(size); ++id) t.token_bytes_[size_t(id)] = t.decode_token(id, false);
  return t;
}

// ---------------------------------------------------------------------------------------
// Encoding

std::string Tokenizer::normalize(const std::string& text) const {
  std::string out = text;
  for (const auto& [from, to] : normalizer_) {
    if (from.empty()) {  // Prepend (HF prepends only to non-empty text)
      if (!out.empty()) out = to + out;
    } else {
      out = replace_all(out, from, to);
    }
  }
  return out;
}

std::vector<Tokenizer::Segment> Tokenizer::split_added(const std::vector<Segment>& in, bool normalized) const {
  std::vector<Segment> out;
  for (const Segment& segment : in) {
    if (segment.added_id >= 0) {
      out.push_back(segment);
      continue;
    }
    const std::string& text = segment.text;
    size_t plain_start = 0;  // start of the text not yet emitted
    size_t i = 0;
    while (i < text.size()) {
      // HF's search: the leftmost match, the longest there (added_ is sorted longest first).
      const AddedToken* match = nullptr;
      for (const AddedToken& token : added_) {
        if (token.normalized == normalized && text.compare(i, token.content.size(), token.content) == 0) {
          match = &token;
          break;
        }
      }
      if (!match) {
        i += utf8::scan(text, i).length;
        continue;
      }
      size_t start = i, end = i + match->content.size();
      size_t length;
      // A single_word token must not touch a word character (the Rust regex crate's \w) on
      // either side. If it does, HF drops the match and searches on from its end, not
      // inside it: a shorter token at the same place is not tried ("ab!" refused in "ab!x"
      // leaves "ab" unmatched too).
      if (match->single_word &&
          ((start > 0 && is_word_char(utf8::decode(text, previous_char_start(text, start), &length))) ||
           (end < text.size() && is_word_char(utf8::decode(text, end, &length))))) {
        i = end;
        continue;
      }
      if (match->lstrip)  // the token swallows the whitespace before it
        while (start > plain_start &&
               is_whitespace(utf8::decode(text, previous_char_start(text, start), &length)))
          start = previous_char_start(text, start);
      if (match->rstrip)  // ... and after it
        while (end < text.size() && is_whitespace(utf8::decode(text, end, &length))) end += length;
      if (start > plain_start)
        out.push_back({text.substr(plain_start, start - plain_start), -1, segment.at_start && plain_start == 0});
      out.push_back({match->content, match->id, false});
      plain_start = i = end;
    }
    if (plain_start < text.size())
      out.push_back({text.substr(plain_start), -1, segment.at_start && plain_start == 0});
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  size_t bad = utf8::find_invalid(text);
  if (bad != std::string::npos)
    throw std::invalid_argument("input is not valid UTF-8 at byte " + std::to_string(bad));

  std::vector<int32_t> ids;
  for (const Segment& raw : split_added({{text, -1, true}}, /*normalized=*/false)) {
    if (raw.added_id >= 0) {
      ids.push_back(raw.added_id);
      continue;
    }
    Segment normalized{normalize(raw.text), -1, raw.at_start};
    for (const Segment& segment : split_added({normalized}, /*normalized=*/true)) {
      if (segment.added_id >= 0) {
        ids.push_back(segment.added_id);
        continue;
      }
      for (const Piece& piece : pre_tokenizer_.run({Piece{segment.text, segment.at_start}}))
        model_.encode_word(piece.text, ids);
    }
  }
  return ids;
}

// ---------------------------------------------------------------------------------------
// Decoding

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size() || strings_[size_t(id)].empty())
    throw std::out_of_range(path_ + ": token id " + std::to_string(id) + " is not in the vocabulary (size " +
                            std::to_string(vocab_size()) + ")");
}

std::string Tokenizer::decode_token(int32_t id, bool first) const {
  std::string s = strings_[size_t(id)];
  for (const DecodeStep& step : decoder_) {
    switch (step.kind) {
      case DecodeStep::ByteLevel: {  // characters of the byte alphabet back to bytes
        std::string bytes;
        bool all_mapped = true;
        for (size_t i = 0; i < s.size() && all_mapped;) {
          size_t length;
          int b = char_to_byte(utf8::decode(s, i, &length));
          all_mapped = b >= 0;
          bytes += char(b);
          i += length;
        }
        if (all_mapped) s = bytes;  // HF leaves a token with other characters as it is
        break;
      }
      case DecodeStep::Replace:
        s = replace_all(s, step.from, step.to);
        break;
      case DecodeStep::ByteFallback: {
        int b = byte_token_value(s);
        if (b >= 0) s = std::string(1, char(b));
        break;
      }
      case DecodeStep::Metaspace:
        // HF removes every replacement character of the first token (the prepended
        // space), and turns it into a space everywhere else.
        s = replace_all(s, step.from, first && step.strip_first ? "" : " ");
        break;
      case DecodeStep::Fuse:
        break;
      case DecodeStep::Strip: {  // per token (Strip before any Fuse)
        for (int k = 0; k < step.strip_start && s.compare(0, step.strip_char.size(), step.strip_char) == 0; ++k)
          s.erase(0, step.strip_char.size());
        for (int k = 0; k < step.strip_stop && s.size() >= step.strip_char.size() &&
                        s.compare(s.size() - step.strip_char.size(), step.strip_char.size(), step.strip_char) == 0;
             ++k)
          s.erase(s.size() - step.strip_char.size());
        break;
      }
    }
  }
  return s;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const { return decode(ids, false); }

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  StreamDecoder stream(*this);
  std::string text;
  for (int32_t id : ids) {
    check_id(id);
    if (skip_special && is_special(id)) continue;
    text += stream.push(id);
  }
  return text + stream.flush();
}

std::string Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return token_bytes_[size_t(id)];
}

const std::string& Tokenizer::token_string(int32_t id) const {
  check_id(id);
  return strings_[size_t(id)];
}

int32_t Tokenizer::token_to_id(const std::string& token) const {
  auto it = added_ids_.find(token);
  return it != added_ids_.end() ? it->second : model_.id(token);
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[size_t(id)]; }

// ---------------------------------------------------------------------------------------
// Streaming

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer)
    : tokenizer_(&tokenizer), strip_left_(tokenizer.text_strip_count()) {}

std::string StreamDecoder::push(int32_t id) {
  tokenizer_->check_id(id);
  std::string bytes;
  if (!tokenizer_->has_decoder_ && !first_) bytes = " ";  // no decoder: HF joins with spaces
  bytes += first_ ? tokenizer_->decode_token(id, true) : tokenizer_->token_bytes_[size_t(id)];
  first_ = false;
  // Strip after Fuse removes leading characters of the whole text; the text may begin
  // with empty tokens, so keep stripping until something else has appeared.
  const std::string& c = tokenizer_->text_strip_char_;
  while (strip_left_ > 0 && !bytes.empty()) {
    if (bytes.compare(0, c.size(), c) != 0) {
      strip_left_ = 0;
      break;
    }
    bytes.erase(0, c.size());
    --strip_left_;
  }
  pending_ += bytes;
  size_t complete = utf8::complete_prefix(pending_);
  std::string out = utf8::to_valid(pending_.substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::to_valid(pending_);
  pending_.clear();
  return out;
}

}  // namespace bielik
