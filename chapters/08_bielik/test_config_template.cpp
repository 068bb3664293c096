// Chapter 08, CPU: config.json -> ModelConfig (defaults, validation, error messages) and
// tokenizer_config.json -> ChatTemplate (ChatML recognised, everything else refused).
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "catch_compat.hpp"
#include "test_support.hpp"
#include "chat_template.hpp"
#include "model_config.hpp"

using namespace bielik;
using nlohmann::json;

namespace {

// Bielik-1.5B-v3's shape as in the project's reconstructed config (shared/models/).
json bielik_like() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 1536},
          {"intermediate_size", 8960}, {"num_hidden_layers", 32}, {"num_attention_heads", 12},
          {"num_key_value_heads", 2}, {"head_dim", 128}, {"vocab_size", 32000},
          {"max_position_embeddings", 8192}, {"rope_theta", 1000000.0}, {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", false}, {"attention_bias", true}, {"mlp_bias", true},
          {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"}, {"bos_token_id", 1}, {"eos_token_id", 2},
          {"rope_scaling", nullptr}};
}

}  // namespace

TEST_CASE("model config: Bielik-shaped config.json reads every field", "[ch08][cpu]") {
  TempDir dir;
  ModelConfig c = load_model_config(dir.write("config.json", bielik_like().dump()));
  REQUIRE(c.hidden_size == 1536);
  REQUIRE(c.intermediate_size == 8960);
  REQUIRE(c.num_hidden_layers == 32);
  REQUIRE(c.num_attention_heads == 12);
  REQUIRE(c.num_key_value_heads == 2);
  REQUIRE(c.head_dim == 128);
  REQUIRE(c.vocab_size == 32000);
  REQUIRE(c.max_position_embeddings == 8192);
  REQUIRE(c.rope_theta == 1e6f);
  REQUIRE(c.rms_norm_eps == 1e-6f);
  REQUIRE(c.attention_bias);
  REQUIRE(c.mlp_bias);
  REQUIRE_FALSE(c.tie_word_embeddings);
  REQUIRE(c.bos_token_id == 1);
  REQUIRE(c.eos_token_ids == std::vector<int>{2});
  REQUIRE(c.torch_dtype == "bfloat16");
  REQUIRE(contains(describe(c), "H=12 Hkv=2 D=128"));
}

TEST_CASE("model config: defaults for optional keys", "[ch08][cpu]") {
  TempDir dir;
  json j = {{"hidden_size", 576}, {"intermediate_size", 1536}, {"num_hidden_layers", 30},
            {"num_attention_heads", 9}, {"vocab_size", 49152}, {"eos_token_id", {2, 0}}};
  ModelConfig c = load_model_config(dir.write("config.json", j.dump()));
  REQUIRE(c.head_dim == 64);                 // hidden / heads
  REQUIRE(c.num_key_value_heads == 9);       // no GQA unless stated
  REQUIRE(c.max_position_embeddings == 2048);
  REQUIRE(c.rope_theta == 10000.0f);
  REQUIRE_FALSE(c.attention_bias);
  REQUIRE_FALSE(c.mlp_bias);
  REQUIRE_FALSE(c.tie_word_embeddings);
  REQUIRE(c.bos_token_id == -1);
  REQUIRE(c.eos_token_ids == std::vector<int>{2, 0});
  REQUIRE(c.torch_dtype.empty());
}

TEST_CASE("model config: invalid configs fail naming the file and the key", "[ch08][cpu]") {
  TempDir dir;
  struct Case {
    const char* key;
    json value;  // null here removes the key
    const char* expected;
  };
  std::vector<Case> cases = {
      {"hidden_size", nullptr, "missing required key 'hidden_size'"},
      {"vocab_size", "32000", "key 'vocab_size' must be an integer"},
      {"num_hidden_layers", 0, "key 'num_hidden_layers' must be positive"},
      {"intermediate_size", -5, "key 'intermediate_size' must be positive"},
      {"num_key_value_heads", 5, "must be a multiple of num_key_value_heads (5)"},
      {"head_dim", 127, "key 'head_dim' must be even"},
      {"rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}, "key 'rope_scaling'"},
      {"rope_theta", "big", "key 'rope_theta' must be a number"},
      {"attention_bias", 1, "key 'attention_bias' must be true or false"},
      {"model_type", "qwen2", "model_type 'qwen2' is not supported"},
      {"hidden_act", "gelu", "hidden_act 'gelu'"},
      {"eos_token_id", 32000, "key 'eos_token_id' holds 32000"},
      {"hidden_size", 1.5e3, "key 'hidden_size' must be an integer"},
      // Values JSON allows and our types cannot hold, read before as inf or as -1 (found
      // while fixing what `make fuzz` found; tests/fuzz/fuzz_model_config.cpp checks them).
      {"rope_theta", 1e39, "key 'rope_theta' does not fit a float"},
      {"rope_theta", 0, "key 'rope_theta' must be positive, got 0"},
      {"rope_theta", -10000.0, "key 'rope_theta' must be positive, got -10000"},
      {"rms_norm_eps", -1e-6, "key 'rms_norm_eps' must be positive, got -1e-06"},
      {"rms_norm_eps", 0, "key 'rms_norm_eps' must be positive, got 0"},
      {"eos_token_id", json(18446744073709551615ULL), "key 'eos_token_id' is out of range"},
      {"bos_token_id", json(9223372036854775808ULL), "key 'bos_token_id' is out of range"},
  };
  for (const Case& c : cases) {
    json j = bielik_like();
    if (c.value.is_null())
      j.erase(c.key);
    else
      j[c.key] = c.value;
    std::string path = dir.write("config.json", j.dump());
    std::string message = error_of([&] { load_model_config(path); });
    INFO("key " << c.key << " = " << c.value.dump() << "\nmessage: " << message);
    CHECK(contains(message, path));
    CHECK(contains(message, c.expected));
  }

  json no_head_dim = bielik_like();
  no_head_dim.erase("head_dim");
  no_head_dim["hidden_size"] = 1540;  // not divisible by 12 heads
  std::string path = dir.write("config.json", no_head_dim.dump());
  REQUIRE(contains(error_of([&] { load_model_config(path); }), "not divisible by num_attention_heads"));

  REQUIRE(contains(error_of([&] { load_model_config(dir.write("config.json", "{\"hidden_size\": ")); }), "malformed JSON"));
  // A number past double's range is nlohmann's out_of_range, not a parse_error: it used
  // to escape as that type, without the file's name (found by `make fuzz`).
  path = dir.write("config.json", "{\"hidden_size\": 4e335}");
  const std::string message = error_of([&] { load_model_config(path); });
  CHECK(contains(message, path));
  CHECK(contains(message, "malformed JSON"));
  REQUIRE(contains(error_of([&] { load_model_config(dir.path + "/absent.json"); }), "absent.json"));
}

// --- chat template ---------------------------------------------------------------------

namespace {

// SmolLM2-135M-Instruct's template (ChatML with a default system turn), as the model
// card's tokenizer_config.json writes it.
const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// A ChatML template that starts with BOS (the form Bielik's instruct models use).
const char* kBosTemplate =
    "{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace

TEST_CASE("chat template: ChatML prompts, default system turn, BOS", "[ch08][cpu]") {
  TempDir dir;
  std::vector<ChatMessage> chat = {{"user", "Hej!"}, {"assistant", "Cześć, w czym pomóc?"}, {"user", "Opowiedz żart."}};

  json smol = {{"chat_template", kSmolTemplate}, {"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}};
  ChatTemplate smol_chat = ChatTemplate::from_tokenizer_config(dir.write("tokenizer_config.json", smol.dump()));
  REQUIRE(smol_chat.default_system_prompt() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  REQUIRE(smol_chat.stop_token() == "<|im_end|>");
  REQUIRE_FALSE(smol_chat.add_bos());  // the template never writes bos_token
  REQUIRE(smol_chat.render(chat, true) ==
          "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nHej!<|im_end|>\n"
          "<|im_start|>assistant\nCześć, w czym pomóc?<|im_end|>\n"
          "<|im_start|>user\nOpowiedz żart.<|im_end|>\n"
          "<|im_start|>assistant\n");
  // A system message of the caller's replaces the default; no generation prompt.
  REQUIRE(smol_chat.render({{"system", "Mów po polsku."}, {"user", "Hej"}}, false) ==
          "<|im_start|>system\nMów po polsku.<|im_end|>\n<|im_start|>user\nHej<|im_end|>\n");

  json bielik = {{"chat_template", kBosTemplate}, {"add_bos_token", true},
                 {"bos_token", {{"content", "<s>"}, {"special", true}}}, {"eos_token", "</s>"}};
  ChatTemplate bielik_chat = ChatTemplate::from_tokenizer_config(dir.write("tokenizer_config.json", bielik.dump()));
  REQUIRE(bielik_chat.add_bos());
  REQUIRE(bielik_chat.add_bos_token());
  REQUIRE(bielik_chat.bos_token() == "<s>");
  REQUIRE(bielik_chat.eos_token() == "</s>");
  REQUIRE(bielik_chat.default_system_prompt().empty());
  REQUIRE(bielik_chat.render({{"user", "Hej"}}, true) == "<|im_start|>user\nHej<|im_end|>\n<|im_start|>assistant\n");

  // The list form: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
  json listed = {{"chat_template", {{{"name", "tool_use"}, {"template", "{{ tools }}"}},
                                    {{"name", "default"}, {"template", kBosTemplate}}}},
                 {"bos_token", "<s>"}};
  REQUIRE(ChatTemplate::from_tokenizer_config(dir.write("tokenizer_config.json", listed.dump())).add_bos());
}

TEST_CASE("chat template: a default system turn in the else-branch after the caller's", "[ch08][cpu]") {
  // The form of Qwen2.5's template (its tool branch left out): the first
  // "<|im_start|>system" writes messages[0]'s content, the fixed default comes after it.
  const char* source =
      "{%- if messages[0]['role'] == 'system' %}"
      "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
      "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\n' }}{%- endif %}"
      "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
      "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";
  TempDir dir;
  const ChatTemplate chat = ChatTemplate::from_tokenizer_config(
      dir.write("tokenizer_config.json", json{{"chat_template", source}, {"eos_token", "<|im_end|>"}}.dump()));
  CHECK(chat.default_system_prompt() == "You are Qwen, created by Alibaba Cloud.");
  // What the template renders, worked out by hand: the else-branch, then the turns...
  CHECK(chat.render({{"user", "Hej"}}, true) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\n"
        "<|im_start|>user\nHej<|im_end|>\n<|im_start|>assistant\n");
  // ...or the caller's system message in the first branch, written once.
  CHECK(chat.render({{"system", "Mów po polsku."}, {"user", "Hej"}}, false) ==
        "<|im_start|>system\nMów po polsku.<|im_end|>\n<|im_start|>user\nHej<|im_end|>\n");
}

TEST_CASE("chat template: non-ChatML, missing or broken configs fail naming the file", "[ch08][cpu]") {
  TempDir dir;
  json llama2 = {{"chat_template", "{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}"}};
  std::string path = dir.write("tokenizer_config.json", llama2.dump());
  std::string message = error_of([&] { ChatTemplate::from_tokenizer_config(path); });
  CHECK(contains(message, path));
  CHECK(contains(message, "unsupported chat template: only ChatML is implemented"));

  path = dir.write("tokenizer_config.json", json{{"bos_token", "<s>"}}.dump());
  message = error_of([&] { ChatTemplate::from_tokenizer_config(path); });
  CHECK(contains(message, path));
  CHECK(contains(message, "no \"chat_template\""));

  path = dir.write("tokenizer_config.json", "{\"chat_template\": ");
  CHECK(contains(error_of([&] { ChatTemplate::from_tokenizer_config(path); }), "malformed JSON"));
  // The list form with a name that is not a string: refused by name, not with nlohmann's
  // type_error (found by `make fuzz`).
  path = dir.write("tokenizer_config.json",
                   json{{"chat_template", json::array({json{{"name", 5}, {"template", "<|im_start|><|im_end|>"}}})}}.dump());
  message = error_of([&] { ChatTemplate::from_tokenizer_config(path); });
  CHECK(contains(message, path));
  CHECK(contains(message, "no \"chat_template\""));
  path = dir.write("tokenizer_config.json", "{\"chat_template\": 4e335}");  // out_of_range while parsing
  CHECK(contains(error_of([&] { ChatTemplate::from_tokenizer_config(path); }), "malformed JSON"));
  CHECK(contains(error_of([&] { ChatTemplate::from_tokenizer_config(dir.path + "/none.json"); }), "none.json"));
}
