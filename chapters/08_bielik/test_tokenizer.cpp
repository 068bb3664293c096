// Chapter 08, CPU: the hand-written tokenizer against HF `tokenizers` (golden data from
// golden/gen_08_tokenizer.py), the Unicode tables, UTF-8 handling, streaming decode and
// the error paths. With a prepared SmolLM2 (scripts/prepare_smollm2.py) it also checks
// the real 49152-token vocabulary.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "pretokenizer.hpp"
#include "test_support.hpp"
#include "tokenizer.hpp"
#include "utf8.hpp"

using namespace bielik;
using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  INFO("reading " << path << " (run `make golden` / the chapter build first)");
  REQUIRE(in.good());
  return json::parse(in);
}

const char* kVariants[] = {"bytelevel",         "bytelevel_string_merges", "bytelevel_prefix", "metaspace",
                           "metaspace_nosplit", "metaspace_always",        "llama_legacy",     "bytelevel_added"};

std::string tokenizer_path(const std::string& name) { return golden_path("08_tokenizer", name + ".json"); }

// Checks encode, decode and streaming decode of every case against the reference.
void check_cases(const Tokenizer& tokenizer, const json& cases, const std::string& name) {
  for (const json& c : cases) {
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
    std::string decoded = c["decoded"].get<std::string>();
    INFO("tokenizer " << name << ", text \"" << text << "\"");

    std::vector<int32_t> ids = tokenizer.encode(text);
    CHECK(ids == expected);
    CHECK(tokenizer.decode(expected) == decoded);

    StreamDecoder stream(tokenizer);
    std::string streamed;
    for (int32_t id : expected) {
      std::string piece = stream.push(id);
      CHECK(utf8::find_invalid(piece) == std::string::npos);  // never half a character
      streamed += piece;
    }
    std::string rest = stream.flush();
    CHECK(utf8::find_invalid(rest) == std::string::npos);
    CHECK(streamed + rest == decoded);
  }
}

}  // namespace

// bytelevel_added: single_word, lstrip and rstrip added tokens, with strings that put word
// characters of every kind beside them (golden/gen_08_tokenizer.py, ADDED_TOKEN_STRINGS).
TEST_CASE("tokenizer: ids and decodes equal HF tokenizers on eight tokenizer.json layouts", "[ch08][cpu]") {
  json cases = read_json(golden_path("08_tokenizer", "cases.json"));
  for (const char* name : kVariants) {
    Tokenizer tokenizer = Tokenizer::from_file(tokenizer_path(name));
    REQUIRE(cases.contains(name));
    REQUIRE(cases[name].size() >= 20);
    check_cases(tokenizer, cases[name], name);
  }
}

TEST_CASE("tokenizer: special tokens, lookups, token_text", "[ch08][cpu]") {
  Tokenizer byte_level = Tokenizer::from_file(tokenizer_path("bytelevel"));
  int32_t im_start = byte_level.token_to_id("<|im_start|>"), im_end = byte_level.token_to_id("<|im_end|>");
  REQUIRE(im_start >= 0);
  REQUIRE(im_end >= 0);
  REQUIRE(byte_level.is_special(im_end));
  REQUIRE(byte_level.token_to_id("no such token") == -1);
  REQUIRE(byte_level.token_text(im_end) == "<|im_end|>");
  int32_t space_world = byte_level.token_to_id("\xC4\xA0w");  // "Ġw": the byte alphabet's " w"
  if (space_world >= 0) {
    REQUIRE_FALSE(byte_level.is_special(space_world));
    REQUIRE(byte_level.token_text(space_world) == " w");
  }
  REQUIRE_THROWS_AS(byte_level.decode({byte_level.vocab_size()}), std::out_of_range);
  REQUIRE_THROWS_AS(byte_level.decode({-1}), std::out_of_range);
  // skip_special drops the chat markers, as a printed reply wants.
  std::vector<int32_t> ids = byte_level.encode("<|im_start|>Hej<|im_end|>");
  REQUIRE(byte_level.decode(ids, /*skip_special=*/true) == "Hej");

  Tokenizer metaspace = Tokenizer::from_file(tokenizer_path("metaspace"));
  int32_t byte_41 = metaspace.token_to_id("<0x41>");
  REQUIRE(byte_41 >= 0);
  REQUIRE(metaspace.token_text(byte_41) == "A");  // byte fallback token -> its byte
  REQUIRE_FALSE(metaspace.is_special(byte_41));
  REQUIRE(metaspace.is_special(metaspace.token_to_id("<s>")));
}

TEST_CASE("tokenizer: streaming holds back partial characters, flush repairs them", "[ch08][cpu]") {
  Tokenizer tokenizer = Tokenizer::from_file(tokenizer_path("metaspace"));
  // "ł" = C5 82, fed as two byte-fallback tokens.
  int32_t c5 = tokenizer.token_to_id("<0xC5>"), x82 = tokenizer.token_to_id("<0x82>");
  StreamDecoder stream(tokenizer);
  REQUIRE(stream.push(c5).empty());                   // half a character: nothing yet
  REQUIRE(stream.push(x82) == "\xC5\x82");            // now the whole "ł"
  REQUIRE(stream.push(c5).empty());
  REQUIRE(stream.flush() == "\xEF\xBF\xBD");          // never completed: U+FFFD
  REQUIRE(tokenizer.decode({c5, x82, c5}) == "\xC5\x82\xEF\xBF\xBD");
}

TEST_CASE("tokenizer: invalid UTF-8 input is refused with its byte offset", "[ch08][cpu]") {
  Tokenizer tokenizer = Tokenizer::from_file(tokenizer_path("bytelevel"));
  struct Case {
    std::string text;
    size_t offset;
  };
  std::vector<Case> cases = {
      {"abc\xC3(", 3},              // lead byte followed by a non-continuation
      {"ok \x80", 3},               // lone continuation byte
      {"\xC0\x80", 0},              // overlong NUL
      {"x\xED\xA0\x80", 1},         // UTF-16 surrogate
      {"za\xC5", 2},                // truncated at the end
      {"\xF5\x80\x80\x80", 0},      // above U+10FFFF
      {"Łódź \xFF", 8},           // Ł ó ź take two bytes each
  };
  for (const Case& c : cases) {
    std::string message;
    try {
      tokenizer.encode(c.text);
    } catch (const std::invalid_argument& error) {
      message = error.what();
    }
    INFO("offset " << c.offset << ", message: " << message);
    CHECK(message == "input is not valid UTF-8 at byte " + std::to_string(c.offset));
  }
}

TEST_CASE("tokenizer: broken tokenizer.json files fail naming the file", "[ch08][cpu]") {
  TempDir temp;
  const std::string& dir = temp.path;
  std::string path = temp.file("tokenizer.json");
  json good = read_json(tokenizer_path("bytelevel"));
  struct Case {
    const char* what;
    std::string text;
    const char* expected;
  };
  auto edited = [&](auto edit) {
    json j = good;
    edit(j);
    return j.dump();
  };
  std::vector<Case> cases = {
      {"bad JSON", "{\"model\": {", "malformed JSON"},
      {"a number past double's range", "{\"model\": 4e335}", "malformed JSON"},
      {"no model", edited([](json& j) { j.erase("model"); }), "has no \"model\""},
      {"Unigram", edited([](json& j) { j["model"]["type"] = "Unigram"; }), "model type 'Unigram' is not supported"},
      {"no vocab", edited([](json& j) { j["model"].erase("vocab"); }), "no \"vocab\""},
      {"no merges", edited([](json& j) { j["model"].erase("merges"); }), "no \"merges\""},
      {"merge of unknown tokens", edited([](json& j) { j["model"]["merges"].push_back({"qqq", "zzz"}); }),
       "uses a token missing from vocab"},
      {"malformed merge", edited([](json& j) { j["model"]["merges"].push_back("abc"); }), "is not two tokens"},
      {"Split pre-tokenizer", edited([](json& j) { j["pre_tokenizer"] = {{"type", "Split"}}; }),
       "pre_tokenizer type 'Split' is not supported"},
      {"NFKC normalizer", edited([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }),
       "normalizer type 'NFKC' is not supported"},
      {"WordPiece decoder", edited([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }),
       "decoder type 'WordPiece' is not supported"},
      {"added token without id", edited([](json& j) { j["added_tokens"][0].erase("id"); }), "needs an integer \"id\""},
      {"wrongly typed field", edited([](json& j) { j["model"]["byte_fallback"] = "yes"; }), "unexpected content"},
  };
  for (const Case& c : cases) {
    std::ofstream(path) << c.text;
    std::string message = error_of([&] { Tokenizer::from_file(path); });
    INFO("case: " << c.what << "\nmessage: " << message);
    CHECK(contains(message, path));
    CHECK(contains(message, c.expected));
  }
  std::string missing = error_of([&] { Tokenizer::from_file(dir + "/absent.json"); });
  CHECK(contains(missing, dir + "/absent.json"));
  // The unedited file loads: the failures above come from the edits.
  std::ofstream(path) << good.dump();
  REQUIRE(Tokenizer::from_file(path).vocab_size() > 256);
}

TEST_CASE("tokenizer: ids far beyond the vocabulary are refused naming the file, small gaps load",
          "[ch08][cpu]") {
  TempDir temp;
  const std::string path = temp.file("tokenizer.json");
  const json good = read_json(tokenizer_path("bytelevel"));
  const int64_t entries = int64_t(good["model"]["vocab"].size()), added = int64_t(good["added_tokens"].size());
  auto edited = [&](auto edit) {
    json j = good;
    edit(j);
    return j.dump();
  };
  struct Case {
    const char* what;
    std::string text;
    const char* expected;
  };
  // Each id used to size a table: INT32_MAX + 1 wrapped (an out-of-bounds write), a vocab
  // id of INT32_MAX asked for a vector past max_size(), 300000000 for tens of GB.
  const std::vector<Case> cases = {
      {"added token id INT32_MAX",
       edited([](json& j) { j["added_tokens"].push_back({{"id", 2147483647}, {"content", "<|far|>"}}); }),
       "far beyond the"},
      {"added token id 300000000",
       edited([](json& j) { j["added_tokens"].push_back({{"id", 300000000}, {"content", "<|far|>"}}); }),
       "far beyond the"},
      {"added token id -1", edited([](json& j) { j["added_tokens"].push_back({{"id", -1}, {"content", "<|neg|>"}}); }),
       "needs an integer \"id\""},
      {"vocab id INT32_MAX", edited([](json& j) { j["model"]["vocab"]["zzqq"] = 2147483647; }),
       "vocab entry 'zzqq' has id 2147483647, far beyond the"},
      {"vocab id 300000000", edited([](json& j) { j["model"]["vocab"]["zzqq"] = 300000000; }),
       "vocab entry 'zzqq' has id 300000000, far beyond the"},
      {"vocab id past INT32_MAX", edited([](json& j) { j["model"]["vocab"]["zzqq"] = 4294967296LL; }),
       "not a non-negative integer"},
      {"vocab id -3", edited([](json& j) { j["model"]["vocab"]["zzqq"] = -3; }), "not a non-negative integer"},
  };
  for (const Case& c : cases) {
    std::ofstream(path) << c.text;
    const std::string message = error_of<std::runtime_error>([&] { Tokenizer::from_file(path); });
    INFO("case: " << c.what << "\nmessage: " << message);
    CHECK(contains(message, path));
    CHECK(contains(message, c.expected));
  }

  // The rule's edge (tokenizer_bpe.hpp's max_token_id): an added token at exactly
  // 4 * (vocab + added tokens) + 1024 loads, one more is refused.
  const int64_t limit = 4 * (entries + added + 1) + 1024;
  std::ofstream(path) << edited(
      [&](json& j) { j["added_tokens"].push_back({{"id", limit}, {"content", "<|edge|>"}}); });
  const Tokenizer edge = Tokenizer::from_file(path);
  CHECK(edge.vocab_size() == limit + 1);
  CHECK(edge.token_to_id("<|edge|>") == limit);
  std::ofstream(path) << edited(
      [&](json& j) { j["added_tokens"].push_back({{"id", limit + 1}, {"content", "<|edge|>"}}); });
  CHECK(contains(error_of<std::runtime_error>([&] { Tokenizer::from_file(path); }), "far beyond the"));

  // A few ids with no token (a gap before an added token) are normal: the file loads,
  // and a gap id is refused by decode like any id outside the vocabulary.
  std::ofstream(path) << edited(
      [&](json& j) { j["added_tokens"].push_back({{"id", entries + added + 10}, {"content", "<|gap|>"}}); });
  const Tokenizer gapped = Tokenizer::from_file(path);
  const int32_t gap_token = gapped.token_to_id("<|gap|>");
  CHECK(gap_token == entries + added + 10);
  CHECK(gapped.decode({gap_token}) == "<|gap|>");
  CHECK(contains(error_of<std::out_of_range>([&] { gapped.decode({gap_token - 1}); }),
                 "token id " + std::to_string(gap_token - 1) + " is not in the vocabulary"));
}

// The pre-tokenizer's Unicode classes, every code point: test_unicode_classes.cpp.

TEST_CASE("pre-tokenizer: GPT-2 split by hand on hand-made cases", "[ch08][cpu]") {
  using V = std::vector<std::string>;
  CHECK(split_gpt2("Hello world") == V{"Hello", " world"});
  CHECK(split_gpt2("a   b") == V{"a", "  ", " b"});  // the last space goes with the word
  CHECK(split_gpt2("a \nb") == V{"a", " ", "\n", "b"});  // a lone space before a non-space stands alone
  CHECK(split_gpt2(" \n x") == V{" \n", " x"});
  CHECK(split_gpt2("it's they'll") == V{"it", "'s", " they", "'ll"});
  CHECK(split_gpt2("Zażółć 12!?") == V{"Zażółć", " 12", "!?"});
  CHECK(split_gpt2("end  ") == V{"end", "  "});
  CHECK(split_gpt2("👋🏽 hi") == V{"👋🏽", " hi"});
}

TEST_CASE("utf8: repair and complete prefixes", "[ch08][cpu]") {
  CHECK(utf8::to_valid("a\xE2\x82" "b") == "a\xEF\xBF\xBD" "b");          // truncated 3-byte: one U+FFFD
  CHECK(utf8::to_valid("\xFF\xFE") == "\xEF\xBF\xBD\xEF\xBF\xBD");          // two bad bytes: two
  CHECK(utf8::to_valid("\xE2\x82\xAC") == "\xE2\x82\xAC");                   // "€" intact
  CHECK(utf8::complete_prefix("ab\xF0\x9F\x91") == 2);                       // emoji cut short
  CHECK(utf8::complete_prefix("ab\xF0\x9F\x91\x8B") == 6);
  CHECK(utf8::complete_prefix("a\xFF") == 2);                                // invalid, not incomplete
  size_t length;
  CHECK(utf8::decode("\xC5\x82", 0, &length) == 0x142);                      // ł
  CHECK(length == 2);
  CHECK(utf8::encode(0x1F44B) == "\xF0\x9F\x91\x8B");
}

// Optional (required with BIELIK_REQUIRE_SMOLLM2=1, as CI sets it): the real SmolLM2
// tokenizer, when scripts/prepare_smollm2.py has been run.
// Its expected ids come from HF tokenizers, written by that script (tokenizer_cases.json).
TEST_CASE("tokenizer: SmolLM2-135M-Instruct's real tokenizer equals HF (if prepared)", "[ch08][cpu]") {
  const char* env = std::getenv("BIELIK_SMOLLM2_DIR");
  std::string dir = env ? env : std::string(BIELIK_SOURCE_DIR) + "/models/smollm2-135m-instruct";
  std::string cases_path = dir + "/tokenizer_cases.json";
  if (!std::ifstream(cases_path).good()) {
    if (smollm2_required()) {  // CI prepared it: a missing file is a failed preparation, not a skip
      FAIL("BIELIK_REQUIRE_SMOLLM2 is set but " << cases_path << " is missing (run `make models`)");
    }
    WARN("no " << cases_path << ": run `python scripts/prepare_smollm2.py` to test the real SmolLM2 tokenizer");
    return;
  }
  Tokenizer tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
  REQUIRE(tokenizer.vocab_size() == 49152);
  check_cases(tokenizer, read_json(cases_path), "smollm2");
}
