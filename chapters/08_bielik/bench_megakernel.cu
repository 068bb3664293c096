// bench_megakernel: would one persistent kernel with a weight stream that never waits hide
// the decode step's round trips? The megakernel's premise, measured before anyone builds one.
//
// bench_layer_chain measured what the step's chain of 161 launches allows: with its
// kernels' round trips after their waits (the input staged, the outputs stored, the
// attention's dependent reads) the chain loses ~4.6 us a layer on the H200 to bytes that
// did not move while those trips ran, and issue 7's target leaves ~2.1. Its conclusion
// ended in a conjecture: a megakernel would make the same trips and could hide them only
// if its producers kept more bytes in flight than the early launches do (a launch's
// blocks hold ~64 KB each, and only while the SM has room for them). This program tests
// that conjecture with the same bytes and the same trips in one kernel:
//
//  * one block an SM (a cooperative launch, so all are resident), a producer warp and 8
//    consumer warps;
//  * the producer's lane 0 walks the token's weights in the step's order (the phases
//    QKV, attention, O, gate/up, down of 32 layers, then the lm_head; each phase's bytes
//    cut into 16 KB tiles dealt round-robin to the blocks) and asks the bulk-copy engine
//    for each of its block's tiles as soon as a slot of its shared-memory ring is free.
//    It never waits for an activation: it runs ahead of the consumers by the whole ring
//    (12 slots: 192 KB an SM, 26 MB over an H200's 132 SMs, ~6 us of its copy
//    bandwidth), straight across the phases;
//  * the consumers take the phases in order. In a phase where their block owns tiles they
//    wait for the previous phase to be complete (a counter in global memory that every
//    block of that phase increments when its outputs are stored, instead of a kernel
//    boundary), stage the phase's input from L2 and sum a word of it across the block,
//    (the attention) make 4 dependent L2 reads, consume their tiles from the ring, store
//    their share of the phase's output, and increment the phase's counter.
//
// The rows switch those pieces on one by one, with the ring at 12, 6, 4 and 2 slots, and
// the tiles consumed either by a fold of their bits or by dot products against the
// staged input (bf16 to fp32, one FMA a weight, a warp sum a tile), which is what a
// GEMV's consumers do. Set the rows beside bench_layer_chain's in the same call: "every
// launch staging and storing, the attention making 4 dependent L2 reads" is the same
// work as the "flags, activations and the attention's reads" rows here.
//
// A check, as bench_layer_chain's: each participating block of a phase reads two values
// the previous phase's blocks wrote and writes their minimum + 1, one chain across all
// phases and tokens; after the first tokens every value of the last phase must equal
// the number of phases run. A consumer that read before a phase was complete would leave
// a smaller value ("stale read", exit status 1). A wait that spins for 2 s gives up and
// is counted ("timed out"), and the configuration's later waits then give up at once, so
// a bug shows as a row, not a hang.
//
// More rows (seventieth session) take the time apart: no tiles at all (the counters,
// activations and reads alone), slots handed over without a copy (the consumers' own
// speed), phases counted but never waited for, the phases' descriptors read from global
// memory, slots never read, and the barriers polled instead of try_wait. The
// seventy-first session's rows put 2, 4 or 6 of a phase's tiles under one pair of
// barriers (fewer handshakes, coarser stream). The rows "a warp a tile" (written in the
// seventy-first session, back on main in the seventy-second) give each consumer warp whole
// tiles of its own, so the 8 warps' handshakes run side by side; two rows "activations
// moved, dot products" with no waits (seventy-second session) price the waits against
// the full work with no copies. Run 5 (seventy-second session, H100): a warp a tile lost
// by a third, and the 8 warps' dot products alone, with no waits and nothing copied,
// took longer than the whole chain. Run 6: 16 consumer warps (bench_megakernel_16_warps)
// brought those under the chain, and the kernel still lost by 1.22x: each phase's handoff
// through a counter costs ~1.7 us, and nothing overlaps it.
//
// Written in the sixty-ninth session; first run in the seventieth, on H100s
// (bench_megakernel_h100.txt): the chain won, 1189 against 1451 us a token, and with no
// copies at all the kernel still took 97% of its time, its consumers' path setting the
// pace. In run 4 (seventy-first session) groups of tiles shortened that path, never below
// the chain's time, and slowed the stream. DECODE_LOG.md (sixty-ninth to seventy-first
// sessions) reads the rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "device_buffer.cuh"
#include "globaltimer.cuh"
#include "megakernel_schedule.hpp"
#include "pdl.cuh"
#include "step_bytes.hpp"
#include "weight_stream.cuh"

namespace {

using namespace bielik;
using namespace bielik::step_bytes;
using namespace bielik::megakernel_schedule;

// 8 consumer warps a block. bench_megakernel_16_warps is the same program built with 16
// (BIELIK_MEGAKERNEL_CONSUMER_WARPS): run 5 found the 8 warps' dot products alone slower
// than the whole chain, and the chain's GEMVs run 24 warps an SM.
#ifndef BIELIK_MEGAKERNEL_CONSUMER_WARPS
#define BIELIK_MEGAKERNEL_CONSUMER_WARPS 8
#endif
constexpr int kConsumerWarps = BIELIK_MEGAKERNEL_CONSUMER_WARPS;
static_assert(kConsumerWarps == 8 || kConsumerWarps == 16,
              "a tile's 1024 uint4 must split evenly over the consumers, and a block holds at most 1024 threads");
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // the last warp is the producer
constexpr int kChunksPerThread = kTileBytes / 16 / kConsumers;  // a full tile's uint4: 4 with 8 warps, 2 with 16
// At least this much shared memory a block, so that an SM never holds two (a block is an
// SM's whole stream; two would halve each one's ring).
constexpr int kMinSharedBytes = 120 << 10;
constexpr unsigned long long kWaitGiveUpNs = 2000000000ull;

/// What the ring's slots carry.
enum class Tiles {
  streamed,     // the weights, copied by the bulk-copy engine
  handed_over,  // nothing copied: the producer marks a slot full as soon as it is free, so
                // the row times the consumers and the two barriers' handshake alone
  none,         // no ring at all: the phases' counters, activations and reads alone
};

/// What a row's kernel does: the consumers' work, and what the producer puts in the ring.
struct Work {
  bool wait_for_phases;  // false: no counters at all, the ring's own speed
  bool move_activations;  // stage the input, sum a word across the block, store the output
  bool chase;             // the phases' chase_steps
  bool dot;               // dot products against the staged input, else a fold of the bits
  bool clock_waits = false;  // thread 0 of the consumers clocks its waits (MegaParams::clocks)
  Tiles tiles = Tiles::streamed;
  bool count_without_waiting = false;  // each phase counted (fence, atomic), never waited for
  // The rows that look for the consumers' own cost (seventieth session):
  bool phases_in_global = false;  // read each phase's descriptor from global memory, not shared
  bool read_tiles = true;         // false: a slot is waited for and released, never read
  bool poll_barriers = false;     // mbarrier.test_wait in a loop instead of try_wait (which may suspend)
  // Up to this many of a phase's tiles (the block's next ones) travel under one pair of
  // barriers: one wait and one release for the group, in a ring of slots / group groups.
  int tiles_per_handshake = 1;
  // Each consumer warp takes whole tiles of its own (those landing in the ring slots it
  // owns, slot % 8) instead of all 8 sharing each one: a slot's handshake is one warp's wait
  // and one release, and the 8 warps' handshakes run side by side (tiles_per_handshake 1).
  bool warp_owns_tiles = false;
};

// The token's phases: Bielik's 32 layers of 5, then the lm_head. The kernel keeps their
// descriptors in shared memory, as a real megakernel would keep its instructions.
constexpr int kPhases = kLayers * 5 + 1;

// What MegaParams::clocks holds, for each kind of phase (QKV, attention, O, gate/up, down,
// the lm_head): ns that the consumers' thread 0 spent in the phase, waiting for the
// previous phase, and waiting for its ring, summed over blocks and tokens.
constexpr int kPhaseKinds = 6;
enum Clock { kClockPhase, kClockFlags, kClockRing, kClocks };

struct MegaParams {
  const Phase* phases;  // (num_phases)
  int num_phases;
  const unsigned char* weights;
  int slots;  // ring slots of kTileBytes
  Work work;
  unsigned token;            // 1, 2, ... over the launches of one configuration
  unsigned* phase_done;      // (num_phases) blocks that finished the phase, over all tokens
  unsigned* values;          // (num_phases, gridDim.x) the check's chain
  uint4* activations[2];     // phase p reads [p % 2], writes [(p + 1) % 2]
  const unsigned* chase;     // (chase_entries) each entry the index of the next
  unsigned chase_entries;
  unsigned long long* clocks;  // (kPhaseKinds, kClocks) when work.clock_waits
  unsigned* timeouts;        // waits that gave up, over all configurations
  unsigned* given_up;        // nonzero once a wait of this configuration gave up: the rest stop waiting
  float* sink;               // written only if a result is a value it never is
};

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");  // the consumer warps only
}

__device__ __forceinline__ void slot_release(uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(stream_ptx::shared_address(barrier)) : "memory");
#endif
}

__device__ __forceinline__ void wait_slot(const MegaParams& p, uint64_t* barrier, uint32_t parity) {
  if (p.work.poll_barriers) {
    stream_ptx::barrier_poll(barrier, parity);
  } else {
    stream_ptx::barrier_wait(barrier, parity);
  }
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* address) {
  unsigned value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

/// This block's rank among the phase's participants (megakernel_schedule.hpp).
__device__ __forceinline__ int rank_here(const Phase& phase) { return rank_in(phase, int(blockIdx.x), int(gridDim.x)); }

/// The producer: lane 0 of the last warp requests every tile its block owns, phase after
/// phase, as soon as a slot is free.
__device__ void produce(const MegaParams& p, const Phase* phases, unsigned char* ring, uint64_t* full,
                        uint64_t* empty) {
  if (threadIdx.x % 32 != 0 || p.work.tiles == Tiles::none) return;
  const int group = p.work.tiles_per_handshake;
  const unsigned groups = unsigned(p.slots / group);  // the ring's groups of `group` slots
  const int stride = int(gridDim.x);                   // from one of the block's tiles to its next
  unsigned use = 0;  // group uses so far: group use % groups, on its (use / groups)-th round
  for (int ph = 0; ph < p.num_phases; ++ph) {
    const Phase phase = phases[ph];
    for (int first = rank_here(phase); first < phase.tiles; first += group * stride, ++use) {
      const unsigned slot = use % groups, round = use / groups;
      // A fresh barrier's phase of parity 1 counts as complete: the first round passes.
      wait_slot(p, &empty[slot], (round & 1u) ^ 1u);
      if (p.work.tiles == Tiles::handed_over) {
        slot_release(&full[slot]);  // the full barrier's one arrival, with no bytes to wait for
        continue;
      }
      uint32_t bytes = 0;
      for (int k = 0, i = first; k < group && i < phase.tiles; ++k, i += stride) bytes += tile_bytes(phase, i);
      stream_ptx::barrier_expect_bytes(&full[slot], bytes);
      for (int k = 0, i = first; k < group && i < phase.tiles; ++k, i += stride) {
        copy_async_bulk(ring + (size_t(slot) * group + k) * kTileBytes,
                        p.weights + phase.offset + (unsigned long long)(i) * kTileBytes, tile_bytes(phase, i),
                        &full[slot]);
      }
    }
  }
}

/// Thread 0 of the consumers spins until `count` blocks have finished the phase. Once one
/// wait of the configuration has given up, every later one gives up at once: a broken
/// count then costs one 2 s wait, not 2 s for each of the token's 161 phases.
__device__ void wait_for(const MegaParams& p, const unsigned* done, unsigned count) {
  if (threadIdx.x == 0) {
    const unsigned long long give_up = globaltimer_ns() + kWaitGiveUpNs;
    while (load_acquire(done) < count) {
      if (*static_cast<volatile unsigned*>(p.given_up) != 0) break;
      if (globaltimer_ns() > give_up) {
        atomicAdd(p.timeouts, 1u);
        atomicExch(p.given_up, 1u);
        break;
      }
    }
  }
  consumers_sync();
}

/// Work.warp_owns_tiles: each slot of the ring belongs to one consumer warp (slot % 8), and
/// the warp takes every tile that lands in its slots (every warp counts every use, so all
/// agree on the slots); it reads its 16 KB tile alone, 32 uint4 a lane, and releases the
/// slot alone. Returns the use count after the phase.
///
/// Why by slot and not by use (use % 8, as first written in 1d1aff0): see slot_owner in
/// megakernel_schedule.hpp. With 12 slots dealt by use, a slot's rounds alternate between
/// two warps; the second could come for round r + 1 while round r had not landed, find the
/// parity it asks for already "complete", read a slot still being written and release it
/// early, leaving the ring's count wrong. The price of dealing by slot: with 12 slots,
/// warps 0-3 own two slots and 4-7 one, so warps 0-3 take two tiles in every 12 to the
/// others' one (8 slots deal them evenly).
__device__ unsigned consume_own_tiles(const MegaParams& p, const Phase& phase, int rank, int tiles,
                                      const unsigned char* ring, uint64_t* full, uint64_t* empty,
                                      const uint4* x_shared, int input_chunks, unsigned use, unsigned* bits,
                                      float* acc) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int stride = int(gridDim.x);
  const bool dot = p.work.dot && input_chunks > 0;
  for (int i = rank; i < tiles; i += stride, ++use) {
    const unsigned slot = use % unsigned(p.slots), round = use / unsigned(p.slots);
    if (slot_owner(slot, kConsumerWarps) != warp) continue;  // another warp's slot
    wait_slot(p, &full[slot], round & 1u);
    const uint4* tile = reinterpret_cast<const uint4*>(ring + size_t(slot) * kTileBytes);
    const int chunks = int(tile_bytes(phase, i) / 16);
    float tile_acc = 0.0f;
    int x = dot ? lane % input_chunks : 0;  // the x chunk that weight chunk c meets: c % input_chunks
#pragma unroll 8
    for (int c = lane; c < kTileBytes / 16; c += 32) {
      if (c < chunks && p.work.read_tiles) {
        const uint4 w = tile[c];
        if (dot) {
          tile_acc = decode_device::dot_8(w, x_shared[x], tile_acc);
        } else {
          *bits ^= w.x ^ w.y ^ w.z ^ w.w;
        }
      }
      if (dot) {
        x += 32;
        while (x >= input_chunks) x -= input_chunks;
      }
    }
    if (dot) {
      for (int offset = 16; offset > 0; offset /= 2) tile_acc += __shfl_xor_sync(0xffffffffu, tile_acc, offset);
      *acc += tile_acc;
    }
    __syncwarp();
    if (lane == 0) slot_release(&empty[slot]);  // the one arrival the slot's empty barrier waits for
  }
  return use;
}

__device__ void consume(const MegaParams& p, const Phase* phases, const unsigned char* ring, uint64_t* full,
                        uint64_t* empty, uint4* x_shared) {
  __shared__ unsigned warp_words[kConsumerWarps];
  __shared__ unsigned long long clocks[kPhaseKinds][kClocks];  // thread 0's, for MegaParams::clocks
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const bool clocking = p.work.clock_waits && threadIdx.x == 0;
  if (clocking) {
    for (int k = 0; k < kPhaseKinds; ++k) {
      for (int c = 0; c < kClocks; ++c) clocks[k][c] = 0;
    }
  }
  unsigned use = 0;
  unsigned bits = 0;  // every weight folded in: keeps the loads and the math alive
  float acc = 0.0f;
  for (int ph = 0; ph < p.num_phases; ++ph) {
    const Phase phase = phases[ph];
    const int rank = rank_here(phase);
    if (rank >= phase.tiles) continue;  // no tiles here: the next phase's wait orders us
    const int previous_index = ph == 0 ? p.num_phases - 1 : ph - 1;
    const Phase& previous = phases[previous_index];
    const int kind = ph == p.num_phases - 1 ? kPhaseKinds - 1 : ph % (kPhaseKinds - 1);
    const unsigned long long phase_start = clocking ? globaltimer_ns() : 0;
    if (p.work.wait_for_phases) {
      // Phase 0 of token t waits for the last phase of token t - 1 (the previous launch,
      // so already complete), every other phase for its predecessor in this token.
      const unsigned token_of_previous = ph == 0 ? p.token - 1 : p.token;
      wait_for(p, p.phase_done + previous_index, token_of_previous * unsigned(previous.participants));
      if (clocking) clocks[kind][kClockFlags] += globaltimer_ns() - phase_start;
    }
    unsigned staged = 0;
    const int input_chunks = p.work.move_activations ? phase.input_chunks : 0;
    if (input_chunks > 0) {
      const uint4* input = ph % 2 == 0 ? p.activations[0] : p.activations[1];
      for (int c = int(threadIdx.x); c < input_chunks; c += kConsumers) {
        const uint4 v = __ldcg(input + c);
        x_shared[c] = v;
        staged ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      for (int offset = 16; offset > 0; offset /= 2) staged ^= __shfl_xor_sync(0xffffffffu, staged, offset);
      if (lane == 0) warp_words[warp] = staged;
      consumers_sync();  // the input is in shared memory, and every warp's word
      staged = 0;
      for (int w = 0; w < kConsumerWarps; ++w) staged ^= warp_words[w];
    }
    if (p.work.chase && phase.chase_steps > 0) {
      __shared__ unsigned chased;
      if (threadIdx.x == 0) {
        unsigned index = (p.token * 7919u + unsigned(ph) * 131u + blockIdx.x * 4099u) % p.chase_entries;
        for (int step = 0; step < phase.chase_steps; ++step) index = __ldcg(p.chase + index);
        chased = index;
      }
      consumers_sync();
      if (chased == 0xffffffffu) *p.sink = 1.0f;  // never: every entry is an index < chase_entries
    }
    // Which x chunk each of this thread's weight chunks meets (the dots only).
    int x_index[kChunksPerThread];
#pragma unroll
    for (int u = 0; u < kChunksPerThread; ++u) {
      x_index[u] = input_chunks > 0 ? (int(threadIdx.x) + u * kConsumers) % input_chunks : 0;
    }
    const int tiles = p.work.tiles == Tiles::none ? 0 : phase.tiles;
    if (p.work.warp_owns_tiles) {
      use = consume_own_tiles(p, phase, rank, tiles, ring, full, empty, x_shared, input_chunks, use, &bits, &acc);
    }
    const int group = p.work.tiles_per_handshake, stride = int(gridDim.x);
    const unsigned groups = unsigned(p.slots / group);
    for (int first = rank; first < tiles && !p.work.warp_owns_tiles; first += group * stride, ++use) {
      const unsigned slot = use % groups, round = use / groups;
      if (clocking) {
        const unsigned long long before = globaltimer_ns();
        wait_slot(p, &full[slot], round & 1u);
        clocks[kind][kClockRing] += globaltimer_ns() - before;
      } else {
        wait_slot(p, &full[slot], round & 1u);
      }
      for (int k = 0, i = first; k < group && i < tiles; ++k, i += stride) {
        const uint4* tile = reinterpret_cast<const uint4*>(ring + (size_t(slot) * group + k) * kTileBytes);
        const int chunks = int(tile_bytes(phase, i) / 16);
        float tile_acc = 0.0f;
#pragma unroll
        for (int u = 0; u < kChunksPerThread; ++u) {
          const int c = int(threadIdx.x) + u * kConsumers;
          if (c < chunks && p.work.read_tiles) {
            const uint4 w = tile[c];
            if (p.work.dot && input_chunks > 0) {
              tile_acc = decode_device::dot_8(w, x_shared[x_index[u]], tile_acc);  // the GEMVs' own
            } else {
              bits ^= w.x ^ w.y ^ w.z ^ w.w;
            }
          }
        }
        if (p.work.dot && input_chunks > 0) {  // a GEMV sums its rows across the warp
          for (int offset = 16; offset > 0; offset /= 2) tile_acc += __shfl_xor_sync(0xffffffffu, tile_acc, offset);
          acc += tile_acc;
        }
      }
      __syncwarp();
      if (lane == 0) slot_release(&empty[slot]);  // this warp is done with the slot
    }
    const int output_chunks = p.work.move_activations ? phase.output_chunks : 0;
    if (output_chunks > 0) {
      uint4* output = ph % 2 == 0 ? p.activations[1] : p.activations[0];
      const unsigned word = staged ^ __float_as_uint(acc);
      const int per_block = (output_chunks + phase.participants - 1) / phase.participants;
      for (int c = int(threadIdx.x); c < per_block; c += kConsumers) {
        const int chunk = rank * per_block + c;
        if (chunk < output_chunks) output[chunk] = make_uint4(word, word, word, 0u);
      }
    }
    if (threadIdx.x == 0 && p.work.wait_for_phases) {  // the check's chain (only waits need checking)
      const unsigned* in = p.values + size_t(previous_index) * gridDim.x;
      const unsigned a = __ldcg(in + rank % previous.participants);
      const unsigned b = __ldcg(in + (rank + 1) % previous.participants);
      p.values[size_t(ph) * gridDim.x + rank] = min(a, b) + 1u;
    }
    if (p.work.wait_for_phases || p.work.count_without_waiting) {
      consumers_sync();  // every consumer's stores are issued
      if (threadIdx.x == 0) {
        __threadfence();  // ... and visible to the GPU before the count says so
        atomicAdd(p.phase_done + ph, 1u);
      }
    }
    if (clocking) clocks[kind][kClockPhase] += globaltimer_ns() - phase_start;
  }
  if (clocking) {
    for (int k = 0; k < kPhaseKinds; ++k) {
      for (int c = 0; c < kClocks; ++c) atomicAdd(p.clocks + k * kClocks + c, clocks[k][c]);
    }
  }
  if (bits == 0x7fc00001u || acc == 12345.678f) *p.sink = 1.0f;  // never for the zeroed weights
}

__global__ void __launch_bounds__(kThreads, 1) megakernel(MegaParams p) {
  extern __shared__ __align__(128) unsigned char shared[];
  unsigned char* ring = shared;                                                      // (slots, kTileBytes)
  uint4* x_shared = reinterpret_cast<uint4*>(ring + size_t(p.slots) * kTileBytes);   // (kF) the staged input
  uint64_t* full = reinterpret_cast<uint64_t*>(x_shared + kF);                       // (slots)
  uint64_t* empty = full + p.slots;                                                   // (slots)
  Phase* phases_shared = reinterpret_cast<Phase*>(empty + p.slots);                   // (num_phases)
  for (int i = int(threadIdx.x); i < p.num_phases; i += int(blockDim.x)) phases_shared[i] = p.phases[i];
  const Phase* phases = p.work.phases_in_global ? p.phases : phases_shared;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.slots; ++s) {
      stream_ptx::barrier_init(&full[s], 1);                  // the producer's expect_tx arrival
      // One arrival a consumer warp, or the one warp that owns the slot's tile.
      stream_ptx::barrier_init(&empty[s], p.work.warp_owns_tiles ? 1 : kConsumerWarps);
    }
    stream_ptx::barrier_init_fence();
  }
  __syncthreads();  // the last block-wide barrier: from here the roles part
  if (threadIdx.x >= kConsumers) {
    produce(p, phases, ring, full, empty);
  } else {
    consume(p, phases, ring, full, empty, x_shared);
  }
}

size_t shared_bytes_for(int slots) {
  const size_t bytes = size_t(slots) * kTileBytes + size_t(kF) * 16 + 2 * size_t(slots) * sizeof(uint64_t) +
                       size_t(kPhases) * sizeof(Phase);
  return std::max(bytes, size_t(kMinSharedBytes));
}

/// One configuration: its own counters and check values, its token count running on.
class Megakernel {
 public:
  Megakernel(const std::vector<Phase>& phases, const DeviceBuffer<unsigned char>& weights, int grid, int slots,
             Work work, const DeviceBuffer<unsigned>& chase, unsigned* timeouts, float* sink)
      : phases_(phases), grid_(grid), slots_(slots), work_(work), device_phases_(phases),
        phase_done_(phases.size()), values_(phases.size() * size_t(grid)), clocks_(size_t(kPhaseKinds) * kClocks),
        given_up_(1) {
    const int group = work.tiles_per_handshake;
    if (group < 1 || slots % group != 0 || slots / group < 2 || (work.warp_owns_tiles && group != 1)) {
      throw std::invalid_argument("bench_megakernel: a ring of " + std::to_string(slots) +
                                  " slots cannot hold two groups of " + std::to_string(group) + " tiles");
    }
    for (DeviceBuffer<uint4>& a : activations_) {
      a = DeviceBuffer<uint4>(size_t(kLogits));
      CUDA_CHECK(cudaMemset(a.data(), 0, size_t(kLogits) * sizeof(uint4)));
    }
    params_.phases = device_phases_.data();
    params_.num_phases = int(phases.size());
    params_.weights = weights.data();
    params_.slots = slots;
    params_.work = work;
    params_.phase_done = phase_done_.data();
    params_.values = values_.data();
    params_.activations[0] = activations_[0].data();
    params_.activations[1] = activations_[1].data();
    params_.chase = chase.data();
    params_.chase_entries = unsigned(chase.size());
    params_.clocks = clocks_.data();
    params_.timeouts = timeouts;
    params_.given_up = given_up_.data();
    params_.sink = sink;
    reset();
  }

  void reset() {
    CUDA_CHECK(cudaMemset(phase_done_.data(), 0, phase_done_.size() * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(values_.data(), 0, values_.size() * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(clocks_.data(), 0, clocks_.size() * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemset(given_up_.data(), 0, sizeof(unsigned)));
    token_ = 0;
  }

  /// One token: one cooperative launch on the default stream.
  void enqueue() {
    params_.token = ++token_;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(grid_));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = shared_bytes_for(slots_);
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeCooperative;  // every block resident, or the launch fails
    attribute.val.cooperative = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&config, megakernel, params_));
  }

  /// `tokens` tokens from zeroed counters; true when the chain's last values are right.
  bool check(int tokens) {
    reset();
    for (int t = 0; t < tokens; ++t) enqueue();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<unsigned> values = values_.to_host();
    const size_t last = phases_.size() - 1;
    const unsigned expected = unsigned(tokens) * unsigned(phases_.size());
    for (int r = 0; r < phases_.back().participants; ++r) {
      if (values[last * size_t(grid_) + size_t(r)] != expected) return false;
    }
    return true;
  }

  const Work& work() const { return work_; }

  /// MegaParams::clocks since the last reset, in us a layer for one participating block
  /// (the lm_head's: a token), [kind][clock].
  std::vector<std::vector<double>> clocks_per_layer() const {
    const std::vector<unsigned long long> ns = clocks_.to_host();
    std::vector<std::vector<double>> us(kPhaseKinds, std::vector<double>(kClocks, 0.0));
    for (int k = 0; k < kPhaseKinds; ++k) {
      const bool lm_head = k == kPhaseKinds - 1;
      const double blocks = double(phases_[lm_head ? phases_.size() - 1 : size_t(k)].participants);
      const double visits = double(token_) * blocks * (lm_head ? 1 : kLayers);
      for (int c = 0; c < kClocks; ++c) us[size_t(k)][size_t(c)] = double(ns[size_t(k * kClocks + c)]) / visits / 1e3;
    }
    return us;
  }

 private:
  std::vector<Phase> phases_;
  int grid_;
  int slots_;
  Work work_;
  DeviceBuffer<Phase> device_phases_;
  DeviceBuffer<unsigned> phase_done_;
  DeviceBuffer<unsigned> values_;
  DeviceBuffer<uint4> activations_[2];
  DeviceBuffer<unsigned long long> clocks_;
  DeviceBuffer<unsigned> given_up_;  // (1) MegaParams::given_up
  MegaParams params_{};
  unsigned token_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::printf("bench_megakernel: no CUDA device, nothing to measure\n");
    return 1;  // measured nothing: not a success
  }
  int rounds = 5;  // each configuration measured once a round, the rounds interleaved
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--rounds" && a + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++a]));
    } else {
      std::fprintf(stderr, "usage: bench_megakernel [--rounds N]\n");
      return 2;
    }
  }
  if (!weight_stream_supported()) {
    std::printf("bench_megakernel: needs the bulk-copy engine (sm_90 or newer); nothing measured on this GPU\n");
    return 0;  // as bench_weight_stream: a GPU without the feature is not a failure of `make bench`
  }
  int device = 0, sms = 0, cooperative = 0, shared_optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (cooperative == 0) {
    std::printf("bench_megakernel: the device has no cooperative launch; nothing measured on this GPU\n");
    return 0;
  }
  const int max_slots = 12;
  if (size_t(shared_optin) < shared_bytes_for(max_slots) + 1024) {  // + the kernel's static shared memory
    std::printf("bench_megakernel: a block may have %d bytes of shared memory here, the 12-slot ring needs %zu; "
                "nothing measured on this GPU\n", shared_optin, shared_bytes_for(max_slots) + 1024);
    return 0;
  }
  CUDA_CHECK(cudaFuncSetAttribute(megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(shared_bytes_for(max_slots))));
  int blocks_per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, megakernel, kThreads,
                                                           shared_bytes_for(max_slots)));
  if (blocks_per_sm < 1) {
    std::printf("bench_megakernel: %zu bytes of shared memory a block do not fit an SM of this GPU; nothing measured\n",
                shared_bytes_for(max_slots));
    return 0;
  }

  const double copy_gbs = measure_copy_bandwidth_gbs();
  std::printf("%s; copy bandwidth %.0f GB/s\n", describe_device().c_str(), copy_gbs);
  const int grid = sms;
  const std::vector<Phase> phases = token_phases(grid);
  if (phases.size() != size_t(kPhases)) {
    std::fprintf(stderr, "bench_megakernel: the schedule has %zu phases, the kernel's shared memory holds %d\n",
                 phases.size(), kPhases);
    return 1;
  }
  const unsigned long long token_bytes = phases.back().offset + phases.back().bytes;
  DeviceBuffer<unsigned char> weights(size_t(token_bytes) + kTileBytes);
  CUDA_CHECK(cudaMemset(weights.data(), 0, weights.size()));
  std::printf("one token reads %.3f GB in %zu phases of 16 KB tiles; %d blocks of %d threads (%d consumer warps, "
              "1 producer warp)\n", double(token_bytes) / 1e9, phases.size(), grid, kThreads, kConsumerWarps);

  // The chase table of bench_layer_chain's L2 rows: 16 K entries (64 KB), each the index
  // of one 4128 entries on, so that every read lands on a line of its own.
  std::vector<unsigned> next(size_t(16) << 10);
  for (size_t i = 0; i < next.size(); ++i) next[i] = unsigned((i + 4096 + 32) % next.size());
  const DeviceBuffer<unsigned> chase(next);
  DeviceBuffer<unsigned> timeouts(1);
  CUDA_CHECK(cudaMemset(timeouts.data(), 0, sizeof(unsigned)));
  DeviceBuffer<float> sink(1);

  struct Row {
    std::string name;
    int slots;
    Work work;
  };
  const Work stream_only{false, false, false, false};
  const Work flags_only{true, false, false, false};
  const Work flags_moving{true, true, false, false};
  const Work flags_moving_chasing{true, true, true, false};
  const Work full_work{true, true, true, true};
  const Work clocked{true, true, true, true, true};
  Work counters_alone = flags_only;
  counters_alone.tiles = Tiles::none;
  Work counters_moving_chasing = flags_moving_chasing;
  counters_moving_chasing.tiles = Tiles::none;
  Work handed_over_alone = stream_only;
  handed_over_alone.tiles = Tiles::handed_over;
  Work handed_over_full = full_work;
  handed_over_full.tiles = Tiles::handed_over;
  // The full work's pieces less the waits: each phase's input staged and its output
  // stored, the tiles as dot products, but no phase waits for the one before. Against
  // handed_over_full it prices the waits; against handed_over_alone, the dots and staging.
  // With no waits a phase's staging may overwrite the input a slower warp still reads: its
  // values mean nothing (no check runs without waits); its time is the point.
  const Work handed_over_unordered{false, true, false, true, false, Tiles::handed_over};
  Work stream_counted = stream_only;
  stream_counted.count_without_waiting = true;
  Work handed_over_global = handed_over_alone;
  handed_over_global.phases_in_global = true;
  Work handed_over_unread = handed_over_alone;
  handed_over_unread.read_tiles = false;
  Work handed_over_polled = handed_over_alone;
  handed_over_polled.poll_barriers = true;
  Work full_polled = full_work;
  full_polled.poll_barriers = true;
  const auto grouped = [](Work work, int tiles_per_handshake) {
    work.tiles_per_handshake = tiles_per_handshake;
    return work;
  };
  const auto warp_owned = [](Work work) {
    work.warp_owns_tiles = true;
    return work;
  };
  const std::vector<Row> rows = {
      {"the ring alone: no waits, no activations", 12, stream_only},
      {"flags between the phases", 12, flags_only},
      {"flags, activations moved", 12, flags_moving},
      {"flags, activations, the attention's 4 dependent L2 reads", 12, flags_moving_chasing},
      {"the same, the tiles as dot products", 12, full_work},
      {"the same, a ring of 6 slots (96 KB)", 6, full_work},
      {"the same, a ring of 4 slots (64 KB)", 4, full_work},
      {"the same, a ring of 2 slots (32 KB)", 2, full_work},
      {"flags, activations, the attention's reads, bits folded, 4 slots", 4, flags_moving_chasing},
      // What the rows above are made of: the counters' chain with no weights, the
      // consumers' speed with no copies, and the counts' cost to a stream that never waits.
      {"no tiles: flags between the phases alone", 12, counters_alone},
      {"no tiles: flags, activations, the attention's reads", 12, counters_moving_chasing},
      {"no copies (slots handed over empty): no waits", 12, handed_over_alone},
      {"no copies, no waits, the phases' descriptors read from global memory", 12, handed_over_global},
      {"no copies, no waits, the slots never read (the two barriers alone)", 12, handed_over_unread},
      {"no copies, no waits, the barriers polled (test_wait, never suspended)", 12, handed_over_polled},
      {"no copies, no waits: activations moved, dot products", 12, handed_over_unordered},
      {"flags, activations, the attention's reads, dot products, the barriers polled", 12, full_polled},
      // Fewer handshakes: a phase's tiles in groups of 2, 4 or 6 under one pair of barriers
      // (a ring of 6, 3 or 2 groups in the same 192 KB), where the block has that many in
      // the phase.
      {"no copies, no waits, 4 tiles a handshake", 12, grouped(handed_over_alone, 4)},
      {"no copies, no waits, the slots never read, 4 tiles a handshake", 12, grouped(handed_over_unread, 4)},
      {"no copies: flags, activations, the attention's reads, dot products, 2 tiles a handshake", 12,
       grouped(handed_over_full, 2)},
      {"no copies: flags, activations, the attention's reads, dot products, 4 tiles a handshake", 12,
       grouped(handed_over_full, 4)},
      {"no copies: flags, activations, the attention's reads, dot products, 6 tiles a handshake", 12,
       grouped(handed_over_full, 6)},
      {"flags, activations, the attention's reads, dot products, 2 tiles a handshake", 12, grouped(full_work, 2)},
      {"flags, activations, the attention's reads, dot products, 4 tiles a handshake", 12, grouped(full_work, 4)},
      {"flags, activations, the attention's reads, dot products, 6 tiles a handshake", 12, grouped(full_work, 6)},
      // A warp a tile: the 8 warps' handshakes side by side instead of one after another.
      {"no copies, no waits, a warp a tile", 12, warp_owned(handed_over_alone)},
      {"no copies, no waits, the slots never read, a warp a tile", 12, warp_owned(handed_over_unread)},
      {"no copies, no waits: activations moved, dot products, a warp a tile", 12, warp_owned(handed_over_unordered)},
      {"no copies: flags, activations, the attention's reads, dot products, a warp a tile", 12,
       warp_owned(handed_over_full)},
      {"flags, activations, the attention's reads, dot products, a warp a tile", 12, warp_owned(full_work)},
      {"the same, a warp a tile, 8 slots (a slot a warp)", 8, warp_owned(full_work)},
      {"no copies: the same, a warp a tile, 8 slots", 8, warp_owned(handed_over_full)},
      {"the same, a warp a tile, 6 slots (6 warps busy)", 6, warp_owned(full_work)},
      {"no copies: flags, activations, the attention's reads, dot products", 12, handed_over_full},
      {"the ring alone, each phase counted (fence, atomic) but not waited for", 12, stream_counted},
      {"dot products, 12 slots, thread 0 clocking its waits", 12, clocked},
      {"dot products, 4 slots, thread 0 clocking its waits", 4, clocked},
  };
  std::vector<Megakernel> kernels;
  kernels.reserve(rows.size());
  for (const Row& row : rows) {
    kernels.emplace_back(phases, weights, grid, row.slots, row.work, chase, timeouts.data(), sink.data());
  }
  const int check_tokens = 3;
  std::vector<std::string> verdicts;
  std::vector<bool> timed;  // a configuration whose check gave up a wait is not timed (it would crawl)
  unsigned check_timeouts = 0;
  for (Megakernel& k : kernels) {
    const bool ok = k.check(check_tokens);
    const unsigned gave_up = timeouts.to_host()[0] - check_timeouts;
    check_timeouts += gave_up;
    verdicts.push_back(gave_up > 0                     ? "timed out"
                       : !k.work().wait_for_phases ? "n/a (no waits)"
                       : ok                        ? "ok"
                                                   : "stale read");
    timed.push_back(gave_up == 0);
  }

  std::vector<std::vector<double>> us(rows.size());
  const int tokens_per_sample = 8;
  for (int r = 0; r < rounds; ++r) {
    for (size_t c = 0; c < kernels.size(); ++c) {
      if (!timed[c]) continue;
      const BenchTiming t = time_gpu_back_to_back([&](int) { kernels[c].enqueue(); }, tokens_per_sample, 3);
      us[c].push_back(t.median_ms * 1e3);
    }
  }
  const unsigned total_timeouts = timeouts.to_host()[0];

  const double floor_us = double(token_bytes) / (copy_gbs * 1e9) * 1e6;
  BenchTable table("megakernel", {"one kernel a token, one block an SM", "slots", "us a token (median of rounds)",
                                  "min / max", "tokens/s", "% of copy-BW floor", "check"});
  for (size_t c = 0; c < rows.size(); ++c) {
    if (!timed[c]) {
      table.add_row({rows[c].name, std::to_string(rows[c].slots), "-", "-", "-", "-", verdicts[c]});
      continue;
    }
    std::vector<double> sorted = us[c];
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    table.add_row({rows[c].name, std::to_string(rows[c].slots), fmt(median, 1),
                   fmt(sorted.front(), 1) + " / " + fmt(sorted.back(), 1), fmt(1e6 / median, 0),
                   fmt(100.0 * floor_us / median, 1), verdicts[c]});
  }
  table.print();
  std::printf("floor at this copy bandwidth: %.1f us a token = %.0f tokens/s; issue 7's target 1150 tokens/s = "
              "%.1f us\n", floor_us, 1e6 / floor_us, 1e6 / 1150.0);
  // Where the consumers' time goes, for the clocked rows.
  const char* kind_names[kPhaseKinds] = {"QKV", "attention", "O", "gate/up", "down", "lm_head (a token)"};
  for (size_t c = 0; c < rows.size(); ++c) {
    if (!rows[c].work.clock_waits || !timed[c]) continue;
    const std::vector<std::vector<double>> clocks = kernels[c].clocks_per_layer();
    BenchTable waits("megakernel_waits_" + std::to_string(rows[c].slots) + "_slots",
                     {"phase (" + rows[c].name + ")", "blocks", "us a layer in the phase", "waiting for the previous phase",
                      "waiting for the ring", "the rest"});
    for (int k = 0; k < kPhaseKinds; ++k) {
      const std::vector<double>& u = clocks[size_t(k)];
      const size_t phase_index = k == kPhaseKinds - 1 ? phases.size() - 1 : size_t(k);
      waits.add_row({kind_names[k], std::to_string(phases[phase_index].participants), fmt(u[kClockPhase], 2),
                     fmt(u[kClockFlags], 2), fmt(u[kClockRing], 2),
                     fmt(u[kClockPhase] - u[kClockFlags] - u[kClockRing], 2)});
    }
    waits.print();
  }
  std::printf("waits that gave up after 2 s: %u in the checks, %u in all\n", check_timeouts, total_timeouts);
  bool all_ok = total_timeouts == 0;
  for (const std::string& v : verdicts) all_ok = all_ok && v != "stale read" && v != "timed out";
  return all_ok ? 0 : 1;
}
