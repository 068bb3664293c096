/// @file utf8.hpp
/// @brief The little UTF-8 the tokenizer needs: validate, iterate, encode, repair.
///
/// UTF-8 writes a code point in 1-4 bytes: 0xxxxxxx, 110xxxxx 10xxxxxx,
/// 1110xxxx 10xxxxxx 10xxxxxx, 11110xxx 10xxxxxx 10xxxxxx 10xxxxxx. "Valid" also means
/// shortest form (no overlong encodings), no surrogates (U+D800..DFFF), at most U+10FFFF.
/// A BPE token may end in the middle of a character (byte-level BPE splits a Polish
/// "ł" = C5 82 into two tokens when it must), which is why streaming output needs
/// `complete_prefix`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace bielik::utf8 {

/// Result of looking at the bytes starting at one position.
struct Scan {
  size_t length;   ///< bytes of the character, or of the maximal invalid subpart (>= 1)
  bool valid;      ///< a whole, valid character
  bool truncated;  ///< invalid only because the input ended inside a so-far-valid sequence
};

/// Looks at the sequence starting at bytes[i] (i < bytes.size()).
Scan scan(const std::string& bytes, size_t i);

/// Byte offset of the first byte that is not part of a valid character, or npos.
size_t find_invalid(const std::string& bytes);

/// "<what> is not valid UTF-8 at byte N of M" for the first invalid byte of `bytes`, or
/// "" when they are valid: the words a refusal of user text uses (the chat's message,
/// system prompt and flags).
std::string invalid_description(const std::string& what, const std::string& bytes);

/// The code point of the valid character at bytes[i], and its length in *length.
uint32_t decode(const std::string& bytes, size_t i, size_t* length);

/// UTF-8 bytes of one code point (must be a valid scalar value).
std::string encode(uint32_t code_point);

/// Every maximal invalid subpart replaced by U+FFFD, the way Rust's
/// String::from_utf8_lossy (and so HF tokenizers' decode) repairs bytes.
std::string to_valid(const std::string& bytes);

/// Length of the longest prefix that does not end inside a character that could still
/// be completed by more bytes. Bytes after it are held back by a streaming decoder.
size_t complete_prefix(const std::string& bytes);

}  // namespace bielik::utf8
