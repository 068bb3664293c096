// Fuzz target: arbitrary token ids (any model output, a bad id included) through decode
// and the streaming decoder a chat prints with (chapter 08's tokenizer.cpp).
//
// The input is read as little-endian int32 ids; the tokenizer is BIELIK_FUZZ_TOKENIZER
// (default: SmolLM2's). Contract (tokenizer.hpp): an id outside [0, vocab_size()) is
// refused with std::out_of_range by decode and by StreamDecoder::push; for valid ids,
// pushing them one by one and flushing gives decode(ids), every piece and the whole are
// valid UTF-8 (bytes that never complete a character become U+FFFD), and
// decode(ids, skip_special) leaves out exactly the special tokens.
#include <cstring>
#include <stdexcept>

#include "fuzz_tokenizer.hpp"

using namespace bielik;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = fuzz::tokenizer();
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  // Random 32-bit ids are nearly all outside the vocabulary. So each id is folded into
  // [0, vocab_size) to exercise the decoders themselves, unless the input's first byte
  // is odd: then the raw ids go in, to exercise the refusals.
  const bool raw = size > 0 && (data[0] & 1);
  bool in_range = true;
  for (int32_t& id : ids) {
    if (!raw) id = int32_t(uint32_t(id) % uint32_t(tok.vocab_size()));
    in_range = in_range && id >= 0 && id < tok.vocab_size();
  }

  std::string decoded;
  try {
    decoded = tok.decode(ids);
    FUZZ_CHECK(in_range, "decode accepted an id outside the vocabulary");
  } catch (const std::out_of_range& e) {
    FUZZ_CHECK(!in_range, std::string("decode refused ids inside the vocabulary: ") + e.what());
    return 0;
  }
  FUZZ_CHECK(utf8::find_invalid(decoded) == std::string::npos, "decode gave invalid UTF-8");

  fuzz::check_stream_equals_decode(ids, decoded);

  std::vector<int32_t> plain;
  for (int32_t id : ids)
    if (!tok.is_special(id)) plain.push_back(id);
  FUZZ_CHECK(tok.decode(ids, /*skip_special=*/true) == tok.decode(plain, /*skip_special=*/false),
             "skip_special did not leave out exactly the special tokens");
  return 0;
}
