/// @file chat_session.hpp
/// @brief A conversation on top of a Backend: template, tokens, KV cache reuse, stopping.
///
/// Each turn the whole conversation is rendered with the chat template, but only the
/// text after what the KV cache already holds is tokenized and prefilled:
///
///     cache:  <s><|im_start|>user\nHej<|im_end|>\n<|im_start|>assistant\nCześć!
///     turn 2:                                                                 <|im_end|>\n<|im_start|>user\n...
///
/// The reply's own tokens are already in the cache (each was decoded as it was
/// generated), so a new turn costs the prefill of its new tokens, not of the history.
/// The end-of-turn token the model sampled is not fed back: the template writes it
/// again at the start of the next turn's text. If generation stopped for another
/// reason (token limit, Ctrl-C, full context), the last sampled token is not in the
/// cache yet; it goes first into the next turn's prefill.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend.hpp"
#include "chat_template.hpp"
#include "sampler.hpp"
#include "tokenizer.hpp"

namespace bielik {

/// Why a reply ended.
enum class StopReason {
  kEndOfTurn,    ///< the model sampled the template's stop token or an eos id
  kTokenLimit,   ///< max_new_tokens reached
  kInterrupted,  ///< the interrupt flag was raised (Ctrl-C)
  kContextFull,  ///< the KV cache is full
};
const char* to_string(StopReason reason);

struct TurnStats {
  int prompt_tokens = 0;       ///< tokens prefilled for this turn (the new ones only)
  int generated_tokens = 0;    ///< tokens of the reply (the stop token not counted)
  double ttft_seconds = 0;     ///< turn start -> first reply token sampled (tokenize + prefill + sample)
  double decode_seconds = 0;   ///< time in the decode steps after the first token
  int decode_steps = 0;        ///< how many decode steps that was
  bool full_reprefill = false; ///< the template did not extend the cached text: cache rebuilt
  StopReason stop = StopReason::kEndOfTurn;
  /// Decode speed: decode_steps / decode_seconds (0 without decode steps).
  double tokens_per_second() const { return decode_seconds > 0 ? decode_steps / decode_seconds : 0.0; }
};

class ChatSession {
 public:
  /// All references must outlive the session. `system_prompt` empty: none of our own
  /// (the template may still insert its default one, as SmolLM2's does); one that is not
  /// valid UTF-8 is refused (std::invalid_argument naming the byte). Throws
  /// std::runtime_error naming tokenizer.json when its ids go past config.json's
  /// vocab_size (another model's tokenizer; a model vocabulary larger than the
  /// tokenizer's is fine), or when no token can end a reply (neither the template's
  /// <|im_end|> nor an eos id from config.json).
  ChatSession(Backend& backend, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
              const SamplerOptions& sampling, const std::string& system_prompt = "");

  /// One turn: adds the user message, prefills the new tokens, samples up to
  /// max_new_tokens, calling on_text with each piece of text as soon as it is complete
  /// UTF-8. Stops early when `interrupt` (may be null) becomes true. Throws
  /// std::length_error when the new turn does not fit in the context, and
  /// std::invalid_argument naming the byte when `user_text` is not valid UTF-8; the
  /// conversation and the cache are then exactly as before the call. An error while
  /// the reply is generated (a NaN logit: std::invalid_argument from the sampler; a
  /// token the tokenizer has no text for, as a padded vocabulary's padding ids:
  /// std::runtime_error) is rethrown with the conversation as before the call and the
  /// cache emptied: the next turn prefills the whole conversation again.
  TurnStats reply(const std::string& user_text, int max_new_tokens,
                  const std::function<void(const std::string&)>& on_text,
                  const std::atomic<bool>* interrupt = nullptr);

  /// Forgets the conversation (keeps the system prompt) and empties the cache.
  void reset();

  const std::vector<ChatMessage>& messages() const { return messages_; }
  /// Every token of the conversation so far, in order: the cache's content, plus the
  /// pending last reply token if generation stopped without an end-of-turn token.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  /// The ids that end a reply: the template's stop token and config.json's eos ids.
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  Backend& backend() { return backend_; }

 private:
  bool is_stop(int32_t id) const;

  Backend& backend_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& template_;
  Sampler sampler_;
  std::string system_prompt_;
  std::vector<ChatMessage> messages_;
  std::string rendered_;          // the text whose tokens are tokens_ (BOS not included)
  std::vector<int32_t> tokens_;   // see tokens()
  std::vector<int32_t> stop_ids_;
  int32_t bos_id_ = -1;           // prepended to a fresh conversation when the template wants BOS
};

}  // namespace bielik
