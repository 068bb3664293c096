// Fuzz target: arbitrary bytes as a tokenizer_config.json (chapter 08's chat_template.cpp).
//
// Contract (chat_template.hpp): ChatTemplate::from_tokenizer_config either recognises a
// ChatML template or throws std::runtime_error naming the file. A template that loaded
// renders a conversation as ChatML: every message framed by <|im_start|>role\n ...
// <|im_end|>\n in order, the generation prompt last.
#include <stdexcept>

#include "chat_template.hpp"
#include "fuzz_check.hpp"

using namespace bielik;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::write_scratch(data, size, "_tokenizer_config.json");
  try {
    const ChatTemplate chat = ChatTemplate::from_tokenizer_config(path);
    const std::vector<ChatMessage> messages = {{"user", "Hej!"}, {"assistant", "Cześć."}, {"user", "2+2?"}};
    const std::string text = chat.render(messages, /*add_generation_prompt=*/true);
    const std::string turns = "<|im_start|>user\nHej!<|im_end|>\n<|im_start|>assistant\nCześć.<|im_end|>\n"
                              "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";
    FUZZ_CHECK(text.size() >= turns.size() && text.compare(text.size() - turns.size(), turns.size(), turns) == 0,
               "the conversation is not rendered as ChatML: " + text);
    FUZZ_CHECK(text.size() == turns.size() || !chat.default_system_prompt().empty(),
               "text before the first turn without a default system prompt: " + text);
    FUZZ_CHECK(chat.stop_token() == "<|im_end|>", chat.stop_token());
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(fuzz::names_file(e.what(), path), std::string("the error does not name the file: ") + e.what());
  }
  return 0;
}
