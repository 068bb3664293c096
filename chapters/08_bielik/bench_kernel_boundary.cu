// bench_kernel_boundary: what one kernel boundary costs in a CUDA graph, and whether a
// counter in global memory passes a dependency faster than griddepcontrol.wait.
//
// The decode step is a chain of dependent kernels (five a layer, 160 a token), and its
// timeline (bench_model --timeline) says each griddepcontrol.wait returns ~1.2 us after
// the previous kernel's last block ends. This benchmark isolates that: a chain of
// `kChain` launches of a small kernel, each block reading two values the previous
// launch wrote (its own and its neighbour's) and writing min + 1. Every launch has
// `blocks` blocks of 256 threads; optionally each thread first streams `loads` 16-byte
// weight-like loads that do not depend on the previous kernel (as the decode GEMVs do
// before their wait). With 18 loads at 396 blocks a launch reads 29 MB: the down
// projection's bytes with nothing else to do, the ceiling for a GEMV of that size in a
// chain of dependent launches. How the dependency is passed:
//
//  * stream order: no PDL; the next kernel starts when the previous one has ended.
//  * PDL wait: programmatic dependent launch; griddepcontrol.launch_dependents at the
//    start (or after the wait), griddepcontrol.wait before the dependent reads.
//  * PDL + counter: the same launch, but no griddepcontrol.wait: each block of launch i
//    ends by adding 1 to counter[i] (release, after a fence), and the blocks of launch
//    i + 1 spin until counter[i] == blocks (acquire). The counters are zeroed by a
//    memset at the start of the graph.
//
// Why the counter cannot deadlock: PDL launches the next grid only once EVERY block of
// this one has executed launch_dependents (or exited), so every block a counter waits
// for is already resident on an SM when its waiters arrive; they cannot take its room.
//
// Each mode is first run once on a stream and checked (every value must equal the chain
// length: a stale read would leave it short), then timed in a graph of kChain launches.
//
// A second table asks whether a boundary waits for memory traffic that is still queued
// when it happens (chapter 08's DECODE_LOG.md, seventeenth session): each launch of the
// PDL-wait chain also asks L2 for `prefetch` MB of another buffer (cp.async.bulk.
// prefetch.L2, the bulk-copy engine's form, or prefetch.global.L2 line by line: no
// register or shared memory receives the bytes, nothing waits for them), either at the
// end of its blocks, after their store (the finishing kernel's traffic at the boundary),
// or at their start, before the wait (the next kernel's early traffic during the
// boundary). If the boundary ignores queued traffic, a launch takes max(empty boundary,
// MB / bandwidth); if it waits for it, about their sum.
//
// A third table asks what a block's last stores cost the boundary when they are vector
// atomics (chapter 08's DECODE_LOG.md, sixty-seventh and sixty-eighth sessions: QKV
// folded into the down projection's epilogue would end every down block with 512 float4
// atomics onto one 8 KB fp32 accumulator, q, k and v of the next layer). Each block of
// the PDL-wait chain, after its store, adds (1, 1, 1, 1) to `tail` float4s with
// atomicAdd: onto one 8 KB accumulator shared by every block of the launch (the fold's
// case: every address takes `blocks` atomics), or onto 8 KB of its own (no two blocks
// meet); or it stores them plainly into 8 KB of its own. Two more forms ask what a
// pre-sum would save: only every 8th block adds onto the shared accumulator (the atomics
// of clusters of 8 that summed first, without the sum), and the launch in clusters of 8
// that do sum: each block writes its share into its shared memory, and after a cluster
// barrier each adds an eighth of the cluster's sum, read through distributed shared
// memory (cluster_sum_tail). And one form without a barrier: block b adds onto copy b % 8
// of the accumulator, so each address takes blocks / 8 atomics and a reader sums 8 copies.
// The block counts are multiples of 8 here; 384 is the down projection's grid. The shared
// accumulator is checked after a chain on a stream: every component (summed over the
// copies) must equal the number of blocks whose shares it sums.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cluster_launch.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "pdl.cuh"

namespace {

using namespace bielik;

constexpr int kThreads = 256;
constexpr int kChain = 64;          // launches in one graph
constexpr int kMaxLoads = 18;       // 16-byte loads a thread may issue before the dependency
constexpr int kTailVectors = 512;   // 8 KB of fp32: Bielik's q, k and v (2048 values)

// How each block of a launch ends (the third table). Built by the named functions below.
struct TailForm {
  int vectors = 0;         // float4s a block adds or stores (0: no tail)
  bool per_block = false;  // onto 8 KB of its own (else the launch's shared accumulator)
  bool atomic = true;      // atomicAdd (else plain stores)
  int every = 1;           // only blocks b with b % every == 0 add
  int copies = 1;          // block b adds onto copy b % copies of the shared accumulator
  int cluster = 1;         // launched in clusters of this many blocks, which sum first (> 1)
  bool exchange = true;    // (cluster > 1) the shares and the barriers; false: the cluster launch alone

  static TailForm none() { return {}; }
  static TailForm shared(int vectors) { return with_vectors(vectors); }
  static TailForm shared_every(int every) { TailForm f = with_vectors(kTailVectors); f.every = every; return f; }
  static TailForm shared_copies(int copies) { TailForm f = with_vectors(kTailVectors); f.copies = copies; return f; }
  static TailForm own_atomics() { TailForm f = with_vectors(kTailVectors); f.per_block = true; return f; }
  static TailForm own_stores() { TailForm f = own_atomics(); f.atomic = false; return f; }
  static TailForm cluster_launch_alone(int cluster) {
    TailForm f = cluster_barriers(cluster);
    f.exchange = false;
    return f;
  }
  static TailForm cluster_barriers(int cluster) { TailForm f; f.cluster = cluster; return f; }
  static TailForm cluster_sum(int cluster) { TailForm f = with_vectors(kTailVectors); f.cluster = cluster; return f; }

  /// Whether the launch's shared accumulator holds a checkable sum after a chain.
  bool checkable() const { return vectors > 0 && atomic && !per_block; }
  std::string name() const {
    const std::string in_clusters = "clusters of " + std::to_string(cluster) + ": ";
    if (cluster > 1 && !exchange) return in_clusters + "nothing (the cluster launch alone)";
    if (cluster > 1 && vectors == 0) return in_clusters + "shares written, two cluster barriers, no atomics";
    if (cluster > 1) {
      return in_clusters + "summed in DSMEM, each block adds 1 / " + std::to_string(cluster) + " onto one 8 KB";
    }
    if (vectors == 0) return "none";
    if (!atomic) return "stores, 8 KB a block";
    if (per_block) return "atomics, 8 KB a block";
    if (copies > 1) return "atomics, block b onto copy b % " + std::to_string(copies) + " of 8 KB";
    if (every > 1) return "atomics, one 8 KB for every " + std::to_string(every) + "th block";
    return "atomics, one 8 KB for all";
  }

 private:
  static TailForm with_vectors(int vectors) { TailForm f; f.vectors = vectors; return f; }
};

enum class Dependency {
  kStreamOrder,
  kPdlWait,
  kPdlWaitLateTrigger,
  kPdlCounterFenced,  // __threadfence, then the release add (the textbook pattern)
  kPdlCounter,        // the release add alone (it orders the block's earlier stores)
  kPdlCounterLateTrigger,
};

__host__ __device__ constexpr bool uses_counter(Dependency d) {
  return d == Dependency::kPdlCounterFenced || d == Dependency::kPdlCounter || d == Dependency::kPdlCounterLateTrigger;
}

struct ChainParams {
  const float* in;              // (blocks) what the previous launch wrote
  float* out;                   // (blocks) this launch's values
  const uint4* weights;         // (blocks * kThreads * loads) this launch's independent bytes
  int loads;                    // 16-byte loads per thread before the dependency, <= kMaxLoads
  const unsigned* wait_counter; // the previous launch's counter (kPdlCounter*), or null
  unsigned* signal_counter;     // this launch's counter (kPdlCounter*)
  float* sink;                  // written only if the weights sum to NaN: keeps the loads alive
  const char* prefetch;         // (prefetch_bytes) this launch's bytes to ask L2 for, or null
  unsigned prefetch_bytes;      // a multiple of 16 * 32 * gridDim.x
  bool prefetch_at_start;       // before the dependency (else after the block's store)
  bool prefetch_lines;          // prefetch.global.L2 per 128-byte line (else one bulk request per 16 KB)
  float4* tail;                 // (copies, kTailVectors) this launch's shared accumulator, or
                                // (gridDim.x, kTailVectors) with tail_form.per_block; or null
  TailForm tail_form;           // how each block ends (the third table)
};

// Tail work after a block's store (the third table): `tail_form.vectors` float4s of
// (1, 1, 1, 1), added with vector atomics (sm_90; four scalar atomics before) or stored.
__device__ __forceinline__ void tail_share(const ChainParams& p) {
  const TailForm& form = p.tail_form;
  if (p.tail == nullptr || blockIdx.x % form.every != 0) return;
  const unsigned copy = form.per_block ? blockIdx.x : blockIdx.x % unsigned(form.copies);
  float4* base = p.tail + size_t(copy) * kTailVectors;
  const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  for (int v = threadIdx.x; v < form.vectors; v += kThreads) {
    if (!form.atomic) {
      base[v] = one;
      continue;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(base + v, one);
#else
    atomicAdd(&base[v].x, 1.0f);
    atomicAdd(&base[v].y, 1.0f);
    atomicAdd(&base[v].z, 1.0f);
    atomicAdd(&base[v].w, 1.0f);
#endif
  }
}

// The clusters' pre-sum (the third table's last form): every block writes its share, 8 KB
// of (1, 1, 1, 1), into its own shared memory; after a cluster barrier, block j of the
// cluster sums slice j of the cluster's shares through distributed shared memory and adds
// that slice onto the launch's accumulator with vector atomics (kTailVectors / cluster
// of them); a second barrier keeps every block's shared memory alive until its readers
// are done. Each accumulator address then takes one atomic a cluster, not one a block.
__device__ __forceinline__ void cluster_sum_tail(const ChainParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!p.tail_form.exchange) return;  // the cluster launch alone
  namespace cg = cooperative_groups;
  __shared__ float4 share[kTailVectors];
  cg::cluster_group cluster = cg::this_cluster();
  const float4 one = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  for (int v = threadIdx.x; v < kTailVectors; v += kThreads) share[v] = one;  // stands in for a block's q, k, v
  cluster.sync();
  if (p.tail != nullptr) {
    const unsigned size = cluster.num_blocks(), rank = cluster.block_rank();
    const int slice = p.tail_form.vectors / int(size);
    for (int v = threadIdx.x; v < slice; v += kThreads) {
      const int index = int(rank) * slice + v;
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (unsigned r = 0; r < size; ++r) {
        const float4 x = cluster.map_shared_rank(share, r)[index];
        sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
      }
      atomicAdd(p.tail + index, sum);
    }
  }
  cluster.sync();
#else
  (void)p;
#endif
}

// Every lane of warp 0 asks L2 for its share of the block's share of p.prefetch, in
// bulk requests of at most 16 KB (sm_90+; nothing before), or line by line.
__device__ __forceinline__ void prefetch_share(const ChainParams& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.prefetch == nullptr || threadIdx.x >= 32) return;
  const unsigned per_lane = p.prefetch_bytes / (gridDim.x * 32u);
  const char* start = p.prefetch + (size_t(blockIdx.x) * 32 + threadIdx.x) * per_lane;
  if (p.prefetch_lines) {
    for (unsigned done = 0; done < per_lane; done += 128u) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(start + done) : "memory");
    }
    return;
  }
  for (unsigned done = 0; done < per_lane; done += 16384u) {
    const unsigned bytes = min(16384u, per_lane - done);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(start + done), "r"(bytes) : "memory");
  }
#else
  (void)p;
#endif
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *(volatile const unsigned*)p;
  __threadfence();
#endif
  return v;
}

__device__ __forceinline__ void add_release(unsigned* p, unsigned value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(value) : "memory");
#else
  __threadfence();
  atomicAdd(p, value);
#endif
}

template <Dependency kDependency, bool kClusterSum = false>
__global__ void __launch_bounds__(kThreads, 3) chain_step_kernel(ChainParams p) {
  constexpr bool kCounter = uses_counter(kDependency);
  constexpr bool kLateTrigger =
      kDependency == Dependency::kPdlWaitLateTrigger || kDependency == Dependency::kPdlCounterLateTrigger;
  if (!kLateTrigger) pdl_allow_dependents();
  if (p.prefetch_at_start) prefetch_share(p);

  // Independent work first: loads that need nothing from the previous launch.
  uint4 held[kMaxLoads];
  const size_t thread = size_t(blockIdx.x) * kThreads + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kMaxLoads; ++u) {
    held[u] = u < p.loads ? __ldcs(p.weights + thread * p.loads + u) : make_uint4(0, 0, 0, 0);
  }

  // The dependency.
  if constexpr (kCounter) {
    if (p.wait_counter != nullptr && threadIdx.x == 0) {
      while (load_acquire(p.wait_counter) < gridDim.x) {
      }
    }
    __syncthreads();
  } else {
    pdl_wait();
  }
  if (kLateTrigger) pdl_allow_dependents();

  if (threadIdx.x == 0) {
    const int b = blockIdx.x, neighbour = (blockIdx.x + 1) % gridDim.x;
    p.out[b] = fminf(__ldcg(p.in + b), __ldcg(p.in + neighbour)) + 1.0f;
  }
  unsigned bits = 0;
#pragma unroll
  for (int u = 0; u < kMaxLoads; ++u) bits ^= held[u].x ^ held[u].y ^ held[u].z ^ held[u].w;
  if (bits == 0x7fc00001u) *p.sink = 1.0f;  // never true for the zeroed weights
  if (!p.prefetch_at_start) prefetch_share(p);
  if constexpr (kClusterSum) {
    cluster_sum_tail(p);
  } else {
    tail_share(p);
  }

  if constexpr (kCounter) {
    __syncthreads();  // the block's stores are issued before thread 0 signals
    if (threadIdx.x == 0) {
      if (kDependency == Dependency::kPdlCounterFenced) __threadfence();
      add_release(p.signal_counter, 1u);
    }
  }
}

const char* name_of(Dependency d) {
  switch (d) {
    case Dependency::kStreamOrder: return "stream order (no PDL)";
    case Dependency::kPdlWait: return "PDL, griddepcontrol.wait (trigger at start)";
    case Dependency::kPdlWaitLateTrigger: return "PDL, griddepcontrol.wait (trigger after the wait)";
    case Dependency::kPdlCounterFenced: return "PDL + counter, fence + release add (trigger at start)";
    case Dependency::kPdlCounter: return "PDL + counter, release add (trigger at start)";
    case Dependency::kPdlCounterLateTrigger: return "PDL + counter, release add (trigger after the spin)";
  }
  return "?";
}

template <Dependency kDependency>
void enqueue_step(int i, int blocks, int loads, DeviceBuffer<float>* values, const DeviceBuffer<uint4>& weights,
                  DeviceBuffer<unsigned>& counters, DeviceBuffer<float>& sink, cudaStream_t stream,
                  const DeviceBuffer<uint4>* prefetched = nullptr, unsigned prefetch_bytes = 0,
                  bool prefetch_at_start = false, bool prefetch_lines = false, float4* tail = nullptr,
                  const TailForm& form = TailForm::none()) {
  constexpr bool kCounter = uses_counter(kDependency);
  if (kCounter && i == 0) CUDA_CHECK(cudaMemsetAsync(counters.data(), 0, counters.size() * sizeof(unsigned), stream));
  const size_t per_launch = size_t(blocks) * kThreads * size_t(loads);
  const size_t slots = per_launch == 0 ? 1 : weights.size() / per_launch;  // rotate over more than L2
  ChainParams p;
  p.in = values[i % 2].data();
  p.out = values[(i + 1) % 2].data();
  p.weights = weights.data() + (per_launch == 0 ? 0 : (i % slots) * per_launch);
  p.loads = loads;
  p.wait_counter = kCounter && i > 0 ? counters.data() + (i - 1) : nullptr;
  p.signal_counter = counters.data() + i;
  p.sink = sink.data();
  p.prefetch = nullptr;
  p.prefetch_bytes = prefetch_bytes;
  p.prefetch_at_start = prefetch_at_start;
  p.prefetch_lines = prefetch_lines;
  // The shared accumulators: `copies` a launch, each zeroed at the graph's start.
  p.tail = tail == nullptr || form.vectors == 0
               ? nullptr
               : tail + (form.per_block ? 0 : size_t(i) * form.copies * kTailVectors);
  p.tail_form = form;
  if (prefetched != nullptr && prefetch_bytes > 0) {  // rotate over more than L2 holds
    const size_t slots = prefetched->size() * sizeof(uint4) / prefetch_bytes;
    p.prefetch = reinterpret_cast<const char*>(prefetched->data()) + (i % slots) * size_t(prefetch_bytes);
  }
  const bool pdl = kDependency != Dependency::kStreamOrder;
  if (form.cluster > 1) {  // the clusters' pre-sum (third table): clusters along x
    ClusterLaunch launch(dim3(blocks), dim3(kThreads), dim3(form.cluster), 0, stream, pdl);
    CUDA_CHECK(cudaLaunchKernelEx(&launch.config, chain_step_kernel<kDependency, true>, p));
    return;
  }
  launch_kernel(pdl, chain_step_kernel<kDependency>, dim3(blocks), dim3(kThreads), 0, stream, p);
}

template <Dependency kDependency>
void measure(BenchTable& table, int blocks, int loads, const DeviceBuffer<uint4>& weights, double copy_gbs) {
  DeviceBuffer<float> values[2] = {DeviceBuffer<float>(blocks), DeviceBuffer<float>(blocks)};
  DeviceBuffer<unsigned> counters(kChain);
  DeviceBuffer<float> sink(1);

  // Correctness first: kChain launches on a stream from zero; every value must be kChain.
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMemsetAsync(values[0].data(), 0, blocks * sizeof(float), stream));
  for (int i = 0; i < kChain; ++i) enqueue_step<kDependency>(i, blocks, loads, values, weights, counters, sink, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));
  const std::vector<float> result = values[kChain % 2].to_host();
  int wrong = 0;
  for (float v : result) wrong += v != float(kChain);

  const BenchTiming t = time_gpu_graph(
      [&](int i, cudaStream_t s) { enqueue_step<kDependency>(i, blocks, loads, values, weights, counters, sink, s); },
      kChain, 15);
  const double bytes = double(blocks) * kThreads * loads * 16.0;
  table.add_row({name_of(kDependency), std::to_string(blocks), std::to_string(loads), fmt(bytes / 1e6, 1),
                 fmt(t.median_ms * 1e3, 2), fmt(t.min_ms * 1e3, 2),
                 loads == 0 ? "" : fmt(bytes / (copy_gbs * 1e9) * 1e6, 2),
                 wrong == 0 ? "ok" : std::to_string(wrong) + " stale"});
}

// The boundary with L2 prefetches queued (see the file comment): the PDL-wait chain of
// empty launches, each also prefetching `mb` MB.
void measure_queued(BenchTable& table, int blocks, double mb, bool at_start, bool lines,
                    const DeviceBuffer<uint4>& weights,
                    const DeviceBuffer<uint4>& prefetched, double copy_gbs) {
  DeviceBuffer<float> values[2] = {DeviceBuffer<float>(blocks), DeviceBuffer<float>(blocks)};
  DeviceBuffer<unsigned> counters(kChain);
  DeviceBuffer<float> sink(1);
  const unsigned granule = 16u * 32u * unsigned(blocks);
  const unsigned bytes = unsigned(mb * 1e6 / granule) * granule;
  const BenchTiming t = time_gpu_graph(
      [&](int i, cudaStream_t s) {
        enqueue_step<Dependency::kPdlWait>(i, blocks, 0, values, weights, counters, sink, s, &prefetched, bytes,
                                           at_start, lines);
      },
      kChain, 15);
  const double alone_us = bytes / (copy_gbs * 1e9) * 1e6;
  table.add_row({std::to_string(blocks), bytes == 0 ? "" : (lines ? "per line" : "bulk"), fmt(bytes / 1e6, 1),
                 bytes == 0 ? "" : (at_start ? "start" : "end"),
                 fmt(t.median_ms * 1e3, 2), fmt(alone_us, 2)});
}

// What a block's tail of atomics or stores costs the boundary (see the file comment):
// the PDL-wait chain with `loads` independent loads a thread, each block ending as `form`
// says. `tail` holds max(8 kChain, blocks) x kTailVectors float4s (8 copies a launch at
// most, or 8 KB a block); it is zeroed at the graph's start. Returns the median us a launch.
double measure_tail(BenchTable& table, int blocks, int loads, const TailForm& form, const DeviceBuffer<uint4>& weights,
                    DeviceBuffer<float4>& tail, double none_us) {
  DeviceBuffer<float> values[2] = {DeviceBuffer<float>(blocks), DeviceBuffer<float>(blocks)};
  DeviceBuffer<unsigned> counters(kChain);
  DeviceBuffer<float> sink(1);
  auto enqueue = [&](int i, cudaStream_t s) {
    if (i == 0) CUDA_CHECK(cudaMemsetAsync(tail.data(), 0, tail.size() * sizeof(float4), s));
    enqueue_step<Dependency::kPdlWait>(i, blocks, loads, values, weights, counters, sink, s, nullptr, 0, false,
                                       false, tail.data(), form);
  };
  // The check (shared accumulators): after one chain on a stream, each component of the
  // first `vectors` float4s of each launch's accumulator, summed over its copies as a
  // reader would, counts every block that added once.
  std::string check = "";
  if (form.checkable() && blocks % form.cluster == 0) {
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int i = 0; i < kChain; ++i) enqueue(i, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaStreamDestroy(stream));
    const std::vector<float4> sums = tail.to_host();
    const float adders = float((blocks + form.every - 1) / form.every);
    int wrong = 0;
    for (int i = 0; i < kChain; ++i) {
      for (int v = 0; v < kTailVectors; ++v) {
        float4 got = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int c = 0; c < form.copies; ++c) {
          const float4 x = sums[(size_t(i) * form.copies + c) * kTailVectors + v];
          got.x += x.x, got.y += x.y, got.z += x.z, got.w += x.w;
        }
        const float want = v < form.vectors ? adders : 0.0f;
        wrong += got.x != want || got.y != want || got.z != want || got.w != want;
      }
    }
    check = wrong == 0 ? "ok" : std::to_string(wrong) + " wrong";
  }
  const BenchTiming t = time_gpu_graph(enqueue, kChain, 15);
  const double us = t.median_ms * 1e3;
  const double bytes = double(blocks) * kThreads * loads * 16.0;
  const bool baseline = form.vectors == 0 && form.cluster == 1;
  table.add_row({std::to_string(blocks), std::to_string(loads), fmt(bytes / 1e6, 1), form.name(),
                 form.vectors == 0 ? "" : std::to_string(form.vectors), fmt(us, 2),
                 baseline ? "" : fmt(us - none_us, 2), check});
  return us;
}

}  // namespace

int main() {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("bench_kernel_boundary: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s; PDL %s\n", describe_device().c_str(), copy_gbs,
              device_supports_pdl() ? "yes" : "no (every mode runs in stream order)");
  // 256 MB of zeroed weight-like bytes, read in rotation so that each launch reads HBM.
  DeviceBuffer<uint4> weights((size_t(256) << 20) / sizeof(uint4));
  CUDA_CHECK(cudaMemset(weights.data(), 0, weights.size() * sizeof(uint4)));

  BenchTable table("kernel_boundary", {"dependency", "blocks", "loads / thread", "MB / launch", "us / launch (median)",
                                       "min", "bytes alone at copy BW (us)", "check"});
  // 18 loads: 29 MB a launch at 396 blocks, a pure read the size of the down projection.
  for (int loads : {0, 8, 18}) {
    for (int blocks : {132, 264, 396}) {
      measure<Dependency::kStreamOrder>(table, blocks, loads, weights, copy_gbs);
      measure<Dependency::kPdlWait>(table, blocks, loads, weights, copy_gbs);
      measure<Dependency::kPdlWaitLateTrigger>(table, blocks, loads, weights, copy_gbs);
      measure<Dependency::kPdlCounterFenced>(table, blocks, loads, weights, copy_gbs);
      measure<Dependency::kPdlCounter>(table, blocks, loads, weights, copy_gbs);
      measure<Dependency::kPdlCounterLateTrigger>(table, blocks, loads, weights, copy_gbs);
    }
  }
  table.print();

  if (device_supports_pdl()) {  // cp.async.bulk.prefetch.L2 is sm_90, as PDL
    DeviceBuffer<uint4> prefetched((size_t(512) << 20) / sizeof(uint4));
    CUDA_CHECK(cudaMemset(prefetched.data(), 0, prefetched.size() * sizeof(uint4)));
    BenchTable queued("kernel_boundary_queued_traffic",
                      {"blocks", "prefetch", "MB prefetched a launch", "asked for at", "us / launch (median)",
                       "the MB alone at copy BW (us)"});
    for (int blocks : {132, 396}) {
      measure_queued(queued, blocks, 0, false, false, weights, prefetched, copy_gbs);
      for (bool lines : {false, true}) {
        for (bool at_start : {false, true}) {
          for (double mb : {0.5, 1.0, 2.0, 4.0, 8.0, 16.0}) {
            measure_queued(queued, blocks, mb, at_start, lines, weights, prefetched, copy_gbs);
          }
        }
      }
    }
    queued.print();

    // Atomics at the blocks' end (atomicAdd on float4 is sm_90, as PDL here).
    DeviceBuffer<float4> tail(size_t(std::max(kChain * 8, 384)) * kTailVectors);  // see measure_tail
    BenchTable tails("kernel_boundary_tail_atomics",
                     {"blocks", "loads / thread", "MB / launch", "each block ends with", "float4 a block",
                      "us / launch (median)", "over no tail (us)", "check"});
    {  // How many clusters of 8 of the pre-sum's kernel fit at once (one wave needs blocks / 8).
      ClusterLaunch probe(dim3(384), dim3(kThreads), dim3(8), 0, nullptr, true);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, chain_step_kernel<Dependency::kPdlWait, true>, &probe.config) !=
          cudaSuccess) {
        clusters = -1;
        (void)cudaGetLastError();
      }
      std::printf("clusters of 8 of the pre-sum's kernel resident at once: %d (384 blocks are 48 clusters)\n\n",
                  clusters);
    }
    // Multiples of 8 for the clusters; 384 is the down projection's one wave of blocks.
    for (int loads : {0, 18}) {
      for (int blocks : {128, 264, 384}) {
        const double none_us = measure_tail(tails, blocks, loads, TailForm::none(), weights, tail, 0.0);
        for (const TailForm& form :
             {TailForm::shared(128), TailForm::shared(kTailVectors), TailForm::shared_every(8),
              TailForm::shared_copies(8), TailForm::cluster_launch_alone(8), TailForm::cluster_barriers(8),
              TailForm::cluster_sum(8), TailForm::own_atomics(), TailForm::own_stores()}) {
          measure_tail(tails, blocks, loads, form, weights, tail, none_us);
        }
      }
    }
    tails.print();
  }
  return 0;
}
