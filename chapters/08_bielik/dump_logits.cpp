// dump_logits: run a prompt of token ids through a backend and save every position's
// logits as .npy, so scripts/compare_hf_logits.py can check them against HF
// transformers on the same checkpoint (issue: "logits within bf16 tolerance of HF
// transformers for a full-size Bielik-shaped checkpoint").
//
//   dump_logits --model DIR --device cpu|cuda --tokens 5,17,923,... --out logits.npy
//
// Writes (T, V) float32. Errors (missing model, bad ids, a prompt beyond the context)
// print one line naming the problem and exit 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "model_cpu.hpp"
#include "model_cuda.hpp"
#include "npy.hpp"

using namespace bielik;

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long long value = -1;  // std::stoll's own errors say only "stoll": ours name the item
    try {
      value = std::stoll(item, &used);
    } catch (const std::out_of_range&) {  // digits, but past 64 bits: refused as an id below
      used = item.size();
    } catch (const std::invalid_argument&) {
      used = 0;
    }
    if (used == 0 || used != item.size()) throw std::invalid_argument("--tokens: '" + item + "' is not an integer");
    // A cast would wrap 4294967301 to 5, a valid id: ids are checked against the
    // vocabulary by the backend, but only after they are int32.
    if (value < 0 || value > INT32_MAX)
      throw std::invalid_argument("--tokens: '" + item + "' is not a token id (0 to 2147483647)");
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty()) throw std::invalid_argument("--tokens: no ids given");
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, device = "cuda", tokens, out;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model_dir = value;
    else if (flag == "--device") device = value;
    else if (flag == "--tokens") tokens = value;
    else if (flag == "--out") out = value;
    else {
      std::fprintf(stderr, "dump_logits: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (model_dir.empty() || tokens.empty() || out.empty()) {
    std::fprintf(stderr, "usage: dump_logits --model DIR --device cpu|cuda --tokens 1,2,3 --out logits.npy\n");
    return 2;
  }
  try {
    std::vector<int32_t> ids = parse_ids(tokens);
    const int context = static_cast<int>(ids.size());
    std::unique_ptr<Backend> backend;
    if (device == "cpu") {
      CpuModelOptions options;
      options.max_context = context;
      backend = std::make_unique<CpuModel>(model_dir, options);
    } else if (device == "cuda") {
      backend = make_cuda_backend(model_dir, context);
    } else {
      throw std::invalid_argument("--device must be cpu or cuda, got '" + device + "'");
    }
    std::vector<float> logits = backend->prefill(ids, Logits::kAll);
    const size_t V = static_cast<size_t>(backend->config().vocab_size);
    save_npy(out, "<f4", {ids.size(), V}, logits.data(), logits.size() * sizeof(float));
    std::printf("dump_logits: %s, %zu tokens -> %s (%zu x %zu)\n", backend->name().c_str(), ids.size(), out.c_str(),
                ids.size(), V);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dump_logits: %s\n", error.what());
    return 1;
  }
  return 0;
}
