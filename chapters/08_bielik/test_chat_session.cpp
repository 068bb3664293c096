// Chapter 08: the chat session on the tiny checkpoints (which come with a byte-level
// tokenizer and a ChatML template): the first turn against the numpy reference, and
// the multi-turn KV-cache reuse against a from-scratch run of the same tokens.
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "chat_session.hpp"
#include "model_cpu.hpp"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

const SamplerOptions kGreedy{0.0f, 0, 1.0f, 0};

// A tiny model with everything the chat needs, loaded from its golden folder.
struct TinyChat {
  std::string dir;
  CpuModel model;
  Tokenizer tokenizer;
  ChatTemplate chat_template;

  TinyChat(const std::string& name, int context)
      : dir(golden_path("08_bielik", name)),
        model(dir, CpuModelOptions{2, context}),
        tokenizer(Tokenizer::from_file(dir + "/tokenizer.json")),
        chat_template(ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json")) {}
};

// The greedy continuation of `prompt` computed from scratch on a fresh model.
std::vector<int32_t> greedy_from_scratch(const std::string& dir, const std::vector<int32_t>& prompt, size_t count) {
  CpuModel fresh(dir, CpuModelOptions{1, 0});
  std::vector<float> logits = fresh.prefill(prompt);
  std::vector<int32_t> out;
  while (out.size() < count) {
    out.push_back(argmax(logits.data(), int(logits.size())));
    if (out.size() < count) logits = fresh.decode(out.back());
  }
  return out;
}

std::vector<int32_t> tail(const std::vector<int32_t>& v, size_t count) {
  return std::vector<int32_t>(v.end() - long(count), v.end());
}

// What a refused turn must leave as it was: the conversation and the model's cache.
struct ConversationState {
  std::vector<int32_t> tokens;
  size_t messages;
  int position;

  ConversationState(const ChatSession& session, const CpuModel& model)
      : tokens(session.tokens()), messages(session.messages().size()), position(model.position()) {}

  void check_unchanged(const ChatSession& session, const CpuModel& model) const {
    CHECK(session.tokens() == tokens);
    CHECK(session.messages().size() == messages);
    CHECK(model.position() == position);
  }
};

}  // namespace

TEST_CASE("chat session: the first turn matches the numpy reference id for id", "[ch08][cpu][chat]") {
  std::vector<int32_t> prompt = load_npy(golden_path("08_bielik", "tiny_smollm_chat_prompt.npy")).to_int32();
  std::vector<int32_t> reply = load_npy(golden_path("08_bielik", "tiny_smollm_chat_reply.npy")).to_int32();
  TinyChat chat("tiny_smollm", 0);
  ChatSession session(chat.model, chat.tokenizer, chat.chat_template, kGreedy);
  std::string streamed;
  TurnStats stats = session.reply("Hi!", 12, [&](const std::string& piece) { streamed += piece; });

  std::vector<int32_t> expected = prompt;
  expected.insert(expected.end(), reply.begin(), reply.end());
  REQUIRE(session.tokens() == expected);
  CHECK(stats.prompt_tokens == int(prompt.size()));
  CHECK(stats.generated_tokens == int(reply.size()));
  CHECK(stats.stop == (reply.size() == 12 ? StopReason::kTokenLimit : StopReason::kEndOfTurn));
  CHECK(streamed == chat.tokenizer.decode(reply));
  REQUIRE(session.messages().size() == 2);
  CHECK(session.messages()[1].role == "assistant");
  CHECK(session.messages()[1].content == chat.tokenizer.decode(reply));
  // The stop ids: the template's <|im_end|> (id 2 here, which is also config's eos).
  CHECK(session.stop_ids() == std::vector<int32_t>{2});
}

TEST_CASE("chat session: later turns prefill only their new tokens, and equal a fresh run", "[ch08][cpu][chat]") {
  TinyChat chat("tiny_bielik", 0);
  ChatSession session(chat.model, chat.tokenizer, chat.chat_template, kGreedy, "Be brief.");
  auto ignore = [](const std::string&) {};

  // Turn 1 is cut by the token limit: its last token is not in the cache yet.
  TurnStats first = session.reply("Hej, jak sie masz?", 5, ignore);
  const int32_t bos = chat.tokenizer.token_to_id("<s>");
  REQUIRE(session.tokens().front() == bos);  // the template starts with {{ bos_token }}
  REQUIRE(first.stop == StopReason::kTokenLimit);
  REQUIRE(chat.model.position() == int(session.tokens().size()) - 1);
  const size_t after_first = session.tokens().size();

  // Turn 2: only the pending token + the new text are prefilled.
  TurnStats second = session.reply("A teraz?", 7, ignore);
  const std::string rendered = chat.chat_template.render(session.messages(), false);
  CHECK(second.prompt_tokens < int(after_first));
  CHECK_FALSE(second.full_reprefill);
  // The tokens are the whole conversation: "<s>" + the rendered messages, minus the end
  // of the last reply's turn, which the model writes or the next turn adds.
  CHECK(chat.tokenizer.decode(session.tokens()) + "<|im_end|>\n" == "<s>" + rendered);
  const size_t new_tokens = session.tokens().size() - after_first - size_t(second.generated_tokens);
  CHECK(second.prompt_tokens == int(new_tokens) + 1);  // + turn 1's pending token

  // The reply generated on the reused cache equals a fresh model's greedy reply to the
  // same tokens (if the cache were wrong, the continuation would differ).
  std::vector<int32_t> prompt2(session.tokens().begin(), session.tokens().end() - second.generated_tokens);
  CHECK(tail(session.tokens(), size_t(second.generated_tokens)) ==
        greedy_from_scratch(chat.dir, prompt2, size_t(second.generated_tokens)));

  // /reset: a new conversation gives the same first reply as before.
  session.reset();
  REQUIRE(chat.model.position() == 0);
  session.reply("Hej, jak sie masz?", 5, ignore);
  std::vector<int32_t> again = session.tokens();
  REQUIRE(again.size() == after_first);
}

TEST_CASE("chat session: a turn that does not fit leaves the conversation as it was", "[ch08][cpu][chat]") {
  TinyChat chat("tiny_bielik", 80);
  ChatSession session(chat.model, chat.tokenizer, chat.chat_template, kGreedy);
  auto ignore = [](const std::string&) {};
  session.reply("Hi", 4, ignore);
  const ConversationState before(session, chat.model);

  CHECK_THROWS_AS(session.reply(std::string(60, 'x'), 4, ignore), std::length_error);
  before.check_unchanged(session, chat.model);

  // The chat keeps working with something that fits...
  TurnStats ok = session.reply("ok", 2, ignore);
  CHECK(ok.generated_tokens >= 1);
  // ...until the context is full: generation stops there, the next turn is refused, and
  // reset() makes room again.
  TurnStats full = session.reply("more", 100, ignore);
  CHECK(full.stop == StopReason::kContextFull);
  CHECK(chat.model.position() == 80);
  CHECK_THROWS_AS(session.reply("again", 4, ignore), std::length_error);
  session.reset();
  CHECK(session.reply("again", 4, ignore).generated_tokens >= 1);
}

TEST_CASE("chat session: a message that is not UTF-8 is refused by its own offset, nothing changed",
          "[ch08][cpu][chat]") {
  TinyChat chat("tiny_bielik", 0);
  ChatSession session(chat.model, chat.tokenizer, chat.chat_template, kGreedy);
  auto ignore = [](const std::string&) {};
  session.reply("Hi", 4, ignore);
  const ConversationState before(session, chat.model);

  // A lone continuation byte at 3, a truncated two-byte "ł" (C5 82) at the end, an
  // overlong '/' at 0: the offset counts the user's bytes, not the template's around them.
  const struct {
    std::string text;
    size_t bad;
  } cases[] = {{std::string("abc\x80" "def"), 3}, {std::string("zaba \xc5"), 5}, {std::string("\xc0\xaf"), 0}};
  for (const auto& c : cases) {
    CHECK(error_of<std::invalid_argument>([&] { session.reply(c.text, 4, ignore); }) ==
          "the message is not valid UTF-8 at byte " + std::to_string(c.bad) + " of " + std::to_string(c.text.size()));
    before.check_unchanged(session, chat.model);
  }
  // The conversation goes on, and valid multi-byte text passes.
  CHECK(session.reply("\xc5\x82\xc3\xb3" "d\xc5\xba", 2, ignore).generated_tokens >= 1);
  CHECK(session.messages().size() == before.messages + 2);

  const std::string system = "be \xff" " brief";
  CHECK(error_of<std::invalid_argument>([&] {
          ChatSession bad_system(chat.model, chat.tokenizer, chat.chat_template, kGreedy, system);
        }) == "the system prompt is not valid UTF-8 at byte 3 of " + std::to_string(system.size()));
}

TEST_CASE("chat session: an interrupt stops the reply after the current token", "[ch08][cpu][chat]") {
  TinyChat chat("tiny_bielik", 0);
  ChatSession session(chat.model, chat.tokenizer, chat.chat_template, kGreedy);
  std::atomic<bool> interrupt{true};
  TurnStats stats = session.reply("Hej", 50, [](const std::string&) {}, &interrupt);
  CHECK(stats.stop == StopReason::kInterrupted);
  CHECK(stats.generated_tokens == 1);
  interrupt = false;
  // The interrupted reply's last token was pending; the next turn feeds it first.
  TurnStats next = session.reply("Dalej", 3, [](const std::string&) {}, &interrupt);
  CHECK(next.generated_tokens >= 1);
  CHECK(chat.model.position() == int(session.tokens().size()) - (next.stop == StopReason::kEndOfTurn ? 0 : 1));
}
