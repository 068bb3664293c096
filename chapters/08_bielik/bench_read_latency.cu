// bench_read_latency: what a dependent read costs while the weights stream, and whether
// it matters on WHICH SMs they stream.
//
// Every timeline of DECODE_LOG.md says the decode step's chain (QKV -> attention -> O) is
// made of small reads that wait on each other: an input staged from L2, q and the newest
// key, a flag, an epilogue's residual. And every attempt to fill the chain's idle HBM
// with later weights lost, because (in the log's reading) those reads then queue behind
// the weight loads. Where is that queue? If it is in each SM (its load units, its L1's
// outstanding misses), a step whose chain ran on SMs of its own while the other SMs
// streamed the next weights would keep its reads fast. If it is in L2 or HBM, where
// every SM's requests meet, no placement helps. This program measures which.
//
// One kernel, one block per SM (1024 threads and 120 KB of shared memory a block, so
// that no SM takes two). Block 0 is the probe: its thread 0 follows a chain of dependent
// loads (each reads the index of the next, through L2: ld.global.cg) and times them with
// %globaltimer, after the streams have run for 10 us. `streaming_blocks` other blocks
// stream a 1 GB buffer (beyond L2) with all 32 warps, by the decode GEMVs' own weight
// load (decode_device's load_streaming: 16 bytes, L2 evict-first), 8 in flight a lane
// (128 KB an SM) unless a row says fewer; the probe's own other 31 warps stream too where
// asked. Streams stop when the probe is done.
//
// Two chains: 512 entries 128 bytes apart (64 KB, warmed into L2 first: an L2 hit a
// step, as the chain's activations are) and 32768 entries 64 KB apart in a 2 GB table
// (not in L2: a trip to HBM a step). The rows: nothing streaming; 131 other SMs; the same
// and the probe's SM; the probe's SM alone; half and a quarter of the other SMs (the
// first blocks or the last ones); 131 other SMs with fewer loads in flight (64, 32, 16 KB
// an SM). Each row is the median of 5 runs: ns a dependent read, and the streams' rate
// over the run.
//
// Checks (the program exits with 1 if one fails): each chain ends on the index the host
// computes, and the streams' sum of the words they loaded equals the number of loads
// times the word every byte of the buffer holds (so no load was dropped as dead).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_device.cuh"  // load_streaming, l2_policy: the decode GEMVs' weight loads
#include "device_buffer.cuh"
#include "globaltimer.cuh"

namespace {

using namespace bielik;

constexpr int kThreads = 1024;  // 32 warps: one block an SM takes all its warp slots but 32
constexpr int kMostInFlight = 8;  // 16-byte loads in flight a lane: 4 KB a warp, 128 KB an SM
constexpr size_t kBlockShared = 120 * 1024;  // with 1024 threads: one block an SM
constexpr unsigned kFill = 0x01010101u;      // every 32-bit word of the streamed buffer

struct ProbeParams {
  const unsigned* chase = nullptr;  // entry i: the next index
  unsigned chase_start = 0;         // the first index
  int chase_steps = 0;
  int warm_steps = 0;  // untimed steps first (the L2 chain: puts its lines in L2)
  unsigned long long ramp_ns = 10000;  // the streams run this long before the timed steps
  const uint4* stream = nullptr;       // the streamed buffer
  size_t stream_vectors = 0;           // its 16-byte vectors
  int streaming_blocks = 0;            // blocks first_streaming_block .. + streaming_blocks - 1 stream
  int first_streaming_block = 1;
  int in_flight = kMostInFlight;       // 16-byte loads in flight a lane: 1, 2, 4 or 8
  bool probe_sm_streams = false;       // block 0's other 31 warps stream too
  // Results.
  unsigned* done = nullptr;                    // (1) set by the probe
  unsigned* chase_end = nullptr;               // (1) the chain's last index
  unsigned long long* chase_ns = nullptr;      // (1) the timed steps' duration
  unsigned long long* loads = nullptr;         // (1) 16-byte loads the streams made
  unsigned long long* word_sum = nullptr;      // (1) the sum of the words they loaded
  unsigned long long* stream_window = nullptr;  // (2) the streams' first start, last end (ns)
};

/// One warp streams its own slice of the buffer, round after round, until the probe is
/// done, kInFlight 16-byte loads a lane a round.
template <int kInFlight>
__device__ void stream_until_done(const ProbeParams& p, int stream_warp, int stream_warps) {
  const uint64_t policy = decode_device::l2_policy(true);  // the decode GEMVs' loads, evict-first
  const int lane = threadIdx.x % 32;
  const size_t slice = p.stream_vectors / size_t(stream_warps);  // vectors a warp
  const size_t round = size_t(kInFlight) * 32;                     // vectors a round
  const size_t rounds_in_slice = slice / round > 0 ? slice / round : 1;
  const uint4* base = p.stream + size_t(stream_warp) * slice;
  unsigned long long loads = 0, sum = 0;
  if (lane == 0) atomicMin(p.stream_window, globaltimer_ns());
  for (size_t r = 0;; r = (r + 1) % rounds_in_slice) {
    if (*reinterpret_cast<volatile const unsigned*>(p.done) != 0u) break;  // an L2 read a round
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = decode_device::load_streaming(base + r * round + u * 32 + lane, policy);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) sum += v[u].x + v[u].y + v[u].z + v[u].w;  // uses every load
    loads += kInFlight;
  }
  atomicAdd(p.loads, loads);
  atomicAdd(p.word_sum, sum);
  if (lane == 0) atomicMax(p.stream_window + 1, globaltimer_ns());
}

__device__ void stream(const ProbeParams& p, int stream_warp, int stream_warps) {
  switch (p.in_flight) {
    case 1: stream_until_done<1>(p, stream_warp, stream_warps); break;
    case 2: stream_until_done<2>(p, stream_warp, stream_warps); break;
    case 4: stream_until_done<4>(p, stream_warp, stream_warps); break;
    default: stream_until_done<kMostInFlight>(p, stream_warp, stream_warps); break;
  }
}

__global__ void __launch_bounds__(kThreads, 1) read_latency_kernel(ProbeParams p) {
  extern __shared__ unsigned char reserved[];  // unused: it only keeps a second block off the SM
  (void)reserved;
  const int warp = threadIdx.x / 32;
  const int warps = kThreads / 32;
  if (blockIdx.x == 0) {
    if (warp == 0) {
      if (threadIdx.x == 0) {
        unsigned index = p.chase_start;
        for (int s = 0; s < p.warm_steps; ++s) index = __ldcg(p.chase + index);
        const unsigned long long ramp_end = globaltimer_ns() + p.ramp_ns;
        while (globaltimer_ns() < ramp_end) {
        }
        index = p.chase_start;
        const unsigned long long start = globaltimer_ns();
        for (int s = 0; s < p.chase_steps; ++s) index = __ldcg(p.chase + index);
        // The end is read after the last index arrived: it feeds the store below first.
        *p.chase_end = index;
        __threadfence();
        *p.chase_ns = globaltimer_ns() - start;
        atomicExch(p.done, 1u);
      }
    } else if (p.probe_sm_streams) {
      stream(p, (p.streaming_blocks * warps) + warp - 1, p.streaming_blocks * warps + warps - 1);
    }
    return;
  }
  const int streamer = int(blockIdx.x) - p.first_streaming_block;
  if (streamer < 0 || streamer >= p.streaming_blocks) return;
  const int stream_warps = p.streaming_blocks * warps + (p.probe_sm_streams ? warps - 1 : 0);
  stream(p, streamer * warps + warp, stream_warps);
}

/// Chain entries `spacing` apart: slot i (entry i * spacing) holds the entry of slot
/// (i + step) % slots. With step and slots coprime the chain visits every slot.
__global__ void fill_chase_kernel(unsigned* table, unsigned slots, unsigned spacing, unsigned step) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    table[size_t(i) * spacing] = unsigned((size_t(i) + step) % slots) * spacing;
  }
}

struct Chase {
  unsigned slots, spacing, step;
  DeviceBuffer<unsigned> table;
  Chase(unsigned slots_, unsigned spacing_, unsigned step_)
      : slots(slots_), spacing(spacing_), step(step_), table(size_t(slots_) * spacing_) {
    table.fill_bytes(0);
    fill_chase_kernel<<<256, 256>>>(table.data(), slots, spacing, step);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// The entry `steps` steps after slot `from_slot`'s.
  unsigned entry_after(unsigned from_slot, long long steps) const {
    return unsigned((from_slot + (unsigned long long)(steps % slots) * step) % slots) * spacing;
  }
};

struct Run {
  double ns_per_read;
  double stream_gbs;
};

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_read_latency: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s\n\n", describe_device().c_str(), copy_gbs);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  CUDA_CHECK(cudaFuncSetAttribute(read_latency_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(kBlockShared)));

  // The L2 chain: 512 slots 128 bytes apart (64 KB), 97 slots a step, warmed into L2 by
  // two laps before it is timed. The HBM chain: 32768 slots 64 KB apart (2 GB), 1031 a
  // step; each run starts where the last one stopped, so no run reads a slot an earlier
  // one left in L2 (55 runs of 500 steps stay within the 32768 slots).
  const Chase l2_chase(512, 32, 97), hbm_chase(32768, 16384, 1031);
  constexpr int kL2Steps = 4000, kHbmSteps = 500;
  long long hbm_position = 0;  // steps along the HBM chain taken by the runs so far

  const size_t stream_bytes = size_t(1) << 30;
  DeviceBuffer<uint4> stream(stream_bytes / 16);
  stream.fill_bytes(0x01);  // every word kFill
  DeviceBuffer<unsigned> done(1), chase_end(1);
  DeviceBuffer<unsigned long long> chase_ns(1), loads(1), word_sum(1), window(2);

  bool all_checks_passed = true;
  struct Row {
    std::string label;
    int streaming_blocks;
    bool probe_sm_streams;
    int first_streaming_block = 1;
    int in_flight = kMostInFlight;
  };
  auto run_once = [&](bool hbm, const Row& row) {
    ProbeParams p;
    const Chase& chase = hbm ? hbm_chase : l2_chase;
    const unsigned start = hbm ? hbm_chase.entry_after(0, hbm_position) : 0u;
    const int steps = hbm ? kHbmSteps : kL2Steps;
    const int warm = hbm ? 0 : int(2 * l2_chase.slots);
    const unsigned want_end = chase.entry_after(start / chase.spacing, steps);  // the timed steps restart at start
    if (hbm) hbm_position += steps;
    p.chase = chase.table.data();
    p.chase_start = start;
    p.chase_steps = steps;
    p.warm_steps = warm;
    p.stream = stream.data();
    p.stream_vectors = stream.size();
    p.streaming_blocks = row.streaming_blocks;
    p.probe_sm_streams = row.probe_sm_streams;
    p.first_streaming_block = row.first_streaming_block;
    p.in_flight = row.in_flight;
    p.done = done.data();
    p.chase_end = chase_end.data();
    p.chase_ns = chase_ns.data();
    p.loads = loads.data();
    p.word_sum = word_sum.data();
    p.stream_window = window.data();
    done.fill_bytes(0);
    loads.fill_bytes(0);
    word_sum.fill_bytes(0);
    const std::vector<unsigned long long> window_start = {~0ull, 0ull};
    window.copy_from_host(window_start);
    read_latency_kernel<<<sms, kThreads, kBlockShared>>>(p);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    const unsigned end = chase_end.to_host()[0];
    const unsigned long long ns = chase_ns.to_host()[0], n = loads.to_host()[0], sum = word_sum.to_host()[0];
    const std::vector<unsigned long long> w = window.to_host();
    if (end != want_end || sum != n * 4ull * kFill) {
      std::printf("CHECK FAILED: chain end %u (want %u), word sum %llu for %llu loads (want %llu)\n", end, want_end,
                  sum, n, n * 4ull * kFill);
      all_checks_passed = false;
    }
    const double stream_s = n > 0 && w[1] > w[0] ? double(w[1] - w[0]) * 1e-9 : 0.0;
    return Run{double(ns) / steps, stream_s > 0 ? double(n) * 16 / stream_s / 1e9 : 0.0};
  };

  const int others = sms - 1, half = others / 2, quarter = others / 4;
  auto n = [](int v) { return std::to_string(v); };
  const std::vector<Row> rows = {
      {"nothing streams", 0, false},
      {"every other SM streams (" + n(others) + ")", others, false},
      {"every SM streams, the probe's too", others, true},
      {"only the probe's SM streams (31 warps)", 0, true},
      {"half the other SMs: blocks 1-" + n(half), half, false},
      {"half the other SMs: blocks " + n(sms - half) + "-" + n(sms - 1), half, false, sms - half},
      {"a quarter of the other SMs: blocks 1-" + n(quarter), quarter, false},
      {"a quarter of the other SMs: blocks " + n(sms - quarter) + "-" + n(sms - 1), quarter, false, sms - quarter},
      {"every other SM, 4 loads in flight a lane (64 KB an SM)", others, false, 1, 4},
      {"every other SM, 2 loads in flight a lane (32 KB an SM)", others, false, 1, 2},
      {"every other SM, 1 load in flight a lane (16 KB an SM)", others, false, 1, 1},
  };
  BenchTable table("read_latency", {"a dependent read from", "streams", "ns a read (median of 5)", "x alone",
                                    "streams' GB/s", "% copy BW"});
  for (const bool hbm : {false, true}) {
    double alone = 0;
    for (const Row& row : rows) {
      std::vector<double> ns, gbs;
      for (int r = 0; r < 5; ++r) {
        const Run run = run_once(hbm, row);
        ns.push_back(run.ns_per_read);
        gbs.push_back(run.stream_gbs);
      }
      std::sort(ns.begin(), ns.end());
      std::sort(gbs.begin(), gbs.end());
      if (row.streaming_blocks == 0 && !row.probe_sm_streams) alone = ns[2];
      const bool streams = row.streaming_blocks > 0 || row.probe_sm_streams;
      table.add_row({hbm ? "HBM (2 GB table)" : "L2 (64 KB table)", row.label, fmt(ns[2], 0),
                     fmt(ns[2] / alone, 2), streams ? fmt(gbs[2], 0) : "", streams ? fmt(100 * gbs[2] / copy_gbs, 1) : ""});
    }
  }
  table.print();
  if (!all_checks_passed) {
    std::printf("bench_read_latency: a check failed\n");
    return 1;
  }
  return 0;
}
