// tokenizer_config.json -> ChatTemplate (ChatML only) and the prompt rendering.
#include "chat_template.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace bielik {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw std::runtime_error(path + ": " + problem);
}

// bos_token / eos_token: a string, or an AddedToken object {"content": "<s>", ...}, or null.
std::string token_field(const json& config, const char* key) {
  if (!config.contains(key)) return "";
  const json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return "";
}

// The Jinja source of a string literal: '\n' may be written escaped inside the literal.
std::string unescape_jinja(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      char next = text[++i];
      out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
    } else {
      out += text[i];
    }
  }
  return out;
}

// A template that writes a fixed system turn when the conversation has none (SmolLM2)
// contains the literal "<|im_start|>system\n...<|im_end|>". The per-message part writes
// "'<|im_start|>' + message['role']" instead, so a literal system turn is the default.
// Some templates (Qwen2.5's form) first write the caller's system message,
// "'<|im_start|>system\n' + messages[0]['content'] + ...", and the fixed default in the
// else-branch after it: so every "<|im_start|>system" is looked at, the first fixed one wins.
std::string find_default_system(const std::string& source) {
  const std::string head = "<|im_start|>system";
  for (size_t at = source.find(head); at != std::string::npos; at = source.find(head, at + head.size())) {
    size_t text_start = at + head.size();
    if (source.compare(text_start, 1, "\n") == 0)
      text_start += 1;
    else if (source.compare(text_start, 2, "\\n") == 0)
      text_start += 2;
    else
      continue;
    size_t end = source.find("<|im_end|>", text_start);
    if (end == std::string::npos) return "";
    std::string text = source.substr(text_start, end - text_start);
    // Anything computed (Jinja expressions, string concatenation) is not a fixed prompt.
    if (text.find("{{") != std::string::npos || text.find("{%") != std::string::npos ||
        text.find("' +") != std::string::npos || text.find("message") != std::string::npos)
      continue;
    return unescape_jinja(text);
  }
  return "";
}

}  // namespace

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open tokenizer_config.json");
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& error) {  // parse_error, or out_of_range for a number like 4e335
    fail(path, std::string("malformed JSON: ") + error.what());
  }
  if (!config.is_object()) fail(path, "tokenizer_config.json is not a JSON object");

  // chat_template: a string, or a list of {"name", "template"} where "default" is the chat one.
  std::string source;
  const json& field = config.value("chat_template", json());
  if (field.is_string()) {
    source = field.get<std::string>();
  } else if (field.is_array()) {
    // Every field's type checked before it is read: json::value("name", "") would throw
    // nlohmann's type_error, not our error naming the file, for {"name": 5} (found by
    // `make fuzz`).
    auto string_field = [](const json& entry, const char* key) {
      return entry.is_object() && entry.contains(key) && entry[key].is_string() ? entry[key].get<std::string>()
                                                                                 : std::string();
    };
    for (const json& entry : field)
      if (string_field(entry, "name") == "default" && !string_field(entry, "template").empty())
        source = string_field(entry, "template");
  }
  if (source.empty())
    fail(path, "has no \"chat_template\" (a chat model's tokenizer_config.json carries one)");
  if (source.find("<|im_start|>") == std::string::npos || source.find("<|im_end|>") == std::string::npos)
    fail(path, "unsupported chat template: only ChatML is implemented (a template writing <|im_start|>role ... "
               "<|im_end|>); this one begins: " + source.substr(0, 120));

  ChatTemplate chat;
  chat.bos_token_ = token_field(config, "bos_token");
  chat.eos_token_ = token_field(config, "eos_token");
  chat.add_bos_token_ = config.contains("add_bos_token") && config["add_bos_token"].is_boolean() &&
                       config["add_bos_token"].get<bool>();
  chat.add_bos_ = source.find("bos_token") != std::string::npos && !chat.bos_token_.empty();
  chat.default_system_ = find_default_system(source);
  return chat;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string prompt;
  // As the templates do it: inside the message loop, before the first non-system message.
  if (!messages.empty() && messages.front().role != "system" && !default_system_.empty())
    prompt += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (const ChatMessage& message : messages)
    prompt += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
  if (add_generation_prompt) prompt += "<|im_start|>assistant\n";
  return prompt;
}

}  // namespace bielik
