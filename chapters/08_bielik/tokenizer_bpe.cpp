// BPE: load vocab + ranked merges; encode one word with a priority queue of merges.
#include "tokenizer_bpe.hpp"

#include <cstdio>
#include <queue>
#include <stdexcept>

#include "utf8.hpp"

namespace bielik {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

std::string byte_token(int b) {
  char name[8];
  std::snprintf(name, sizeof name, "<0x%02X>", b);
  return name;
}

}  // namespace

BpeModel BpeModel::from_json(const json& model, const std::string& path) {
  if (!model.is_object()) fail(path, "\"model\" is not an object");
  std::string type = model.value("type", std::string("BPE"));  // very old files omit it
  if (type != "BPE") fail(path, "model type '" + type + "' is not supported: only BPE is implemented");
  // Options this implementation does not have. Refuse them instead of encoding wrongly.
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      fail(path, std::string("BPE option '") + key + "' is not supported");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0)
    fail(path, "BPE dropout is not supported (it makes encoding random)");

  BpeModel bpe;
  if (!model.contains("vocab") || !model["vocab"].is_object()) fail(path, "model has no \"vocab\" object");
  const int64_t entries = int64_t(model["vocab"].size());
  int64_t max_id = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      fail(path, "vocab entry '" + it.key() + "' has id " + it.value().dump() + ", not a non-negative integer");
    const int64_t id = it.value().get<int64_t>();
    if (id > max_token_id(entries))
      fail(path, "vocab entry '" + it.key() + "' has id " + std::to_string(id) + ", far beyond the " +
                     std::to_string(entries) + " entries of the vocabulary (ids must be numbered from 0)");
    bpe.ids_[it.key()] = int32_t(id);
    max_id = std::max(max_id, id);
  }
  bpe.tokens_.assign(size_t(max_id + 1), std::string());
  for (const auto& [token, id] : bpe.ids_) {
    if (!bpe.tokens_[size_t(id)].empty()) fail(path, "vocab gives id " + std::to_string(id) + " to two tokens");
    bpe.tokens_[size_t(id)] = token;
  }

  if (!model.contains("merges") || !model["merges"].is_array()) fail(path, "model has no \"merges\" list");
  int32_t rank = 0;
  for (const json& merge : model["merges"]) {
    std::string left, right;
    if (merge.is_string()) {  // "a b": tokens never contain a plain space in BPE vocabularies
      std::string text = merge.get<std::string>();
      size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        fail(path, "merge \"" + text + "\" is not two tokens separated by one space");
      left = text.substr(0, space), right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>(), right = merge[1].get<std::string>();
    } else {
      fail(path, "merge " + merge.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    int32_t a = bpe.id(left), b = bpe.id(right), merged = bpe.id(left + right);
    if (a < 0 || b < 0 || merged < 0)
      fail(path, "merge #" + std::to_string(rank) + " (" + left + ", " + right + ") uses a token missing from vocab");
    // A pair listed twice keeps its first (lowest) rank, as HF does.
    bpe.merges_.emplace(pair_key(a, b), Merge{rank, merged});
    ++rank;
  }

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    bpe.unk_id_ = bpe.id(model["unk_token"].get<std::string>());
    if (bpe.unk_id_ < 0) fail(path, "unk_token '" + model["unk_token"].get<std::string>() + "' is not in vocab");
  }
  bpe.fuse_unk_ = model.value("fuse_unk", false);
  bpe.byte_fallback_ = model.value("byte_fallback", false);
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  for (int b = 0; b < 256; ++b) bpe.byte_ids_[b] = bpe.byte_fallback_ ? bpe.id(byte_token(b)) : -1;
  return bpe;
}

const std::string& BpeModel::token(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && id < size() ? tokens_[size_t(id)] : kNone;
}

int32_t BpeModel::id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

int BpeModel::byte_of(int32_t id) const {
  if (!byte_fallback_) return -1;
  const std::string& t = token(id);
  // "<0xNN>" with exactly two uppercase hex digits.
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  unsigned value;
  if (std::sscanf(t.c_str() + 3, "%2X", &value) != 1) return -1;
  return byte_ids_[value] == id ? int(value) : -1;
}

void BpeModel::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // Llama-3-style option: a word that is a token stays whole
    int32_t whole = id(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }

  // 1. The starting symbols: one per character, as a doubly linked list so merging two
  //    neighbours is O(1). `id == kGone` marks a symbol merged into its left neighbour.
  constexpr int32_t kGone = -2;
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  auto add = [&](int32_t id) {
    int index = int(symbols.size());
    symbols.push_back({id, index - 1, -1});
    if (index > 0) symbols[size_t(index - 1)].next = index;
  };
  bool pending_unk = false;  // fuse_unk: a run of unknown characters becomes one unk
  for (size_t i = 0; i < word.size();) {
    size_t length = utf8::scan(word, i).length;
    std::string character = word.substr(i, length);
    i += length;
    int32_t found = id(character);
    if (found >= 0) {
      if (pending_unk) add(unk_id_), pending_unk = false;
      add(found);
      continue;
    }
    if (byte_fallback_) {  // the character's UTF-8 bytes as <0xNN> tokens, if all exist
      bool all = true;
      for (unsigned char b : character) all = all && byte_ids_[b] >= 0;
      if (all) {
        if (pending_unk) add(unk_id_), pending_unk = false;
        for (unsigned char b : character) add(byte_ids_[b]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk && !fuse_unk_) add(unk_id_);
      pending_unk = true;
    }
    // No unk token and no fallback: HF drops the character; so do we.
  }
  if (pending_unk) add(unk_id_);

  // 2. Merge: always the lowest-rank pair present, leftmost first among equal ranks.
  //    A min-heap of candidate merges; entries go stale when a neighbour changes, and are
  //    recognised as stale when popped (the pair there no longer makes the same token).
  struct Candidate {
    int32_t rank;
    int pos;  // index of the left symbol
    int32_t result;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int left) {
    if (left < 0 || symbols[size_t(left)].next < 0) return;
    auto it = merges_.find(pair_key(symbols[size_t(left)].id, symbols[size_t(symbols[size_t(left)].next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.result});
  };
  for (int i = 0; i + 1 < int(symbols.size()); ++i) consider(i);

  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (left.id == kGone || left.next < 0) continue;
    Symbol& right = symbols[size_t(left.next)];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.result != top.result) continue;  // stale
    left.id = top.result;
    right.id = kGone;
    left.next = right.next;
    if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }

  for (const Symbol& s : symbols)
    if (s.id != kGone) out.push_back(s.id);
}

}  // namespace bielik
