// bench_layer_chain: how fast can a decode step of this SHAPE be, whatever its kernels
// compute? The ceiling of "five dependent launches a layer", measured.
//
// The decode step (model_cuda.cu) is a CUDA graph of dependent kernels joined by PDL:
// per layer QKV + RoPE + append, the attention, O + residual, gate/up + SwiGLU, down +
// residual, then the lm_head: 161 launches a token for Bielik's 32 layers. Each GEMV
// asks for its weights before its griddepcontrol.wait and computes after it. Thirty-two
// sessions of tuning left it at ~74% of the copy-bandwidth floor, and the open question
// (issue 7's target is 85%) is whether the kernels or the chain's shape is what stops it.
//
// This program answers it with kernels that do nothing but the chain: every launch
// reads exactly the bytes its kernel in the step reads (Bielik's weights but the
// embedding table, 3.10 GB, from one buffer laid out in the step's order, so nothing is
// in L2 when it is read), issues all of its loads before its griddepcontrol.wait, as the
// GEMVs do, lets the next launch be scheduled at its start, as they do, then passes the
// dependency on (each block reads two values the previous launch wrote and writes their
// minimum + 1). No dot products, no reductions, no epilogue, no attention math: what is
// left is the bytes, the launches, and the boundaries between them.
//
// The tables:
//  * layer_chain: the step's shape; the same weights in fewer launches a layer, down to
//    one a layer and one a token; the step's shape in stream order (no PDL); and the
//    step's shape with work added after some waits, in two stand-ins: a spin on the
//    global timer (latency that touches no memory) and a chain of dependent loads by one
//    thread of every block (latency made of memory round trips, as staging an input or
//    reading q is), from a 64 KB table that stays in L2 or a 512 MB one in HBM; last,
//    the step's activations moved as its kernels move them (every block reading its
//    launch's whole input, a block barrier and a block-wide sum, its share of the output
//    stored: x, q / k / v, the attention's output, gate/up's 17.5 KB, the logits), alone
//    and with the attention's round trips and a spin for the dot products added.
//  * layer_chain_marginal: the step's shape with one launch left out of every layer, to
//    set beside bench_model's model_decode_marginal (the real kernels left out).
//
// The first rows are a ceiling, not a model of the step: a step shaped like one of them
// cannot be faster than it (give or take the noise of one run), however good its kernels.
// What the H200 said is in DECODE_LOG.md (thirty-seventh session) and
// bench_layer_chain_h200.txt.
//
// Every chain is first run once on a stream from zeroed values and checked: the last
// launch's values must equal the number of launches, so a launch that read before the
// previous one had finished would show (the program then exits with 1).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "pdl.cuh"
#include "step_bytes.hpp"

namespace {

using namespace bielik;
using namespace bielik::step_bytes;

constexpr int kThreads = 256;
constexpr int kLoads = 16;                                        // 16-byte loads a thread, all before the wait
constexpr size_t kBlockBytes = size_t(kThreads) * kLoads * 16;  // 64 KB a block
constexpr int kTokensPerGraph = 4;                                // as the decode step's graphs

// The attention reads the KV cache: 2 kv heads x (k, v) x 128 x 2 bytes a position. Its
// launch has the step's 48 blocks (12 query heads x clusters of 4) and one 16-byte load a
// thread: 192 positions' worth (the benchmark's cache grows from 16 to 272).
constexpr int kAttentionBlocks = 48;
constexpr size_t kAttentionBytes = size_t(kAttentionBlocks) * kThreads * 16;  // 196 KB

struct StageParams {
  const uint4* weights;  // (gridDim.x * kThreads * loads) this launch's bytes
  int loads;             // 16-byte loads a thread, <= kLoads
  const float* in;       // (in_count) what the previous launch wrote
  int in_count;
  float* out;   // (gridDim.x) this launch's values
  float* sink;  // written only if the weights XOR to a value they never do: keeps the loads alive
  // The activations, as the real kernels move them after their wait: every block reads
  // all of `input` (input_chunks 16-byte chunks the previous launch wrote), meets the
  // block at a barrier and sums a word of it across the block (the staging of a GEMV's
  // input and its RMSNorm's sum), and stores its share of `output` (output_chunks).
  const uint4* input;
  int input_chunks;
  uint4* output;
  int output_chunks;
  unsigned hold_ns;  // work after the wait, modelled as a spin on the global timer (0: none)
  // Or modelled as memory round trips: `chase_steps` dependent loads by thread 0, each
  // reading the index of the next, through `chase` (chase_entries indices; a small table
  // stays in L2, a large one is read from HBM), starting at `chase_start` + the block.
  const unsigned* chase;
  unsigned chase_entries;
  unsigned chase_start;
  int chase_steps;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads, 3) read_stage_kernel(StageParams p) {
  pdl_allow_dependents();  // as the step's kernels: the next launch may be scheduled now
  uint4 held[kLoads];
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    // Thread-contiguous chunks of kLoads x 16 bytes would make a warp's load touch 32
    // lines; load u of the block instead covers one contiguous 4 KB: 32 lanes x 16 bytes
    // x 8 warps, as a GEMV's warps read a row.
    const size_t index = (size_t(blockIdx.x) * p.loads + u) * kThreads + threadIdx.x;
    held[u] = u < p.loads ? __ldcs(p.weights + index) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();  // the dependency: the previous launch has finished and its writes are visible
  // The weights are folded into one word now, so that the staging below has registers;
  // a block cannot end before its loads have landed anyway.
  unsigned bits = 0;
#pragma unroll
  for (int u = 0; u < kLoads; ++u) bits ^= held[u].x ^ held[u].y ^ held[u].z ^ held[u].w;
  unsigned staged = 0;
  if (p.input_chunks > 0) {
    __shared__ unsigned block_sum;
    if (threadIdx.x == 0) block_sum = 0;
    for (int c = int(threadIdx.x); c < p.input_chunks; c += kThreads) {
      const uint4 v = __ldcg(p.input + c);
      staged ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();  // the input is in (and block_sum is zeroed)
    atomicXor(&block_sum, staged);
    __syncthreads();  // the block's sum is complete
    staged = block_sum;
  }
  if (p.hold_ns != 0) {  // a stand-in for work that needs the previous launch's output
    const unsigned long long until = global_ns() + p.hold_ns;
    while (global_ns() < until) {
    }
  }
  if (p.chase_steps > 0) {  // the block waits for its thread 0's chain of loads
    __shared__ unsigned chased;
    if (threadIdx.x == 0) {
      unsigned index = (p.chase_start + blockIdx.x * 4099u) % p.chase_entries;
      for (int step = 0; step < p.chase_steps; ++step) index = __ldcg(p.chase + index);
      chased = index;
    }
    __syncthreads();
    if (chased == 0xffffffffu) *p.sink = 1.0f;  // never: every entry is an index < chase_entries
  }
  if (p.output_chunks > 0) {  // this block's share of the output
    const int per_block = (p.output_chunks + int(gridDim.x) - 1) / int(gridDim.x);
    for (int c = int(threadIdx.x); c < per_block; c += kThreads) {
      const int chunk = int(blockIdx.x) * per_block + c;
      if (chunk < p.output_chunks) p.output[chunk] = make_uint4(staged, staged, staged, staged);
    }
  }
  if (threadIdx.x == 0) {
    const int b = int(blockIdx.x);
    p.out[b] = fminf(__ldcg(p.in + b % p.in_count), __ldcg(p.in + (b + 1) % p.in_count)) + 1.0f;
  }
  if (bits == 0x7fc00001u) *p.sink = 1.0f;  // never true for the zeroed weights
}

/// One launch of a chain: `bytes` read by ceil(bytes / 64 KB) blocks, or by `blocks`
/// blocks of as many loads a thread as the bytes need (the attention's 48 blocks).
struct Stage {
  size_t bytes;
  int blocks;            // 0: bytes / 64 KB, rounded up
  unsigned hold_ns = 0;   // StageParams::hold_ns
  int chase_steps = 0;    // StageParams::chase_steps
  bool chase_hbm = false;  // through the large table (HBM) instead of the small one (L2)
  int input_chunks = 0;   // StageParams::input_chunks
  int output_chunks = 0;  // StageParams::output_chunks
  int loads() const {
    const size_t per_load = size_t(blocks) * kThreads * 16;  // one load of every thread
    return blocks == 0 ? kLoads : int((bytes + per_load - 1) / per_load);
  }
  int grid() const { return blocks == 0 ? int((bytes + kBlockBytes - 1) / kBlockBytes) : blocks; }
  size_t read_bytes() const { return size_t(grid()) * kThreads * loads() * 16; }
};

Stage weights(size_t bytes) { return Stage{bytes, 0}; }

struct Structure {
  std::string name;
  std::vector<Stage> layer;  // the launches of one layer, in order
};

/// The token's launches: `kLayers` copies of the layer, then the lm_head's.
std::vector<Stage> token_of(const Structure& s) {
  std::vector<Stage> token;
  for (int l = 0; l < kLayers; ++l) token.insert(token.end(), s.layer.begin(), s.layer.end());
  Stage lm_head = weights(kLmHeadBytes);
  if (!s.layer.empty() && s.layer.front().input_chunks > 0) {  // the rows that move activations
    lm_head.input_chunks = kX;
    lm_head.output_chunks = kLogits;
  }
  token.push_back(lm_head);
  return token;
}

/// Indices for the dependent-load chains: entry i holds the next index, 4128 entries
/// (16 KB and one 128-byte line) ahead, so that every step lands on a line of its own,
/// far from the last.
struct ChaseTable {
  DeviceBuffer<unsigned> entries;
  explicit ChaseTable(size_t count) : entries(count) {
    std::vector<unsigned> next(count);
    for (size_t i = 0; i < count; ++i) next[i] = unsigned((i + 4096 + 32) % count);
    entries.copy_from_host(next);
  }
};

class Chain {
 public:
  Chain(const std::vector<Stage>& token, const DeviceBuffer<uint4>& weights, bool pdl, const ChaseTable* chase_l2,
        const ChaseTable* chase_hbm)
      : token_(token), pdl_(pdl), chase_l2_(chase_l2), chase_hbm_(chase_hbm) {
    size_t offset = 0;  // in uint4s: each launch its own bytes, in the step's order
    int widest = 1;
    for (const Stage& s : token_) {
      offsets_.push_back(offset);
      offset += s.read_bytes() / 16;
      widest = std::max(widest, s.grid());
    }
    if (offset > weights.size()) throw std::runtime_error("bench_layer_chain: the weight buffer is too small");
    base_ = weights.data();
    values_[0] = DeviceBuffer<float>(size_t(widest));
    values_[1] = DeviceBuffer<float>(size_t(widest));
    size_t chunks = 1;
    for (const Stage& s : token_) chunks = std::max(chunks, size_t(std::max(s.input_chunks, s.output_chunks)));
    for (DeviceBuffer<uint4>& a : activations_) {
      a = DeviceBuffer<uint4>(chunks);
      CUDA_CHECK(cudaMemset(a.data(), 0, chunks * sizeof(uint4)));
    }
  }

  int launches_per_token() const { return int(token_.size()); }

  double bytes_per_token() const {
    double bytes = 0;
    for (const Stage& s : token_) bytes += double(s.read_bytes());
    return bytes;
  }

  /// Launch i of the whole sequence (token i / launches, stage i % launches).
  void enqueue(int i, cudaStream_t stream) {
    const int n = launches_per_token();
    const Stage& s = token_[size_t(i % n)];
    const Stage& previous = token_[size_t((i + n - 1) % n)];
    StageParams p;
    p.weights = base_ + offsets_[size_t(i % n)];
    p.loads = s.loads();
    p.in = values_[i % 2].data();
    p.in_count = i == 0 ? 1 : previous.grid();
    p.out = values_[(i + 1) % 2].data();
    p.sink = sink_.data();
    p.input = activations_[i % 2].data();
    p.input_chunks = s.input_chunks;
    p.output = activations_[(i + 1) % 2].data();
    p.output_chunks = s.output_chunks;
    p.hold_ns = s.hold_ns;
    const ChaseTable& table = s.chase_hbm ? *chase_hbm_ : *chase_l2_;
    p.chase = table.entries.data();
    p.chase_entries = unsigned(table.entries.size());
    p.chase_start = unsigned(i) * 7919u;  // each launch its own lines
    p.chase_steps = s.chase_steps;
    launch_kernel(pdl_, read_stage_kernel, dim3(s.grid()), dim3(kThreads), 0, stream, p);
  }

  /// One token's chain on a stream from zeroed values; true when every value of the last
  /// launch equals the number of launches (no launch read a value before it was written).
  bool check() {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMemsetAsync(values_[0].data(), 0, values_[0].size() * sizeof(float), stream));
    const int n = launches_per_token();
    for (int i = 0; i < n; ++i) enqueue(i, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaStreamDestroy(stream));
    const std::vector<float> last = values_[n % 2].to_host();
    const int grid = token_.back().grid();
    for (int b = 0; b < grid; ++b) {
      if (last[size_t(b)] != float(n)) return false;
    }
    return true;
  }

 private:
  std::vector<Stage> token_;
  bool pdl_;
  const ChaseTable* chase_l2_;
  const ChaseTable* chase_hbm_;
  std::vector<size_t> offsets_;
  const uint4* base_ = nullptr;
  DeviceBuffer<float> values_[2];
  DeviceBuffer<uint4> activations_[2];  // launch i reads [i % 2], writes [(i + 1) % 2]
  DeviceBuffer<float> sink_{1};
};

}  // namespace

int main(int argc, char** argv) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("bench_layer_chain: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  int rounds = 5;  // each structure measured once a round, the rounds interleaved
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--rounds" && a + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++a]));
    } else {
      std::fprintf(stderr, "usage: bench_layer_chain [--rounds N]\n");
      return 2;
    }
  }
  const Stage qkv = weights(kQkvBytes), attention{kAttentionBytes, kAttentionBlocks}, o = weights(kOBytes);
  const Stage gate_up = weights(kGateUpBytes), down = weights(kDownBytes);
  const std::vector<Stage> step_layer = {qkv, attention, o, gate_up, down};
  // The step's layer with work added after the attention's wait (step_layer[1]).
  auto attention_holding = [&](unsigned ns) {
    std::vector<Stage> layer = step_layer;
    layer[1].hold_ns = ns;
    return layer;
  };
  auto attention_chasing = [&](int steps, bool hbm) {
    std::vector<Stage> layer = step_layer;
    layer[1].chase_steps = steps;
    layer[1].chase_hbm = hbm;
    return layer;
  };
  // Every launch of the layer making its own count of dependent L2 reads after its wait
  // (QKV, attention, O, gate/up, down): a model of the round trips the real kernels make
  // there (staging the input, q and the new key, the merge, the epilogue's stores).
  auto with_reads = [&](std::vector<int> reads) {
    std::vector<Stage> layer = step_layer;
    for (size_t k = 0; k < layer.size(); ++k) layer[k].chase_steps = reads[k];
    return layer;
  };
  const Stage attention_o = weights(kAttentionBytes + kOBytes), mlp = weights(kGateUpBytes + kDownBytes);
  const Stage qkv_attention_o = weights(kQkvBytes + kAttentionBytes + kOBytes);
  // `moving`: which of the five launches move theirs (QKV, attention, O, gate/up, down).
  auto with_activations = [&](unsigned spin_ns, int attention_reads,
                              std::vector<bool> moving = {true, true, true, true, true}) {
    std::vector<Stage> layer = step_layer;
    const int inputs[] = {kX, kHeadInputs, kX, kX, kF}, outputs[] = {kQkv, kX, kX, kF, kX};
    for (size_t k = 0; k < layer.size(); ++k) {
      if (!moving[k]) continue;
      layer[k].input_chunks = inputs[k];
      layer[k].output_chunks = outputs[k];
      layer[k].hold_ns = spin_ns;
    }
    layer[1].chase_steps = attention_reads;
    return layer;
  };
  const std::vector<Structure> structures = {
      {"the step's: QKV | attention | O | gate/up | down", step_layer},
      {"attention + O in one: QKV | attention+O | gate/up | down", {qkv, attention_o, gate_up, down}},
      {"QKV | attention | O | gate/up+down (the MLP in one)", {qkv, attention, o, mlp}},
      {"QKV+attention+O | gate/up | down", {qkv_attention_o, gate_up, down}},
      {"QKV+attention+O | gate/up+down", {qkv_attention_o, mlp}},
      {"a layer in one launch", {weights(qkv_attention_o.bytes + mlp.bytes)}},
      {"the step's, the attention holding 1 us after its wait", attention_holding(1000)},
      {"the step's, the attention holding 2 us after its wait", attention_holding(2000)},
      {"the step's, the attention holding 3 us after its wait", attention_holding(3000)},
      {"the step's, the attention making 4 dependent L2 reads after its wait", attention_chasing(4, false)},
      {"the step's, the attention making 8 dependent L2 reads after its wait", attention_chasing(8, false)},
      {"the step's, the attention making 2 dependent HBM reads after its wait", attention_chasing(2, true)},
      {"the step's, the attention making 4 dependent HBM reads after its wait", attention_chasing(4, true)},
      {"the step's, dependent L2 reads after the wait: QKV 2, attention 4, O 2", with_reads({2, 4, 2, 0, 0})},
      {"the step's, dependent L2 reads after the wait: QKV 2, attention 4, O 2, gate/up 2, down 2",
       with_reads({2, 4, 2, 2, 2})},
      {"the step's, dependent L2 reads after the wait: QKV 3, attention 6, O 3", with_reads({3, 6, 3, 0, 0})},
      {"the step's, every launch staging its input and storing its output", with_activations(0, 0)},
      {"the step's, QKV, the attention and O staging and storing theirs",
       with_activations(0, 0, {true, true, true, false, false})},
      {"the step's, gate/up and down staging and storing theirs",
       with_activations(0, 0, {false, false, false, true, true})},
      {"every launch staging and storing, the attention making 4 dependent L2 reads",
       with_activations(0, 4)},
      {"the same, every launch spinning 0.5 us after its staging (its dots)", with_activations(500, 4)},
  };
  // The step's layer with one launch left out: what that launch costs in this chain, to
  // set beside bench_model's model_decode_marginal table (the real kernels left out).
  const char* stage_names[] = {"QKV", "attention", "O", "gate/up", "down"};
  std::vector<Structure> left_out;
  for (size_t k = 0; k < step_layer.size(); ++k) {
    std::vector<Stage> layer = step_layer;
    layer.erase(layer.begin() + std::ptrdiff_t(k));
    left_out.push_back({std::string("the step's without ") + stage_names[k], layer});
  }

  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s; PDL %s\n", describe_device().c_str(), copy_gbs,
              device_supports_pdl() ? "yes" : "no (every chain runs in stream order)");

  // One buffer for the whole token's bytes (and the largest single launch below).
  const std::vector<Stage> step_token = token_of(structures[0]);
  size_t token_bytes = 0;
  for (const Stage& s : step_token) token_bytes += s.read_bytes();
  DeviceBuffer<uint4> weight_buffer(token_bytes / 16 + (size_t(64) << 20) / 16);
  CUDA_CHECK(cudaMemset(weight_buffer.data(), 0, weight_buffer.size() * sizeof(uint4)));
  std::printf("one token reads %.3f GB; %d launches of %d threads x %d loads of 16 bytes = 64 KB a block\n",
              double(token_bytes) / 1e9, int(step_token.size()), kThreads, kLoads);

  struct Row {
    std::string name;
    int launches;
    double bytes;
    bool ok;
    std::vector<double> us;  // per token, one a round
    double median() const {
      std::vector<double> sorted = us;
      std::sort(sorted.begin(), sorted.end());
      return sorted[sorted.size() / 2];
    }
  };
  // The dependent reads' tables, and what one read takes with nothing else running: a
  // chain of 64 in one thread, timed alone (the L2 table after a first pass has
  // brought it in; the HBM table's 512 MB cannot stay).
  const ChaseTable chase_l2(size_t(16) << 10), chase_hbm(size_t(128) << 20);
  std::vector<Row> rows;
  std::vector<Chain> chains;
  auto add = [&](const std::string& name, const std::vector<Stage>& token, bool pdl) {
    chains.emplace_back(token, weight_buffer, pdl, &chase_l2, &chase_hbm);
    rows.push_back({name, chains.back().launches_per_token(), chains.back().bytes_per_token(), false, {}});
  };
  for (const Structure& s : structures) add(s.name, token_of(s), true);
  // The step's shape without PDL: each launch starts when the previous one has ended.
  add(structures[0].name + ", stream order (no PDL)", token_of(structures[0]), false);
  // The whole token's bytes in one launch: the read itself, with no boundary at all.
  add("the whole token in one launch", {weights(token_bytes)}, true);
  const size_t first_left_out = chains.size();
  for (const Structure& s : left_out) add(s.name, token_of(s), true);

  for (size_t c = 0; c < chains.size(); ++c) rows[c].ok = chains[c].check();
  double unloaded_ns[2] = {0, 0};  // one dependent read alone: L2, HBM
  for (int hbm = 0; hbm < 2; ++hbm) {
    Stage alone{0, 1};
    alone.chase_steps = 64;
    alone.chase_hbm = hbm == 1;
    Chain chain({alone}, weight_buffer, false, &chase_l2, &chase_hbm);
    int launch = 0;
    const BenchTiming t = time_gpu([&] { chain.enqueue(launch++, nullptr); }, BenchOptions{3, 20, false});
    unloaded_ns[hbm] = t.median_ms * 1e6 / 64;
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t c = 0; c < chains.size(); ++c) {
      const int per_token = chains[c].launches_per_token();
      const BenchTiming t = time_gpu_graph([&](int i, cudaStream_t s) { chains[c].enqueue(i, s); },
                                           per_token * kTokensPerGraph, 10);
      rows[c].us.push_back(t.median_ms * 1e3 * per_token);
    }
  }

  BenchTable table("layer_chain",
                   {"launches a layer (a token)", "us a token (median of rounds)", "min / max", "tokens/s",
                    "% of copy-BW floor", "us a boundary beyond the bytes", "check"});
  for (size_t c = 0; c < first_left_out; ++c) {
    const Row& row = rows[c];
    const double median = row.median();
    const double floor_us = row.bytes / (copy_gbs * 1e9) * 1e6;
    table.add_row({row.name + " (" + std::to_string(row.launches) + ")", fmt(median, 1),
                   fmt(*std::min_element(row.us.begin(), row.us.end()), 1) + " / " +
                       fmt(*std::max_element(row.us.begin(), row.us.end()), 1),
                   fmt(1e6 / median, 0), fmt(100.0 * floor_us / median, 1),
                   fmt((median - floor_us) / row.launches, 2), row.ok ? "ok" : "stale read"});
  }
  table.print();
  std::printf("one dependent read with nothing else running (64 in a row, one launch, launch time included): "
              "%.0f ns from the L2 table, %.0f ns from the HBM table\n", unloaded_ns[0], unloaded_ns[1]);
  std::printf("floor at this copy bandwidth: %.1f us a token = %.0f tokens/s; "
              "issue 7's target 1150 tokens/s = %.1f us\n",
              double(token_bytes) / (copy_gbs * 1e9) * 1e6, copy_gbs * 1e9 / double(token_bytes), 1e6 / 1150.0);

  BenchTable marginal("layer_chain_marginal", {"left out of every layer", "us a token", "tokens/s",
                                               "it costs, us a layer", "its bytes at copy BW, us a layer", "check"});
  const double full_us = rows[0].median();
  for (size_t k = 0; k < left_out.size(); ++k) {
    const Row& row = rows[first_left_out + k];
    const double median = row.median();
    const double stage_bytes = double(step_layer[k].read_bytes());
    marginal.add_row({stage_names[k], fmt(median, 1), fmt(1e6 / median, 0), fmt((full_us - median) / kLayers, 2),
                      fmt(stage_bytes / (copy_gbs * 1e9) * 1e6, 2), row.ok ? "ok" : "stale read"});
  }
  marginal.print();
  bool all_ok = true;
  for (const Row& row : rows) all_ok = all_ok && row.ok;
  return all_ok ? 0 : 1;
}
