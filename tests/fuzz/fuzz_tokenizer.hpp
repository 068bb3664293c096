/// @file fuzz_tokenizer.hpp
/// @brief What the two tokenizer fuzz targets share: the tokenizer they run on, loaded
/// once (before the first input), and the check that streaming equals decoding.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "tokenizer.hpp"
#include "utf8.hpp"

namespace bielik::fuzz {

/// BIELIK_FUZZ_TOKENIZER (a tokenizer.json), default SmolLM2's from `make models`.
inline const Tokenizer& tokenizer() {
  static const Tokenizer loaded = [] {
    const char* path = std::getenv("BIELIK_FUZZ_TOKENIZER");
    return Tokenizer::from_file(path && *path ? path
                                              : BIELIK_SOURCE_DIR "/models/smollm2-135m-instruct/tokenizer.json");
  }();
  return loaded;
}

/// Pushing `ids` one by one through a StreamDecoder, then flush(), must give `decoded`
/// (= decode(ids)), and no piece handed out on the way may end inside a character.
inline void check_stream_equals_decode(const std::vector<int32_t>& ids, const std::string& decoded) {
  StreamDecoder stream(tokenizer());
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    FUZZ_CHECK(utf8::find_invalid(piece) == std::string::npos, "the stream handed out half a character");
    streamed += piece;
  }
  streamed += stream.flush();
  FUZZ_CHECK(streamed == decoded, "streamed '" + streamed + "' != decoded '" + decoded + "'");
}

}  // namespace bielik::fuzz

// libFuzzer calls this once before the first input: loading a real tokenizer.json (1.7 MB
// for SmolLM2) under ASan can take longer than one input's -timeout, so it happens here.
// (Defined in this header because each tokenizer target is its own program.)
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)bielik::fuzz::tokenizer();
  return 0;
}
