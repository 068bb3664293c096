// Fuzz target: arbitrary bytes as a tokenizer.json (chapter 08's tokenizer.cpp,
// tokenizer_bpe.cpp, pretokenizer.cpp). Seeds: the small tokenizers in
// tests/fuzz/corpus/tokenizer_json/, so that mutations stay close to real files.
//
// Contract (tokenizer.hpp): Tokenizer::from_file either loads, or throws
// std::runtime_error naming the file (bad JSON, missing model, unsupported types, ids
// or merges that name nothing). A tokenizer that loaded must then encode a few texts
// without failing and give ids inside its vocabulary, and decode them back.
#include <stdexcept>

#include "fuzz_check.hpp"
#include "tokenizer.hpp"

using namespace bielik;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::write_scratch(data, size, "_tokenizer.json");
  try {
    const Tokenizer tok = Tokenizer::from_file(path);
    for (const char* text : {"Hej! Jak się masz?", " 12345 <|im_start|>user\nok<|im_end|>", "", "\xF0\x9F\x90\xA6"}) {
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "id " + std::to_string(id));
      (void)tok.decode(ids);
    }
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(fuzz::names_file(e.what(), path), std::string("the error does not name the file: ") + e.what());
  }
  return 0;
}
