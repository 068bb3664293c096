// End to end: the bielik-chat program, run as a user runs it, on chapter 08's tiny
// SmolLM2-like checkpoints (greedy). The expected answer is the numpy reference's greedy
// reply (golden/gen_08_tiny_model.py), decoded to text.
// Compiled twice: test_chat_cli (every case but the CUDA one) and, with
// BIELIK_TEST_CHAT_CUDA, test_chat_cli_cuda (the GPU test main: skipped without a GPU),
// whose only case runs the program with --device cuda on the D = 64 checkpoint.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "npy.hpp"
#include "test_support.hpp"
#include "tokenizer.hpp"

using namespace bielik;

namespace {

struct Run {
  int status = -1;  // exit code
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs bielik-chat with `args` (already shell-quoted), feeding `input` on stdin.
Run run_chat(const std::string& args, const std::string& input = "") {
  namespace fs = std::filesystem;
  const std::string base = (fs::temp_directory_path() / ("bielik_cli_" + std::to_string(getpid()))).string();
  std::ofstream(base + ".in", std::ios::binary) << input;
  const std::string command = std::string("'") + BIELIK_CHAT_BINARY + "' " + args + " <'" + base + ".in' >'" +
                              base + ".out' 2>'" + base + ".err'";
  const int raw = std::system(command.c_str());
  Run run;
  run.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  run.out = read_file(base + ".out");
  run.err = read_file(base + ".err");
  for (const char* ext : {".in", ".out", ".err"}) fs::remove(base + ext);
  return run;
}

std::string model_dir(const std::string& model) { return golden_path("08_bielik", model); }
std::string tiny_dir() { return model_dir("tiny_smollm"); }

// The reference answer to "Hi!" as text: the golden greedy reply ids, decoded.
std::string expected_answer(const std::string& model = "tiny_smollm") {
  Tokenizer tokenizer = Tokenizer::from_file(model_dir(model) + "/tokenizer.json");
  return tokenizer.decode(load_npy(golden_path("08_bielik", model + "_chat_reply.npy")).to_int32());
}

const std::string kGreedy = " --temperature 0 --max-new-tokens 12 --threads 2";

// A scratch copy of a tiny model folder whose tokenizer.json is `edit`ed (parsed JSON),
// removed when the test ends.
struct EditedModel {
  std::filesystem::path dir;
  EditedModel(const std::string& model, const std::string& name,
              const std::function<void(nlohmann::json&)>& edit) {
    namespace fs = std::filesystem;
    dir = fs::temp_directory_path() / ("bielik_cli_" + name + "_" + std::to_string(getpid()));
    fs::create_directories(dir);
    for (const char* file : {"config.json", "model.safetensors", "tokenizer_config.json"})
      fs::copy_file(model_dir(model) + "/" + file, dir / file, fs::copy_options::overwrite_existing);
    nlohmann::json tokenizer = nlohmann::json::parse(read_file(model_dir(model) + "/tokenizer.json"));
    edit(tokenizer);
    std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  }
  ~EditedModel() { std::filesystem::remove_all(dir); }
  std::string arg() const { return "--model '" + dir.string() + "'"; }
};

}  // namespace

#ifdef BIELIK_TEST_CHAT_CUDA

TEST_CASE("bielik-chat --device cuda: the reference's answer from the GPU backend", "[ch08][gpu][cli]") {
  // D = 64: a head size the CUDA backend runs (the other tiny models have D = 16).
  const std::string model = "'" + model_dir("tiny_chat_d64") + "'";
  Run one_shot = run_chat("--model " + model + " --device cuda --prompt 'Hi!'" + kGreedy);
  INFO("stderr: " << one_shot.err);
  REQUIRE(one_shot.status == 0);
  CHECK(one_shot.out == expected_answer("tiny_chat_d64") + "\n");
  CHECK(contains(one_shot.err, "tokens/s"));

  Run chat = run_chat("--model " + model + " --device cuda" + kGreedy, "Hi!\n/reset\nHi!\n/quit\n");
  INFO("stderr: " << chat.err);
  REQUIRE(chat.status == 0);
  CHECK(contains(chat.err, " on cuda ("));  // the banner names the backend that answered
  const std::string answer = expected_answer("tiny_chat_d64") + "\n";
  CHECK(chat.out == answer + answer);
}

#else

TEST_CASE("bielik-chat on the D = 64 checkpoint, CPU backend: the reference's answer", "[ch08][cpu][cli]") {
  // The same run as test_chat_cli_cuda's, on the CPU: the golden reply and the program
  // agree here, so a difference on the GPU is the CUDA backend's.
  Run chat = run_chat("--model '" + model_dir("tiny_chat_d64") + "' --device cpu" + kGreedy, "Hi!\n/quit\n");
  INFO("stderr: " << chat.err);
  REQUIRE(chat.status == 0);
  CHECK(contains(chat.err, " on cpu ("));
  CHECK(chat.out == expected_answer("tiny_chat_d64") + "\n");
}

TEST_CASE("bielik-chat --prompt: the greedy answer of the reference, then timing", "[ch08][cpu][cli]") {
  Run run = run_chat("--model '" + tiny_dir() + "' --prompt 'Hi!'" + kGreedy);
  INFO("stderr: " << run.err);
  REQUIRE(run.status == 0);
  CHECK(run.out == expected_answer() + "\n");
  CHECK(contains(run.err, "TTFT"));
  CHECK(contains(run.err, "tokens/s"));
}

TEST_CASE("bielik-chat interactive: piped turns, /stats, /reset, /quit", "[ch08][cpu][cli]") {
  Run run = run_chat("--model '" + tiny_dir() + "'" + kGreedy, "Hi!\n/stats\n/reset\n/nonsense\nHi!\n/quit\nHi!\n");
  INFO("stderr: " << run.err);
  REQUIRE(run.status == 0);
  // After /reset the same question gets the same greedy answer; nothing after /quit runs.
  const std::string answer = expected_answer() + "\n";
  CHECK(run.out == answer + answer);
  CHECK(contains(run.err, "tokens used"));        // /stats
  CHECK(contains(run.err, "new conversation"));   // /reset
  CHECK(contains(run.err, "unknown command /nonsense"));
}

TEST_CASE("bielik-chat: a prompt beyond the context is a message, and the chat goes on", "[ch08][cpu][cli]") {
  const std::string long_text(120, 'z');
  Run one_shot = run_chat("--model '" + tiny_dir() + "' --context 40 --prompt '" + long_text + "'" + kGreedy);
  INFO("stderr: " << one_shot.err);
  CHECK(one_shot.status == 3);
  CHECK(contains(one_shot.err, "exceeds the context of 40 tokens"));
  CHECK(contains(one_shot.err, "/reset"));

  Run chat = run_chat("--model '" + tiny_dir() + "'" + kGreedy, long_text + "\nHi!\n");
  INFO("stderr: " << chat.err);
  CHECK(chat.status == 0);
  CHECK(contains(chat.err, "exceeds the context of 96 tokens"));
  CHECK(chat.out == expected_answer() + "\n");  // the failed turn left no trace
}

TEST_CASE("bielik-chat: bad command lines and missing models fail clearly", "[ch08][cpu][cli]") {
  Run missing = run_chat("--model /nonexistent/model --prompt hi");
  CHECK(missing.status == 1);
  CHECK(contains(missing.err, "/nonexistent/model"));
  CHECK(contains(missing.err, "make chat"));

  Run flag = run_chat("--frobnicate 3");
  CHECK(flag.status == 2);
  CHECK(contains(flag.err, "unknown flag: --frobnicate"));
  CHECK(contains(flag.err, "usage:"));

  Run number = run_chat("--temperature warm");
  CHECK(number.status == 2);
  CHECK(contains(number.err, "--temperature expects a number"));

  // Numbers std::stof reads but the sampler cannot use (1 / inf = 0 gave uniform noise;
  // a NaN was reported after the model had loaded), and out-of-range ones: flag errors,
  // said before the model is read (the folder does not exist).
  const struct {
    const char* flags;
    const char* expected;
  } bad_numbers[] = {
      {"--temperature inf", "--temperature must be a finite number >= 0, got 'inf'"},
      {"--temperature nan", "--temperature must be a finite number >= 0, got 'nan'"},
      {"--temperature -1", "--temperature must be a finite number >= 0, got '-1'"},
      {"--top-k -3", "--top-k must be >= 0 (0 = all), got '-3'"},
      {"--top-p nan", "--top-p must be in (0, 1], got 'nan'"},
      {"--top-p inf", "--top-p must be in (0, 1], got 'inf'"},
      {"--top-p 0", "--top-p must be in (0, 1], got '0'"},
  };
  for (const auto& bad : bad_numbers) {
    Run run = run_chat(std::string("--model /nonexistent/model --prompt hi ") + bad.flags);
    INFO(bad.flags << "\nstderr: " << run.err);
    CHECK(run.status == 2);
    CHECK(contains(run.err, bad.expected));
    CHECK(contains(run.err, "usage:"));
  }

  // Text that is not UTF-8: a flag's, refused before the model is read (the model
  // folder does not exist here); a typed turn's, by its own offset, and the chat goes on.
  Run bad_prompt = run_chat("--model /nonexistent/model --prompt 'ab\xff'");
  CHECK(bad_prompt.status == 2);
  CHECK(contains(bad_prompt.err, "--prompt is not valid UTF-8 at byte 2 of 3"));
  Run bad_system = run_chat("--model /nonexistent/model --system '\xc5' --prompt hi");
  CHECK(bad_system.status == 2);
  CHECK(contains(bad_system.err, "--system is not valid UTF-8 at byte 0 of 1"));
  Run bad_turn = run_chat("--model '" + tiny_dir() + "'" + kGreedy, "ab\xff\nHi!\n");
  INFO("stderr: " << bad_turn.err);
  CHECK(bad_turn.status == 0);
  CHECK(contains(bad_turn.err, "the message is not valid UTF-8 at byte 2 of 3"));
  CHECK(bad_turn.out == expected_answer() + "\n");  // the refused turn left no trace

  Run device = run_chat("--model '" + tiny_dir() + "' --device tpu --prompt hi");
  CHECK(device.status == 1);
  CHECK(contains(device.err, "unknown device 'tpu'"));

  // A model folder without its tokenizer: the message names the file.
  namespace fs = std::filesystem;
  const fs::path partial = fs::temp_directory_path() / ("bielik_cli_partial_" + std::to_string(getpid()));
  fs::create_directories(partial);
  fs::copy_file(tiny_dir() + "/config.json", partial / "config.json", fs::copy_options::overwrite_existing);
  Run no_tokenizer = run_chat("--model '" + partial.string() + "' --prompt hi");
  fs::remove_all(partial);
  CHECK(no_tokenizer.status == 1);
  CHECK(contains(no_tokenizer.err, "tokenizer.json"));
}

TEST_CASE("bielik-chat: another model's tokenizer is refused at load, naming both files", "[ch08][cpu][cli]") {
  // tiny_smollm (vocab_size 259) with tiny_bielik's tokenizer (ids 0..299).
  EditedModel mixed("tiny_smollm", "mixed", [](nlohmann::json& tokenizer) {
    tokenizer = nlohmann::json::parse(read_file(model_dir("tiny_bielik") + "/tokenizer.json"));
  });
  Run run = run_chat(mixed.arg() + " --prompt 'Hi!'" + kGreedy);
  INFO("stderr: " << run.err);
  CHECK(run.status == 1);
  CHECK(contains(run.err, "cannot load the model"));
  CHECK(contains(run.err, (mixed.dir / "tokenizer.json").string() + ": its largest token id is 299"));
  CHECK(contains(run.err, "config.json's vocab_size is 259"));
  CHECK(run.out.empty());
}

TEST_CASE("bielik-chat: a token the tokenizer has no text for fails the turn, the chat goes on", "[ch08][cpu][cli]") {
  // The reference's first reply token taken out of the tokenizer (a padded vocabulary's
  // padding id looks the same: a row of the model with no token). It used to escape as
  // std::out_of_range and abort the program.
  const std::vector<int32_t> prompt = load_npy(golden_path("08_bielik", "tiny_smollm_chat_prompt.npy")).to_int32();
  const int32_t first = load_npy(golden_path("08_bielik", "tiny_smollm_chat_reply.npy")).to_int32().at(0);
  REQUIRE(std::find(prompt.begin(), prompt.end(), first) == prompt.end());  // the prompt still encodes the same
  const std::string token = Tokenizer::from_file(tiny_dir() + "/tokenizer.json").token_string(first);
  EditedModel gap("tiny_smollm", "gap", [&](nlohmann::json& tokenizer) { tokenizer["model"]["vocab"].erase(token); });
  const std::string expected = "the model chose token id " + std::to_string(first) + ", which " +
                               (gap.dir / "tokenizer.json").string() + " has no token for";

  Run one_shot = run_chat(gap.arg() + " --prompt 'Hi!'" + kGreedy);
  INFO("stderr: " << one_shot.err);
  CHECK(one_shot.status == 1);
  CHECK(contains(one_shot.err, expected));

  // Interactive: each turn fails the same way, and the chat goes on to /stats and the end.
  Run chat = run_chat(gap.arg() + kGreedy, "Hi!\nHi!\n/stats\n");
  INFO("stderr: " << chat.err);
  CHECK(chat.status == 0);
  const size_t once = chat.err.find(expected);
  REQUIRE(once != std::string::npos);
  CHECK(chat.err.find(expected, once + 1) != std::string::npos);
  CHECK(contains(chat.err, "0 of 96 tokens used"));  // /stats: the failed turns left an empty cache
  CHECK(contains(chat.err, "turns      0 (0 messages)"));
}

#endif  // BIELIK_TEST_CHAT_CUDA
