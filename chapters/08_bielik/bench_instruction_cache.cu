// bench_instruction_cache: what COLD code costs a kernel in a chain of dependent PDL
// launches.
//
// The decode step runs five different kernels a layer, one after the other, on every
// SM. Each is 30-45 KB of SASS (heavily unrolled). An SM's instruction caches are not
// known to hold five of them, so each kernel may find its code evicted by the previous
// ones and fetch it from L2 (or HBM) while the weights stream through the same memory
// system. The decode timeline has microseconds no arithmetic or load explains: chapter
// 07's v5 attention takes up to 3.5 us for 16 keys after its griddepcontrol.wait
// returns. This benchmark asks whether instruction fetch is where they go.
//
// A chain of kChain PDL launches in a graph, one block of 128 threads (one warp per SM
// sub-partition) per SM, or three. Each block optionally streams `loads` 16-byte
// weight-like loads per thread before its wait (as the decode GEMVs do), then reads the
// value the previous launch wrote and runs kFmas FMAs over a ring of 16 accumulators.
// The code comes in two forms:
//
//  * straight: the FMAs fully unrolled, one 16-byte instruction each (2048 FMAs: ~32 KB
//    of code, 512 FMAs: ~8 KB). Each of the 8 salts has its own constants, so its code
//    is a distinct blob of the same size.
//  * looped: the same FMAs in a loop of ~400 bytes.
// Every kernel also has ~4.5 KB of loads, checks and stores around the FMAs (sm_90).
//
// And three chains: one kernel repeated (its code is warm after the first launch), the
// 8 salted kernels in rotation (8 x 32 KB, more than the caches hold, so every launch
// starts cold), and the looped kernels in rotation (plus one looped kernel repeated, its
// baseline). How to read it: (8 in rotation) - (one repeated) is what cold code costs a
// launch; for the looped kernels that difference should be ~0. Each chain is first run
// once on a stream and checked (every value must equal the chain length).
#include <cuda_runtime.h>

#include <array>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "pdl.cuh"

namespace {

using namespace bielik;

constexpr int kThreads = 128;
constexpr int kChain = 64;     // launches in one graph
constexpr int kMaxLoads = 18;  // 16-byte loads a thread may issue before the dependency
constexpr int kSalts = 8;      // distinct kernels of each code shape
constexpr int kAccumulators = 16;

struct CodeParams {
  const float* in;       // (blocks) what the previous launch wrote
  float* out;            // (blocks) this launch's values
  const uint4* weights;  // (blocks * kThreads * loads) this launch's independent bytes
  int loads;             // 16-byte loads per thread before the dependency, <= kMaxLoads
  float* sink;           // written only if the results are impossible: keeps the work alive
};

// k * 2^-23: exact, distinct for every (salt, FMA), and below 0.004.
__host__ __device__ constexpr float multiplier(int salt, int i) {
  return float(1 + salt * 4096 + i) * 1.1920928955078125e-7f;
}

// One FMA of the work: acc[j] = acc[j] * m + acc[j + 1], around a ring of 16. Each chain
// needs its neighbour's previous step, so the compiler must interleave the 16 chains
// (left independent, it runs one chain to its end before the next: a dependent FMA
// every 4 cycles). With m < 0.004 the values grow by at most 1.004 a step: finite.
__device__ __forceinline__ void ring_fma(float (&acc)[kAccumulators], int j, float m) {
  acc[j] = fmaf(acc[j], m, acc[(j + 1) % kAccumulators]);
}

template <int kSalt, bool kStraight, int kFmas>
__global__ void __launch_bounds__(kThreads) code_kernel(CodeParams p) {
  pdl_allow_dependents();
  uint4 held[kMaxLoads];
  const size_t thread = size_t(blockIdx.x) * kThreads + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kMaxLoads; ++u) {
    held[u] = u < p.loads ? __ldcs(p.weights + thread * p.loads + u) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  const float x = __ldcg(p.in + blockIdx.x);

  float acc[kAccumulators];
#pragma unroll
  for (int j = 0; j < kAccumulators; ++j) acc[j] = x + float(j);
  if constexpr (kStraight) {
    // Every FMA its own instruction with its own immediate: ~16 bytes of code each.
#pragma unroll
    for (int i = 0; i < kFmas; ++i) ring_fma(acc, i % kAccumulators, multiplier(kSalt, i));
  } else {
#pragma unroll 1
    for (int i = 0; i < kFmas; i += kAccumulators) {
      const float m = multiplier(kSalt, i);  // computed at run time: one loop body
#pragma unroll
      for (int j = 0; j < kAccumulators; ++j) ring_fma(acc, j, m);
    }
  }

  if (threadIdx.x == 0) p.out[blockIdx.x] = x + 1.0f;
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kAccumulators; ++j) sum += acc[j];
  // The held weights meet the result, as a GEMV's would. Float FMAs cannot be
  // reassociated, so the compiler cannot fold the weights (an XOR) before the work,
  // which would wait for the loads there; they stay in registers until the end.
  float4 dot = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int u = 0; u < kMaxLoads; ++u) {
    dot.x = fmaf(__uint_as_float(held[u].x), sum, dot.x);
    dot.y = fmaf(__uint_as_float(held[u].y), sum, dot.y);
    dot.z = fmaf(__uint_as_float(held[u].z), sum, dot.z);
    dot.w = fmaf(__uint_as_float(held[u].w), sum, dot.w);
  }
  sum += dot.x + dot.y + dot.z + dot.w;
  if (sum != sum) *p.sink = sum;  // never true: the sums are finite and the weights zero
}

// The 24 kernels: shape 0 straight 2048 FMAs, 1 straight 512, 2 looped 2048; 8 salts each.
using Kernel = void (*)(CodeParams);
constexpr int kShapes = 3;
constexpr bool straight_of(int shape) { return shape != 2; }
constexpr int fmas_of(int shape) { return shape == 1 ? 512 : 2048; }

template <size_t... k>
std::array<Kernel, sizeof...(k)> make_kernels(std::index_sequence<k...>) {
  return {&code_kernel<int(k % kSalts), straight_of(int(k / kSalts)), fmas_of(int(k / kSalts))>...};
}

Kernel kernel_for(int shape, int salt) {
  static const auto kernels = make_kernels(std::make_index_sequence<kShapes * kSalts>());
  return kernels[shape * kSalts + salt];
}

struct Chain {
  int shape;
  int rotation;  // 1: salt 0 every launch; kSalts: launch i runs salt i % kSalts
};

void enqueue_launch(int i, const Chain& chain, int blocks, int loads, DeviceBuffer<float>* values,
                    const DeviceBuffer<uint4>& weights, DeviceBuffer<float>& sink, cudaStream_t stream) {
  // Each launch reads its own slice of the weights; the slices rotate over more than L2.
  const size_t slice = size_t(blocks) * kThreads * size_t(loads);
  const size_t offset = slice == 0 ? 0 : (size_t(i) % (weights.size() / slice)) * slice;
  const CodeParams p{values[i % 2].data(), values[(i + 1) % 2].data(), weights.data() + offset, loads, sink.data()};
  launch_kernel(true, kernel_for(chain.shape, i % chain.rotation), dim3(blocks), dim3(kThreads), 0, stream, p);
}

struct Measured {
  double median_us, min_us;
  std::string check;  // "ok", or how many values were stale
};

// Runs the chain once from zero and checks it, then times it in a graph.
Measured measure(const Chain& chain, int blocks, int loads, const DeviceBuffer<uint4>& weights) {
  DeviceBuffer<float> values[2] = {DeviceBuffer<float>(blocks), DeviceBuffer<float>(blocks)};
  DeviceBuffer<float> sink(1);
  CUDA_CHECK(cudaMemset(values[0].data(), 0, blocks * sizeof(float)));
  for (int i = 0; i < kChain; ++i) enqueue_launch(i, chain, blocks, loads, values, weights, sink, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  int stale = 0;
  for (float v : values[kChain % 2].to_host()) stale += v != float(kChain);

  const BenchTiming t = time_gpu_graph(
      [&](int i, cudaStream_t s) { enqueue_launch(i, chain, blocks, loads, values, weights, sink, s); }, kChain, 15);
  return {t.median_ms * 1e3, t.min_ms * 1e3, stale == 0 ? "ok" : std::to_string(stale) + " stale"};
}

// One row of the first table; returns the median.
double measure_row(BenchTable& table, const Chain& chain, int blocks, int loads, const DeviceBuffer<uint4>& weights) {
  const Measured m = measure(chain, blocks, loads, weights);
  const bool straight = straight_of(chain.shape);
  const int fmas = fmas_of(chain.shape);
  table.add_row({straight ? "straight" : "looped", std::to_string(chain.rotation), std::to_string(fmas),
                 straight ? std::to_string(fmas * 16 / 1024) : "loop", std::to_string(blocks), std::to_string(loads),
                 fmt(m.median_us, 2), fmt(m.min_us, 2), m.check});
  return m.median_us;
}

}  // namespace

int main() {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("bench_instruction_cache: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s; PDL %s\n", describe_device().c_str(), copy_gbs,
              device_supports_pdl() ? "yes" : "no (the chains run in stream order)");
  // 256 MB of zeroed weight-like bytes, read in rotation so that each launch reads HBM.
  DeviceBuffer<uint4> weights((size_t(256) << 20) / sizeof(uint4));
  CUDA_CHECK(cudaMemset(weights.data(), 0, weights.size() * sizeof(uint4)));

  BenchTable table("instruction_cache", {"code", "kernels in rotation", "FMAs / thread", "SASS KB", "blocks",
                                         "loads / thread", "us / launch (median)", "min", "check"});
  std::vector<std::string> costs;
  for (int blocks : {sms, 3 * sms}) {
    for (int loads : {0, kMaxLoads}) {
      for (int shape = 0; shape < kShapes; ++shape) {
        const double warm = measure_row(table, Chain{shape, 1}, blocks, loads, weights);
        const double cold = measure_row(table, Chain{shape, kSalts}, blocks, loads, weights);
        char line[160];
        std::snprintf(line, sizeof(line), "%d blocks, %2d loads, %s %4d FMAs: cold code costs %.2f us a launch",
                      blocks, loads, straight_of(shape) ? "straight" : "looped  ", fmas_of(shape), cold - warm);
        costs.push_back(line);
      }
    }
  }
  table.print();
  for (const std::string& line : costs) std::printf("%s\n", line.c_str());

  // How much code an SM keeps warm: N straight kernels in rotation, one block per SM, no
  // loads. The time a launch jumps where N kernels' code no longer fits. (Code per
  // kernel: the FMAs' 16 bytes each plus ~4.5 KB around them, sm_90; approximate.)
  BenchTable capacity("instruction_cache_capacity",
                      {"code", "kernels in rotation", "their code, KB (approx.)", "us / launch (median)",
                       "vs one kernel", "check"});
  for (int shape : {0, 1}) {
    double one = 0;
    for (int rotation : {1, 2, 3, 4, 5, 6, 8}) {
      const Measured m = measure(Chain{shape, rotation}, sms, 0, weights);
      if (rotation == 1) one = m.median_us;
      const double kb = rotation * (fmas_of(shape) * 16 + 4.5 * 1024) / 1024;
      capacity.add_row({"straight, " + std::to_string(fmas_of(shape)) + " FMAs", std::to_string(rotation),
                        fmt(kb, 0), fmt(m.median_us, 2), "+" + fmt(m.median_us - one, 2) + " us", m.check});
    }
  }
  capacity.print();
  return 0;
}
