// Chapter 08: the chat session on the tiny checkpoints (which come with a byte-level
// tokenizer and a ChatML template): the first turn against the numpy reference, and
// the multi-turn KV-cache reuse against a from-scratch run of the same tokens.
#include <atomic>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
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

// A backend that plays a script instead of running a model: each prefill or decode
// returns logits (V) whose argmax is the script's next id (every logit NaN for kNan),
// and the tokens it is fed stay in `fed` until reset(), as a KV cache holds them.
constexpr int32_t kNan = -1;

class ScriptedBackend : public Backend {
 public:
  ScriptedBackend(int vocab_size, std::vector<int> eos_ids) {
    config_.vocab_size = vocab_size;
    config_.eos_token_ids = std::move(eos_ids);
  }
  std::vector<float> prefill(const std::vector<int32_t>& tokens, Logits = Logits::kLast) override {
    if (tokens.empty()) throw std::invalid_argument("empty prompt");
    if (fed.size() + tokens.size() > size_t(context_size())) throw std::length_error("does not fit");
    for (int32_t token : tokens)
      if (token < 0 || token >= config_.vocab_size) throw std::out_of_range("token id " + std::to_string(token));
    fed.insert(fed.end(), tokens.begin(), tokens.end());
    if (script.empty()) throw std::logic_error("the test's script ran out");
    const int32_t next = script.front();
    script.erase(script.begin());
    std::vector<float> logits(size_t(config_.vocab_size), next == kNan ? NAN : 0.0f);
    if (next != kNan) logits[size_t(next)] = 1.0f;
    return logits;
  }
  std::vector<float> decode(int32_t token) override { return prefill({token}); }
  void reset() override { fed.clear(); }
  int position() const override { return int(fed.size()); }
  int context_size() const override { return 256; }
  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "scripted"; }

  std::vector<int32_t> script;  // ids the "model" predicts, consumed front first
  std::vector<int32_t> fed;     // the cache's tokens

 private:
  ModelConfig config_;
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

TEST_CASE("chat session: a tokenizer with ids past config.json's vocab_size is refused", "[ch08][cpu][chat]") {
  // tiny_bielik's tokenizer (ids 0..299) on tiny_smollm's model (vocab_size 259): its ids
  // 259..299 would index past the embedding table.
  TinyChat smollm("tiny_smollm", 0);
  const std::string bielik_dir = golden_path("08_bielik", "tiny_bielik");
  const Tokenizer bielik_tokenizer = Tokenizer::from_file(bielik_dir + "/tokenizer.json");
  REQUIRE(bielik_tokenizer.vocab_size() == 300);
  const std::string message = error_of<std::runtime_error>(
      [&] { ChatSession session(smollm.model, bielik_tokenizer, smollm.chat_template, kGreedy); });
  INFO(message);
  CHECK(contains(message, bielik_dir + "/tokenizer.json"));
  CHECK(contains(message, "largest token id is 299"));
  CHECK(contains(message, "config.json's vocab_size is 259"));

  // The other way round is a padded vocabulary: the model has rows no token uses. Fine.
  TinyChat bielik("tiny_bielik", 0);
  ChatSession padded(bielik.model, smollm.tokenizer, smollm.chat_template, kGreedy);
  CHECK(padded.stop_ids() == std::vector<int32_t>{2});
}

TEST_CASE("chat session: a reply that fails midway leaves the conversation as before, the cache rebuilt",
          "[ch08][cpu][chat]") {
  const std::string dir = golden_path("08_bielik", "tiny_bielik");
  const Tokenizer tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
  const ChatTemplate chat_template = ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json");
  // A padded vocabulary: ids 300..303 are rows of the model that no token has.
  ScriptedBackend backend(tokenizer.vocab_size() + 4, {});
  const int32_t padding_id = tokenizer.vocab_size() + 1, stop = tokenizer.token_to_id("<|im_end|>");
  const std::vector<int32_t> words = tokenizer.encode("Ala ma kota");
  REQUIRE(words.size() >= 3);
  REQUIRE(stop >= 0);
  ChatSession session(backend, tokenizer, chat_template, kGreedy);
  REQUIRE(session.stop_ids() == std::vector<int32_t>{stop});
  std::string streamed;
  auto collect = [&](const std::string& piece) { streamed += piece; };

  backend.script = {words[0], words[1], stop};
  TurnStats first = session.reply("Hej", 10, collect);
  REQUIRE(first.stop == StopReason::kEndOfTurn);
  REQUIRE(session.messages().back().content == tokenizer.decode({words[0], words[1]}));

  // Each way a reply can fail after its prefill: the model picks a padding id (no text
  // to show), or a NaN logit (a broken forward pass; the sampler refuses it).
  struct Failure {
    const char* what;
    int32_t bad;
    const char* expected;
  } failures[] = {{"padding id", padding_id, "has no token for"}, {"NaN logits", kNan, "is NaN"}};
  for (const Failure& failure : failures) {
    INFO(failure.what);
    const std::vector<int32_t> tokens = session.tokens();
    const std::vector<ChatMessage> messages = session.messages();
    backend.script = {words[2], failure.bad};
    streamed.clear();
    const std::string message = error_of([&] { session.reply("Dalej", 10, collect); });
    INFO(message);
    CHECK(contains(message, failure.expected));
    if (failure.bad == padding_id) {
      CHECK(contains(message, "token id " + std::to_string(padding_id)));
      CHECK(contains(message, dir + "/tokenizer.json"));
    }
    CHECK(streamed == tokenizer.decode({words[2]}));  // what was shown before the failure
    // The conversation is as before the call; the cache, which cannot drop its newest
    // tokens, is empty.
    CHECK(session.tokens() == tokens);
    REQUIRE(session.messages().size() == messages.size());
    CHECK(session.messages().back().content == messages.back().content);
    CHECK(backend.position() == 0);

    // The next turn feeds the whole conversation again, then goes on as usual.
    backend.script = {words[1], stop};
    TurnStats next = session.reply("Dalej", 10, collect);
    CHECK(next.stop == StopReason::kEndOfTurn);
    CHECK(std::vector<int32_t>(session.tokens().begin(), session.tokens().begin() + long(tokens.size())) == tokens);
    CHECK(backend.fed == session.tokens());  // the cache holds every token, from position 0
    CHECK(next.prompt_tokens == int(session.tokens().size()) - 1);  // all but the reply's one token
    CHECK(session.messages().size() == messages.size() + 2);
    CHECK(tokenizer.decode(session.tokens()) + "<|im_end|>\n" ==
          "<s>" + chat_template.render(session.messages(), false));
  }

  // A failure in the first turn leaves an empty conversation.
  session.reset();
  backend.script = {kNan};
  CHECK_THROWS_AS(session.reply("Hej", 10, collect), std::invalid_argument);
  CHECK(session.tokens().empty());
  CHECK(session.messages().empty());
  CHECK(backend.position() == 0);
  backend.script = {words[0], stop};
  CHECK(session.reply("Hej", 10, collect).stop == StopReason::kEndOfTurn);
  CHECK(backend.fed == session.tokens());
}

TEST_CASE("chat session: no token that can end a reply is a load error naming tokenizer.json", "[ch08][cpu][chat]") {
  // tiny_bielik's tokenizer without <|im_end|> (as an added token and in the vocabulary).
  const std::string dir = golden_path("08_bielik", "tiny_bielik");
  nlohmann::json json;
  std::ifstream(dir + "/tokenizer.json") >> json;
  json["model"]["vocab"].erase("<|im_end|>");
  nlohmann::json added = nlohmann::json::array();
  for (const auto& token : json["added_tokens"])
    if (token["content"] != "<|im_end|>") added.push_back(token);
  json["added_tokens"] = added;
  TempDir temp;
  const std::string path = temp.write("tokenizer.json", json.dump());
  const Tokenizer tokenizer = Tokenizer::from_file(path);
  REQUIRE(tokenizer.token_to_id("<|im_end|>") == -1);
  const ChatTemplate chat_template = ChatTemplate::from_tokenizer_config(dir + "/tokenizer_config.json");

  // Without an eos id in config.json, every reply would run to the token limit.
  ScriptedBackend no_eos(tokenizer.vocab_size(), {});
  const std::string message =
      error_of<std::runtime_error>([&] { ChatSession session(no_eos, tokenizer, chat_template, kGreedy); });
  INFO(message);
  CHECK(contains(message, path));
  CHECK(contains(message, "'<|im_end|>'"));
  CHECK(contains(message, "eos_token_id"));

  // With one, replies end there.
  ScriptedBackend with_eos(tokenizer.vocab_size(), {2});
  ChatSession session(with_eos, tokenizer, chat_template, kGreedy);
  CHECK(session.stop_ids() == std::vector<int32_t>{2});
  with_eos.script = {tokenizer.encode("Ala")[0], 2};
  CHECK(session.reply("Hej", 10, [](const std::string&) {}).stop == StopReason::kEndOfTurn);
}
