/// @file megakernel_schedule.hpp
/// @brief bench_megakernel's schedule: the token's phases, cut into tiles, and which block
/// owns which tile. Plain arithmetic shared by the kernel (device) and its CPU test
/// (test_megakernel_schedule.cpp), because the kernel's correctness rests on it: the
/// producer and the consumers of a block must walk the same tiles in the same order, and
/// a phase's counter must reach exactly its number of participating blocks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <vector>

#include "step_bytes.hpp"

#ifdef __CUDACC__
#define BIELIK_HOST_DEVICE __host__ __device__
#else
#define BIELIK_HOST_DEVICE
#endif

namespace bielik {
namespace megakernel_schedule {

/// A tile: what one slot of a block's ring holds (the last tile of a phase may be shorter).
constexpr int kTileBytes = 16 << 10;
/// The attention's reads of its KV cache: 196 KB, as bench_layer_chain's 48 blocks of 256
/// 16-byte loads (192 positions of 2 kv heads).
constexpr size_t kAttentionBytes = size_t(48) * 256 * 16;
constexpr int kAttentionChaseSteps = 4;

/// One phase of the token: its weights, and what its consumers move.
struct Phase {
  unsigned long long offset;  // bytes into the weight buffer, a multiple of 16
  unsigned long long bytes;
  int tiles;          // ceil(bytes / kTileBytes)
  int first_tile;     // tile 0 of this phase goes to block first_tile (< grid)
  int participants;   // blocks that own tiles: min(tiles, grid)
  int input_chunks;   // 16-byte chunks of the previous phase's output every participant reads
  int output_chunks;  // 16-byte chunks of output, shared out between the participants
  int chase_steps;    // dependent L2 reads by thread 0 after the staging
};

/// The rank of `block` among the phase's participants: tile i of the phase goes to block
/// (first_tile + i) % grid, so the block's tiles are rank, rank + grid, ... < tiles. A
/// rank >= tiles means the block owns none (only when tiles < grid).
BIELIK_HOST_DEVICE inline int rank_in(const Phase& phase, int block, int grid) {
  return (block - phase.first_tile % grid + grid) % grid;
}

/// The bytes of tile i of a phase.
BIELIK_HOST_DEVICE inline unsigned tile_bytes(const Phase& phase, int i) {
  const unsigned long long start = (unsigned long long)(i) * kTileBytes;
  const unsigned long long left = phase.bytes - start;
  return unsigned(left < (unsigned long long)(kTileBytes) ? left : (unsigned long long)(kTileBytes));
}

/// The consumer warp that takes the tiles landing in ring slot `slot` when each warp owns
/// whole tiles (bench_megakernel's "a warp a tile" rows): slot % warps, so that every
/// round of a slot is waited for by one warp, in order. An mbarrier wait names the phase
/// it waits for by its parity alone, which is unambiguous only for a waiter that saw the
/// slot's previous round complete; dealt by use number instead (use % warps), a ring
/// whose size is not a multiple of `warps` hands a slot's rounds from warp to warp, and a
/// warp coming early for round r + 1 would find round r's parity "complete" before round r
/// had landed. test_megakernel_schedule.cpp checks both.
BIELIK_HOST_DEVICE inline int slot_owner(unsigned slot, int warps) { return int(slot % unsigned(warps)); }

/// The token's phases for `grid` blocks: Bielik's 32 layers (QKV, the attention, O,
/// gate/up, down), then the lm_head, in the order the step reads their weights. Tiles are
/// dealt round-robin across the phases, so that over a token every block gets the same
/// number of tiles, give or take one.
inline std::vector<Phase> token_phases(int grid) {
  using namespace step_bytes;
  struct Piece {
    size_t bytes;
    int input_chunks, output_chunks, chase_steps;
  };
  const Piece layer[] = {{kQkvBytes, kX, kQkv, 0},
                         {kAttentionBytes, kHeadInputs, kX, kAttentionChaseSteps},
                         {kOBytes, kX, kX, 0},
                         {kGateUpBytes, kX, kF, 0},
                         {kDownBytes, kF, kX, 0}};
  std::vector<Piece> pieces;
  for (int l = 0; l < kLayers; ++l) pieces.insert(pieces.end(), std::begin(layer), std::end(layer));
  pieces.push_back({kLmHeadBytes, kX, kLogits, 0});
  std::vector<Phase> phases;
  unsigned long long offset = 0;
  long long first_tile = 0;
  for (const Piece& piece : pieces) {
    Phase phase{};
    phase.offset = offset;
    phase.bytes = piece.bytes;
    phase.tiles = int((piece.bytes + kTileBytes - 1) / kTileBytes);
    phase.first_tile = int(first_tile % grid);
    phase.participants = std::min(phase.tiles, grid);
    phase.input_chunks = piece.input_chunks;
    phase.output_chunks = piece.output_chunks;
    phase.chase_steps = piece.chase_steps;
    phases.push_back(phase);
    offset += (piece.bytes + 15) / 16 * 16;  // every tile 16-byte aligned, as the bulk copy needs
    first_tile += phase.tiles;                // the next phase's tiles go on round the blocks
  }
  return phases;
}

}  // namespace megakernel_schedule
}  // namespace bielik
