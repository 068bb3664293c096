// bielik-chat: talk to Bielik-1.5B-v3.0-Instruct (or any Llama-family ChatML model in
// HuggingFace layout, e.g. SmolLM2-135M-Instruct) from the terminal.
//
//   bielik-chat --model models/smollm2-135m-instruct            interactive chat
//   bielik-chat --model DIR --prompt "Kim jesteś?"              one answer, then exit
//
// The answer streams to stdout as it is generated; timing (time to first token,
// tokens/s) goes to stderr after each answer. Ctrl-C stops the current answer, not
// the program (a second Ctrl-C while one is pending exits). Run with --help for flags.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

#include "backend_factory.hpp"
#include "chat_session.hpp"
#include "chat_template.hpp"
#include "tokenizer.hpp"
#include "utf8.hpp"

using namespace bielik;

namespace {

const char* const kUsage = R"(usage: bielik-chat [options]

  --model DIR           model folder in HF layout: config.json, model.safetensors
                        (or its index + shards), tokenizer.json, tokenizer_config.json
                        (default: models/smollm2-135m-instruct)
  --prompt TEXT         answer TEXT once and exit (default: interactive chat)
  --system TEXT         system message at the start of the conversation
  --max-new-tokens N    longest answer in tokens (default 512)
  --temperature T       0 = greedy (default 0.7)
  --top-k K             sample among the K most likely tokens, 0 = all (default 40)
  --top-p P             nucleus sampling mass in (0, 1] (default 0.9)
  --seed S              random seed (default: a fresh one, shown by /stats)
  --device D            cpu, cuda or auto (default auto: cuda when available, else cpu)
  --threads N           CPU backend threads (default: all hardware threads)
  --context N           KV cache length in tokens (default: the model's max_position_embeddings)
  --help                this text

In the chat: /reset starts a new conversation, /stats shows timing and context use,
/quit (or Ctrl-D) leaves. Ctrl-C stops the answer being written.
)";

struct Args {
  std::string model = "models/smollm2-135m-instruct";
  std::string prompt;
  bool one_shot = false;
  std::string system;
  int max_new_tokens = 512;
  SamplerOptions sampling{0.7f, 40, 0.9f, 0};
  bool seed_given = false;
  BackendOptions backend;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename Number, typename Parse>
Number parse_number(const std::string& flag, const std::string& text, Parse parse) {
  size_t used = 0;
  Number value{};
  try {
    value = parse(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw UsageError(flag + " expects a number, got '" + text + "'");
  return value;
}

int parse_int(const std::string& flag, const std::string& text) {
  return parse_number<int>(flag, text, [](const std::string& s, size_t* used) { return std::stoi(s, used); });
}

// --prompt and --system are text for the model: checked before any file is read, so
// that bad bytes are reported as the flag's, not after loading a 3 GB model.
std::string utf8_text(const std::string& flag, const std::string& value) {
  if (std::string bad = utf8::invalid_description(flag, value); !bad.empty()) throw UsageError(bad);
  return value;
}

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw UsageError("unknown flag or missing value: " + flag);
    const std::string value = argv[++i];
    if (flag == "--model") {
      args.model = value;
    } else if (flag == "--prompt") {
      args.prompt = utf8_text(flag, value), args.one_shot = true;
    } else if (flag == "--system") {
      args.system = utf8_text(flag, value);
    } else if (flag == "--max-new-tokens") {
      args.max_new_tokens = parse_int(flag, value);
      if (args.max_new_tokens < 1) throw UsageError("--max-new-tokens must be at least 1");
    } else if (flag == "--temperature") {
      // std::stof reads "inf" and "nan": refused here, before a model is loaded.
      args.sampling.temperature =
          parse_number<float>(flag, value, [](const std::string& s, size_t* used) { return std::stof(s, used); });
      if (!(std::isfinite(args.sampling.temperature) && args.sampling.temperature >= 0))
        throw UsageError("--temperature must be a finite number >= 0, got '" + value + "'");
    } else if (flag == "--top-k") {
      args.sampling.top_k = parse_int(flag, value);
      if (args.sampling.top_k < 0) throw UsageError("--top-k must be >= 0 (0 = all), got '" + value + "'");
    } else if (flag == "--top-p") {
      args.sampling.top_p =
          parse_number<float>(flag, value, [](const std::string& s, size_t* used) { return std::stof(s, used); });
      if (!(args.sampling.top_p > 0 && args.sampling.top_p <= 1))  // also false for NaN
        throw UsageError("--top-p must be in (0, 1], got '" + value + "'");
    } else if (flag == "--seed") {
      args.sampling.seed = parse_number<uint64_t>(
          flag, value, [](const std::string& s, size_t* used) { return uint64_t(std::stoull(s, used)); });
      args.seed_given = true;
    } else if (flag == "--device") {
      args.backend.device = value;
    } else if (flag == "--threads") {
      args.backend.threads = parse_int(flag, value);
      if (args.backend.threads < 1) throw UsageError("--threads must be at least 1");
    } else if (flag == "--context") {
      args.backend.context = parse_int(flag, value);
      if (args.backend.context < 1) throw UsageError("--context must be at least 1");
    } else {
      throw UsageError("unknown flag: " + flag);
    }
  }
  if (!args.seed_given) args.sampling.seed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  return args;
}

// Ctrl-C: the first press raises the flag the generation loop polls; a second one
// before the first was handled (e.g. during a long prefill) exits. No SA_RESTART, so
// a Ctrl-C at the input prompt interrupts the read instead of being swallowed.
std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  if (g_interrupted.exchange(true)) _exit(130);
}

void install_sigint_handler() {
  struct sigaction action = {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  sigaction(SIGINT, &action, nullptr);
}

void print_turn_stats(const TurnStats& s) {
  std::fprintf(stderr, "[%d prompt tokens, TTFT %.0f ms | %d tokens, %.1f tokens/s | %s%s]\n", s.prompt_tokens,
               s.ttft_seconds * 1e3, s.generated_tokens, s.tokens_per_second(), to_string(s.stop),
               s.full_reprefill ? " | cache rebuilt" : "");
  if (s.stop == StopReason::kContextFull) {
    std::fprintf(stderr, "The context is full: type /reset to start a new conversation.\n");
  }
}

struct Totals {
  int turns = 0, prompt_tokens = 0, generated_tokens = 0;
  TurnStats last;
};

void print_session_stats(const ChatSession& session, Backend& backend, const Args& args, const Totals& totals) {
  const SamplerOptions& s = args.sampling;
  std::fprintf(stderr,
               "model      %s\n"
               "backend    %s\n"
               "context    %d of %d tokens used\n"
               "turns      %d (%zu messages), %d prompt tokens prefilled, %d tokens generated\n"
               "sampling   temperature %g, top-k %d, top-p %g, seed %llu\n",
               args.model.c_str(), backend.name().c_str(), backend.position(), backend.context_size(), totals.turns,
               session.messages().size(), totals.prompt_tokens, totals.generated_tokens, double(s.temperature),
               s.top_k, double(s.top_p), static_cast<unsigned long long>(s.seed));
  if (totals.turns > 0) {
    std::fprintf(stderr, "last turn  ");
    print_turn_stats(totals.last);
  }
}

// One turn with streaming output. Returns the exit status a one-shot run ends with: 0
// answered, 3 the turn did not fit in the context, 1 it failed. A failed turn leaves
// the conversation as it was before it (ChatSession::reply), so the chat can go on.
int answer(ChatSession& session, const std::string& text, const Args& args, Totals& totals) {
  g_interrupted = false;
  TurnStats stats;
  bool wrote = false;  // part of an answer is on stdout
  try {
    stats = session.reply(text, args.max_new_tokens, [&wrote](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      wrote = true;
    }, &g_interrupted);
  } catch (const std::length_error& e) {
    std::fprintf(stderr, "bielik-chat: %s.\n", e.what());
    std::fprintf(stderr, "Type /reset to start a new conversation, or send something shorter.\n");
    return 3;
  } catch (const std::exception& e) {
    // Text that is not UTF-8 (refused before anything ran), or a failure while the
    // answer was being written: a NaN logit, a token the tokenizer has no text for.
    if (wrote) std::fputc('\n', stdout);
    std::fflush(stdout);
    std::fprintf(stderr, "bielik-chat: %s\n", e.what());
    return 1;
  }
  g_interrupted = false;
  std::fputc('\n', stdout);
  std::fflush(stdout);
  print_turn_stats(stats);
  totals.turns += 1;
  totals.prompt_tokens += stats.prompt_tokens;
  totals.generated_tokens += stats.generated_tokens;
  totals.last = stats;
  return 0;
}

int repl(ChatSession& session, Backend& backend, const Args& args) {
  const bool interactive = isatty(STDIN_FILENO);
  Totals totals;
  for (;;) {
    if (interactive) {
      std::fputs("\n> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {  // Ctrl-C at the prompt: not a way out, say what is
        std::cin.clear();
        clearerr(stdin);
        std::fputs("\n(Ctrl-C stops an answer; /quit or Ctrl-D leaves)\n", stderr);
        continue;
      }
      break;  // end of input
    }
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      session.reset();
      std::fputs("(new conversation)\n", stderr);
      continue;
    }
    if (line == "/stats") {
      print_session_stats(session, backend, args, totals);
      continue;
    }
    if (line == "/help") {
      std::fputs("/reset: new conversation   /stats: timing and context   /quit: leave\n", stderr);
      continue;
    }
    if (line[0] == '/') {
      std::fprintf(stderr, "unknown command %s (try /help)\n", line.c_str());
      continue;
    }
    answer(session, line, args, totals);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bielik-chat: %s\n\n%s", e.what(), kUsage);
    return 2;
  }

  // The device first: "--device cuda" on a machine without one is a flag problem, not a
  // model problem, and is said before any file is read.
  try {
    (void)resolve_device(args.backend.device);  // open_backend resolves "auto" again, model in hand
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bielik-chat: %s\n", e.what());
    return 1;
  }
  if (!std::filesystem::is_directory(args.model)) {
    std::fprintf(stderr,
                 "bielik-chat: model directory '%s' not found.\n"
                 "  SmolLM2 (offline default): make chat   (prepares models/smollm2-135m-instruct)\n"
                 "  Bielik (needs internet):   make chat MODEL=bielik\n",
                 args.model.c_str());
    return 1;
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::unique_ptr<ChatSession> session;
  try {
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_file(args.model + "/tokenizer.json"));
    chat_template = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer_config(args.model + "/tokenizer_config.json"));
    std::string note;
    backend = open_backend(args.model, args.backend, &note);
    if (!note.empty()) std::fprintf(stderr, "bielik-chat: %s\n", note.c_str());
    session = std::make_unique<ChatSession>(*backend, *tokenizer, *chat_template, args.sampling, args.system);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bielik-chat: cannot load the model: %s\n", e.what());
    return 1;
  }
  install_sigint_handler();

  if (args.one_shot) {
    Totals totals;
    return answer(*session, args.prompt, args, totals);
  }
  std::fprintf(stderr, "bielik-chat: %s on %s, context %d tokens. /reset /stats /quit; Ctrl-C stops an answer.\n",
               args.model.c_str(), backend->name().c_str(), backend->context_size());
  try {
    return repl(*session, *backend, args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bielik-chat: error: %s\n", e.what());
    return 1;
  }
}
