#include "chat_session.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "utf8.hpp"

namespace bielik {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

const char* to_string(StopReason reason) {
  switch (reason) {
    case StopReason::kEndOfTurn: return "end of turn";
    case StopReason::kTokenLimit: return "token limit";
    case StopReason::kInterrupted: return "interrupted";
    case StopReason::kContextFull: return "context full";
  }
  return "?";
}

ChatSession::ChatSession(Backend& backend, const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                         const SamplerOptions& sampling, const std::string& system_prompt)
    : backend_(backend), tokenizer_(tokenizer), template_(chat_template), sampler_(sampling),
      system_prompt_(system_prompt) {
  if (std::string bad = utf8::invalid_description("the system prompt", system_prompt_); !bad.empty()) {
    throw std::invalid_argument(bad);
  }
  // The tokenizer's ids index the model's embedding rows: a tokenizer with more tokens
  // than the model has rows belongs to another model. Fewer is normal (a vocabulary
  // padded to a round size); the padding ids have no text (see reply()).
  const int vocab_size = backend_.config().vocab_size;
  if (tokenizer_.vocab_size() > vocab_size) {
    throw std::runtime_error(tokenizer_.path() + ": its largest token id is " +
                             std::to_string(tokenizer_.vocab_size() - 1) + ", but config.json's vocab_size is " +
                             std::to_string(vocab_size) + ": the tokenizer does not belong to this model");
  }
  // A reply ends at the template's <|im_end|> or at config.json's eos ids. A tokenizer
  // without <|im_end|> can still end turns with an eos id (the model then writes the
  // marker as plain text first); with neither, every reply would run to the token limit.
  const int32_t stop = tokenizer_.token_to_id(template_.stop_token());
  if (stop >= 0) stop_ids_.push_back(stop);
  for (int eos : backend_.config().eos_token_ids) {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), eos) == stop_ids_.end()) stop_ids_.push_back(eos);
  }
  if (stop_ids_.empty()) {
    throw std::runtime_error(tokenizer_.path() + " has no token '" + template_.stop_token() +
                             "' (the chat template's end of turn) and config.json has no eos_token_id: "
                             "no token could end a reply");
  }
  if (template_.add_bos()) {
    bos_id_ = tokenizer_.token_to_id(template_.bos_token());
    if (bos_id_ < 0) bos_id_ = backend_.config().bos_token_id;
    if (bos_id_ < 0) {
      throw std::runtime_error("the chat template starts with BOS ('" + template_.bos_token() +
                               "') but neither tokenizer.json nor config.json gives its id");
    }
  }
  reset();
}

void ChatSession::reset() {
  backend_.reset();
  messages_.clear();
  if (!system_prompt_.empty()) messages_.push_back({"system", system_prompt_});
  rendered_.clear();
  tokens_.clear();
}

bool ChatSession::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

TurnStats ChatSession::reply(const std::string& user_text, int max_new_tokens,
                             const std::function<void(const std::string&)>& on_text,
                             const std::atomic<bool>* interrupt) {
  if (max_new_tokens < 1) throw std::invalid_argument("max_new_tokens must be at least 1");
  // Checked here, not only by the tokenizer: its offset would count the template's text
  // around the message, which the user never typed.
  if (std::string bad = utf8::invalid_description("the message", user_text); !bad.empty()) {
    throw std::invalid_argument(bad);
  }
  const Clock::time_point start = Clock::now();
  TurnStats stats;

  // 1. The conversation with the new message, rendered in full; only the text after
  //    what the cache holds gets tokenized. A template that rewrites earlier text (none
  //    of ChatML's do) would break that; then the cache is rebuilt from scratch.
  std::vector<ChatMessage> next = messages_;
  next.push_back({"user", user_text});
  const std::string full = template_.render(next, /*add_generation_prompt=*/true);
  const bool extends = full.compare(0, rendered_.size(), rendered_) == 0;
  const size_t cached = size_t(backend_.position());
  std::vector<int32_t> fresh;  // tokens that enter tokens_ with this turn
  std::vector<int32_t> feed;   // tokens prefilled now: the pending one (if any) + fresh
  if (extends && !tokens_.empty()) {
    fresh = tokenizer_.encode(full.substr(rendered_.size()));
    feed.assign(tokens_.begin() + long(cached), tokens_.end());
  } else {
    if (bos_id_ >= 0) fresh.push_back(bos_id_);
    std::vector<int32_t> text = tokenizer_.encode(full);
    fresh.insert(fresh.end(), text.begin(), text.end());
    stats.full_reprefill = !tokens_.empty();
  }
  feed.insert(feed.end(), fresh.begin(), fresh.end());

  // 2. Prefill. The backend checks the fit before touching its cache; a rebuild checks
  //    it here, before reset() throws the old cache away.
  const std::vector<int32_t> tokens_before = tokens_;
  if (stats.full_reprefill) {
    if (feed.size() > size_t(backend_.context_size())) {
      throw std::length_error("prompt of " + std::to_string(feed.size()) + " tokens exceeds the context of " +
                              std::to_string(backend_.context_size()) + " tokens");
    }
    backend_.reset();
    tokens_.clear();
  }
  std::vector<float> logits = backend_.prefill(feed);
  const size_t messages_before = messages_.size();
  const std::string rendered_before = rendered_;
  messages_ = std::move(next);
  rendered_ = full;
  tokens_.insert(tokens_.end(), fresh.begin(), fresh.end());
  stats.prompt_tokens = int(feed.size());

  try {
    // 3. Generate: sample, stream, feed the token back, until a stop.
    StreamDecoder stream(tokenizer_);
    std::vector<int32_t> reply_ids;
    int32_t id = sampler_.sample(logits);  // the first token, from the prompt's logits
    for (;;) {
      if (reply_ids.empty()) stats.ttft_seconds = seconds_since(start);
      if (is_stop(id)) {
        stats.stop = StopReason::kEndOfTurn;
        break;
      }
      reply_ids.push_back(id);
      tokens_.push_back(id);  // pending until decoded below (or by the next turn's prefill)
      std::string piece;
      try {
        piece = stream.push(id);
      } catch (const std::out_of_range&) {  // a padding id of a padded vocabulary: no text to show
        throw std::runtime_error("the model chose token id " + std::to_string(id) + ", which " + tokenizer_.path() +
                                 " has no token for (config.json's vocab_size is " +
                                 std::to_string(backend_.config().vocab_size) + ", the tokenizer's " +
                                 std::to_string(tokenizer_.vocab_size()) + ")");
      }
      if (!piece.empty()) on_text(piece);
      if (int(reply_ids.size()) >= max_new_tokens) {
        stats.stop = StopReason::kTokenLimit;
        break;
      }
      if (interrupt != nullptr && interrupt->load()) {
        stats.stop = StopReason::kInterrupted;
        break;
      }
      if (backend_.position() >= backend_.context_size()) {
        stats.stop = StopReason::kContextFull;
        break;
      }
      const Clock::time_point step = Clock::now();
      id = backend_.decode_sample(id, sampler_);  // the step and the next draw (on the GPU with CUDA)
      stats.decode_seconds += seconds_since(step);
      ++stats.decode_steps;
    }
    const std::string tail = stream.flush();
    if (!tail.empty()) on_text(tail);

    // 4. The reply joins the conversation as exactly the text of its tokens, so the next
    //    turn's rendering starts with rendered_ again.
    const std::string reply_text = tokenizer_.decode(reply_ids);
    messages_.push_back({"assistant", reply_text});
    rendered_ += reply_text;
    stats.generated_tokens = int(reply_ids.size());
  } catch (...) {
    // The turn failed after its prefill (a NaN logit, a token with no text, a backend
    // error): the conversation goes back to before the call. The cache cannot drop its
    // newest tokens, so it is emptied; the next turn then finds position() == 0 and
    // prefills tokens_ from the start.
    messages_.resize(messages_before);
    rendered_ = rendered_before;
    tokens_ = tokens_before;
    backend_.reset();
    throw;
  }
  return stats;
}

}  // namespace bielik
