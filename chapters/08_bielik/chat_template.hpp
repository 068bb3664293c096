/// @file chat_template.hpp
/// @brief The ChatML prompt format, recognised in tokenizer_config.json.
///
/// A chat model was trained on conversations written one way; the prompt must be
/// written the same way. tokenizer_config.json carries that format as a Jinja template
/// ("chat_template"). We do not run Jinja: we recognise ChatML, the format of both
/// Bielik and SmolLM2,
///
///     <|im_start|>system\nYou are ...<|im_end|>\n
///     <|im_start|>user\nHej!<|im_end|>\n
///     <|im_start|>assistant\n            <- generation prompt; the model writes from here
///
/// and refuse any other template with a clear error. The model ends its turn with
/// <|im_end|> (stop_token()).
#pragma once

#include <string>
#include <vector>

namespace bielik {

struct ChatMessage {
  std::string role;     ///< "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  /// Reads tokenizer_config.json. Accepts a ChatML template (contains <|im_start|> and
  /// <|im_end|>); anything else throws std::runtime_error naming the file:
  /// "unsupported chat template: only ChatML is implemented". Also reads bos_token,
  /// eos_token, add_bos_token, and a default system prompt the template inserts when
  /// the conversation has none (SmolLM2's "You are a helpful AI assistant named SmolLM...").
  static ChatTemplate from_tokenizer_config(const std::string& path);

  /// The prompt text: [the default system message if there is one and the first
  /// message is not "system"],
  /// then "<|im_start|>role\ncontent<|im_end|>\n" per message, then
  /// "<|im_start|>assistant\n" when add_generation_prompt. BOS is not part of the text:
  /// see add_bos().
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  /// Whether the prompt's ids must start with bos_token's id: true when the template
  /// renders {{ bos_token }}, which is what HF's apply_chat_template produces. (The
  /// config's add_bos_token concerns plain tokenizer(text) calls, not chat prompts;
  /// it is available as add_bos_token().)
  bool add_bos() const { return add_bos_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool add_bos_token() const { return add_bos_token_; }
  /// The end-of-turn marker the generation stops at: "<|im_end|>".
  const std::string& stop_token() const { return stop_token_; }
  /// "" when the template inserts no default system message.
  const std::string& default_system_prompt() const { return default_system_; }

 private:
  bool add_bos_ = false;
  bool add_bos_token_ = false;
  std::string bos_token_, eos_token_;
  std::string stop_token_ = "<|im_end|>";
  std::string default_system_;
};

}  // namespace bielik
