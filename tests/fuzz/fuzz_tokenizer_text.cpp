// Fuzz target: arbitrary bytes as text for Tokenizer::encode, and the ids back through
// decode and the streaming decoder (chapter 08's tokenizer.cpp, tokenizer_bpe.cpp,
// pretokenizer.cpp, utf8.cpp).
//
// The tokenizer is BIELIK_FUZZ_TOKENIZER (a tokenizer.json; default: SmolLM2's, from
// `make models`). Contract (tokenizer.hpp):
//   - invalid UTF-8 is refused with std::invalid_argument, valid text never is;
//   - every id is inside the vocabulary;
//   - pushing the ids one by one through StreamDecoder, then flush(), gives decode(ids),
//     and what it hands out along the way is valid UTF-8 (never half a character);
//   - with BIELIK_FUZZ_ROUND_TRIP=1 (byte-level BPE, as GPT-2 and SmolLM2: nothing is
//     normalized away), decode(encode(text)) == text whenever the vocabulary can spell
//     the text (below).
#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "fuzz_tokenizer.hpp"

using namespace bielik;
using fuzz::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool round_trip = [] {
    const char* value = std::getenv("BIELIK_FUZZ_ROUND_TRIP");
    return value != nullptr && std::string(value) == "1";
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const bool valid = utf8::find_invalid(text) == std::string::npos;
  std::vector<int32_t> ids;
  try {
    ids = tokenizer().encode(text);
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(!valid, std::string("valid UTF-8 refused: ") + e.what());
    return 0;
  }
  FUZZ_CHECK(valid, "invalid UTF-8 accepted");
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tokenizer().vocab_size(), "id " + std::to_string(id));

  const std::string decoded = tokenizer().decode(ids);
  FUZZ_CHECK(utf8::find_invalid(decoded) == std::string::npos, "decode gave invalid UTF-8");
  // A vocabulary may lack a byte's token (SmolLM2's has none for most control bytes):
  // HF tokenizers then emits id 0, a special token, and so do we; the text cannot come
  // back. Round trips are checked where each special token occurs in the ids as often
  // as its text occurs in the input, i.e. where none stands for an unspellable byte.
  bool spellable = true;
  for (int32_t id : ids) {
    if (!tokenizer().is_special(id)) continue;
    const std::string& content = tokenizer().token_string(id);
    size_t in_text = 0;
    for (size_t at = text.find(content); at != std::string::npos; at = text.find(content, at + content.size()))
      ++in_text;
    if (size_t(std::count(ids.begin(), ids.end(), id)) != in_text) spellable = false;
  }
  if (round_trip && spellable) FUZZ_CHECK(decoded == text, "decode(encode(text)) != text: '" + decoded + "'");

  fuzz::check_stream_equals_decode(ids, decoded);
  return 0;
}
