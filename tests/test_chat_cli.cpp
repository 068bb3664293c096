// End to end: the bielik-chat program, run as a user runs it, on chapter 08's tiny
// SmolLM2-like checkpoints (greedy). The expected answer is the numpy reference's greedy
// reply (golden/gen_08_tiny_model.py), decoded to text.
// Compiled twice: test_chat_cli (every case but the CUDA one) and, with
// BIELIK_TEST_CHAT_CUDA, test_chat_cli_cuda (the GPU test main: skipped without a GPU),
// whose only case runs the program with --device cuda on the D = 64 checkpoint.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

#endif  // BIELIK_TEST_CHAT_CUDA
