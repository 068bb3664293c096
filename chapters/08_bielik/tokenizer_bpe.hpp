/// @file tokenizer_bpe.hpp
/// @brief The BPE model of tokenizer.json: a vocabulary and a ranked list of merges.
///
/// Byte-pair encoding turns one pre-token ("word") into ids: start from its single
/// characters, then repeatedly merge the adjacent pair whose merge was learned earliest
/// (lowest rank) until no learned merge applies. The result is deterministic and
/// depends only on the merge ranks, which is why tokenizer.json stores them in order.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace bielik {

/// The largest token id a tokenizer.json listing `entries` tokens may use. Ids index
/// dense tables (id -> string, about 100 bytes per id), so one stray id such as
/// 2147483647 would ask for hundreds of GB, or overflow. Real files number their tokens
/// from 0 with at most a few gaps; four times the entries (plus room for a tiny test
/// vocabulary with a few special tokens far above it) is far beyond any of them.
inline int64_t max_token_id(int64_t entries) { return 4 * entries + 1024; }

class BpeModel {
 public:
  /// Reads tokenizer.json's "model" object (type "BPE"); merges may be "a b" strings
  /// or ["a", "b"] pairs. Throws std::runtime_error naming `path` on any problem.
  static BpeModel from_json(const nlohmann::json& model, const std::string& path);

  /// Appends the ids of one pre-token to `out`. Characters missing from the vocabulary
  /// become <0xNN> byte tokens (byte_fallback) or the unk token, or are dropped when
  /// the model has neither (as HF does).
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;

  /// id -> token string as stored in the vocabulary ("" for an id it lacks).
  const std::string& token(int32_t id) const;
  /// token string -> id, -1 if absent.
  int32_t id(const std::string& token) const;
  /// One more than the highest id in the vocabulary.
  int32_t size() const { return int32_t(tokens_.size()); }
  /// How many tokens the vocabulary lists (size() counts the ids it skips too).
  int32_t entries() const { return int32_t(ids_.size()); }
  /// The byte a "<0xNN>" token stands for, or -1 (only with byte_fallback).
  int byte_of(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;    // position in the merges list: lower merges first
    int32_t result;  // id of the merged token
  };
  static uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> tokens_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xNN> -> id, -1 where absent (byte_fallback only)
};

}  // namespace bielik
