// bench_cpu_decode: the CPU backend's prefill and greedy decode on a real checkpoint
// (default: SmolLM2-135M-Instruct from `make models`), against the machine's memory
// read bandwidth measured in the same run.
//
// A decode step reads every weight once (bf16, widened to fp32 in registers), so its
// floor is the checkpoint's bytes over the read bandwidth of all threads together; the
// table gives both and their ratio, for each build of the dot products (portable and
// AVX2 + FMA, cpu_dot.hpp). Each figure is the median of --runs runs.
//
//   bench_cpu_decode [--model DIR] [--threads N] [--prompt-tokens N] [--decode-tokens N] [--runs N]
//
// Without the model folder it says so and exits 0, so that `make bench` on a GPU machine
// (which has no network to prepare it) goes on to the next program.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cpu_dot.hpp"
#include "model_cpu.hpp"
#include "sampler.hpp"
#include "thread_pool.hpp"

using namespace bielik;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Read bandwidth of `threads` threads summing a buffer far larger than the caches, the
// way the decode step reads its weights: each thread its own contiguous range.
double read_bandwidth_gbs(ThreadPool& pool, size_t bytes, int runs) {
  std::vector<uint64_t> buffer(bytes / 8);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = i * 0x9E3779B97F4A7C15ull;  // touch every page
  std::vector<double> times;
  std::atomic<uint64_t> checksum{0};  // consumed below, so the reads cannot be optimized away
  for (int run = 0; run < runs; ++run) {
    const auto start = Clock::now();
    pool.parallel_for(int64_t(buffer.size()), [&](int64_t begin, int64_t end) {
      uint64_t acc[4] = {0, 0, 0, 0};
      int64_t i = begin;
      for (; i + 4 <= end; i += 4)
        for (int j = 0; j < 4; ++j) acc[j] += buffer[size_t(i + j)];
      for (; i < end; ++i) acc[0] += buffer[size_t(i)];
      checksum += acc[0] + acc[1] + acc[2] + acc[3];
    });
    times.push_back(seconds_since(start));
  }
  if (checksum.load() == 42) std::printf(" ");
  return double(bytes) / median(times) / 1e9;
}

int int_flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

std::string string_flag(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = string_flag(argc, argv, "--model", BIELIK_SOURCE_DIR "/models/smollm2-135m-instruct");
  const int threads = int_flag(argc, argv, "--threads", 0);
  const int prompt_tokens = int_flag(argc, argv, "--prompt-tokens", 16);
  const int decode_tokens = int_flag(argc, argv, "--decode-tokens", 64);
  const int runs = std::max(1, int_flag(argc, argv, "--runs", 3));
  std::ifstream weights_file(dir + "/model.safetensors", std::ios::binary | std::ios::ate);
  if (!weights_file) {
    std::printf("bench_cpu_decode: no %s/model.safetensors (run `make models`): skipped\n", dir.c_str());
    return 0;
  }
  const double weight_bytes = double(weights_file.tellg());  // the header is a few KB of it

  CpuModel model(dir, CpuModelOptions{threads, prompt_tokens + decode_tokens + 1});
  const int V = model.config().vocab_size;
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
  for (int i = 0; i < prompt_tokens; ++i) prompt[size_t(i)] = int32_t((1000 + 37 * i) % V);  // any ids do

  const int used_threads = threads > 0 ? threads : std::max(1, int(std::thread::hardware_concurrency()));
  std::printf("model %s, %d threads, %d prompt tokens, %d decode tokens, median of %d runs\n", dir.c_str(),
              used_threads, prompt_tokens, decode_tokens, runs);
  std::printf("| dot products | TTFT ms | tokens/s | ms/token | weights GB/s | %% of read bandwidth |\n"
              "|---|---|---|---|---|---|\n");

  // Both builds of the dot products (cpu_dot.hpp) in one run, the portable one first.
  ThreadPool pool(used_threads);
  double read_gbs = 0.0;
  for (const bool simd : {false, true}) {
    if (simd && !cpu_has_avx2_fma()) {
      std::printf("| AVX2 + FMA | (this CPU has no AVX2 + FMA) | | | | |\n");
      continue;
    }
    set_cpu_simd(simd);
    std::vector<double> prefill_s, decode_s;
    for (int run = 0; run < runs; ++run) {
      model.reset();
      auto start = Clock::now();
      std::vector<float> logits = model.prefill(prompt);
      prefill_s.push_back(seconds_since(start));
      start = Clock::now();
      for (int step = 0; step < decode_tokens; ++step) logits = model.decode(argmax(logits.data(), V));
      decode_s.push_back(seconds_since(start));
    }
    // The bandwidth baseline between the two, so that both see the same machine state.
    if (read_gbs == 0.0) read_gbs = read_bandwidth_gbs(pool, size_t(512) << 20, runs + 2);
    const double step_s = median(decode_s) / decode_tokens;
    const double weight_gbs = weight_bytes / step_s / 1e9;
    std::printf("| %s | %.1f | %.1f | %.2f | %.2f | %.0f%% |\n", simd ? "AVX2 + FMA" : "portable",
                median(prefill_s) * 1e3, 1.0 / step_s, step_s * 1e3, weight_gbs, 100.0 * weight_gbs / read_gbs);
  }
  set_cpu_simd(true);
  std::printf("read bandwidth (%d threads summing 512 MiB): %.2f GB/s; weights %.0f MB a token\n", used_threads,
              read_gbs, weight_bytes / 1e6);
  return 0;
}
