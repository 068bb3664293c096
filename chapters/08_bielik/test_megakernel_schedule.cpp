// Chapter 08: bench_megakernel's schedule (megakernel_schedule.hpp), on the CPU. The
// kernel trusts three things that no GPU run checks directly: every tile of a phase has
// exactly one owner, a phase's participants are exactly the blocks ranked 0 ..
// participants - 1 (the counter it waits for counts them, and the check's values are
// indexed by rank), and the token's bytes are the step's, tile for tile. Checked here for
// the H200's and H100's 132 SMs, for other grids, and for grids larger than a small phase.
// A fourth, for the rows where a warp owns whole tiles: each ring slot has one owner warp,
// so that its parity waits cannot mistake one round for another.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "megakernel_schedule.hpp"
#include "step_bytes.hpp"

using namespace bielik;
using namespace bielik::megakernel_schedule;

namespace {

const int kGrids[] = {1, 7, 12, 13, 100, 114, 132, 170};

}  // namespace

TEST_CASE("megakernel schedule: the token is the step's bytes in the step's order", "[ch08][megakernel]") {
  using namespace step_bytes;
  const std::vector<Phase> phases = token_phases(132);
  REQUIRE(phases.size() == size_t(5 * kLayers + 1));
  const size_t layer_bytes[] = {kQkvBytes, kAttentionBytes, kOBytes, kGateUpBytes, kDownBytes};
  unsigned long long expected_offset = 0;
  for (size_t p = 0; p < phases.size(); ++p) {
    const size_t bytes = p + 1 == phases.size() ? kLmHeadBytes : layer_bytes[p % 5];
    CHECK(phases[p].bytes == bytes);
    CHECK(phases[p].offset == expected_offset);
    CHECK(phases[p].offset % 16 == 0);  // the bulk copy's alignment
    CHECK(phases[p].tiles == int((bytes + kTileBytes - 1) / kTileBytes));
    expected_offset += (bytes + 15) / 16 * 16;
  }
  // The attention reads its head's q and new key and value, and makes the dependent reads.
  CHECK(phases[1].input_chunks == kHeadInputs);
  CHECK(phases[1].chase_steps == kAttentionChaseSteps);
  CHECK(phases[4].input_chunks == kF);  // down reads gate/up's output
  CHECK(phases.back().output_chunks == kLogits);
}

TEST_CASE("megakernel schedule: every tile has one owner, and the owners are ranks 0 .. participants - 1",
          "[ch08][megakernel]") {
  for (const int grid : kGrids) {
    const std::vector<Phase> phases = token_phases(grid);
    std::vector<long long> tiles_of_block(size_t(grid), 0);
    for (size_t p = 0; p < phases.size(); ++p) {
      const Phase& phase = phases[p];
      CAPTURE(grid, p);
      REQUIRE(phase.first_tile >= 0);
      REQUIRE(phase.first_tile < grid);
      CHECK(phase.participants == std::min(phase.tiles, grid));
      std::map<int, int> owner_of_tile;  // tile -> block
      std::set<int> ranks;
      for (int block = 0; block < grid; ++block) {
        const int rank = rank_in(phase, block, grid);
        REQUIRE(rank >= 0);
        REQUIRE(rank < grid);
        if (rank >= phase.tiles) continue;  // owns nothing in this phase
        ranks.insert(rank);
        // The walk the producer and the consumers both make.
        for (int i = rank; i < phase.tiles; i += grid) {
          CHECK(owner_of_tile.count(i) == 0);
          owner_of_tile[i] = block;
          ++tiles_of_block[size_t(block)];
          CHECK((phase.first_tile + i) % grid == block);  // the deal the header promises
        }
      }
      CHECK(int(owner_of_tile.size()) == phase.tiles);
      CHECK(int(ranks.size()) == phase.participants);
      if (!ranks.empty()) {
        CHECK(*ranks.begin() == 0);
        CHECK(*ranks.rbegin() == phase.participants - 1);
      }
    }
    // Dealt on round the blocks across the phases: a token's tiles are balanced.
    const auto [fewest, most] = std::minmax_element(tiles_of_block.begin(), tiles_of_block.end());
    CAPTURE(grid);
    CHECK(*most - *fewest <= 1);
  }
}

TEST_CASE("megakernel schedule: a tile's bytes add up to its phase's", "[ch08][megakernel]") {
  const std::vector<Phase> phases = token_phases(132);
  for (size_t p = 0; p < 6; ++p) {  // the first layer's phases and one more
    const Phase& phase = phases[p];
    unsigned long long sum = 0;
    for (int i = 0; i < phase.tiles; ++i) {
      const unsigned bytes = tile_bytes(phase, i);
      CHECK(bytes > 0);
      CHECK(bytes <= unsigned(kTileBytes));
      CHECK(bytes % 16 == 0);
      if (i + 1 < phase.tiles) CHECK(bytes == unsigned(kTileBytes));
      sum += bytes;
    }
    CHECK(sum == phase.bytes);
  }
  // The QKV phase ends in a short tile (its bias): the case the clamp is for.
  CHECK(tile_bytes(phases[0], phases[0].tiles - 1) < unsigned(kTileBytes));
}

namespace {

/// Walks a block's ring uses in order, as the consumer warps do, with each use taken by
/// owner(use, slot), and returns whether every warp waits for the rounds of each slot it
/// takes one after another (round 0 first): the condition under which a wait that names
/// its phase by parity alone cannot mistake an earlier round for the one it wants.
template <typename Owner>
bool parity_waits_unambiguous(int slots, unsigned uses, Owner owner) {
  std::map<std::pair<int, unsigned>, long long> last_round;  // (warp, slot) -> round it last took
  for (unsigned use = 0; use < uses; ++use) {
    const unsigned slot = use % unsigned(slots), round = use / unsigned(slots);
    const int warp = owner(use, slot);
    const auto key = std::make_pair(warp, slot);
    const long long previous = last_round.count(key) ? last_round[key] : -1;
    if ((long long)(round) != previous + 1) return false;
    last_round[key] = round;
  }
  return true;
}

}  // namespace

TEST_CASE("megakernel schedule: a warp a tile, each ring slot has one owner warp", "[ch08][megakernel]") {
  const int warps = 8;
  const auto by_slot = [&](unsigned, unsigned slot) { return slot_owner(slot, warps); };
  const auto by_use = [&](unsigned use, unsigned) { return int(use % unsigned(warps)); };
  for (int slots : {2, 4, 6, 8, 12}) {
    INFO("slots " << slots);
    CHECK(parity_waits_unambiguous(slots, 1433, by_slot));  // a token's tiles an SM
    // Dealt by use, only a ring of a multiple of 8 slots keeps a slot with one warp.
    CHECK(parity_waits_unambiguous(slots, 1433, by_use) == (slots % warps == 0));
    // Every slot has an owner among the warps, and min(slots, warps) warps own slots.
    std::set<int> owners;
    for (int s = 0; s < slots; ++s) {
      const int w = slot_owner(unsigned(s), warps);
      CHECK(w >= 0);
      CHECK(w < warps);
      owners.insert(w);
    }
    CHECK(int(owners.size()) == std::min(slots, warps));
  }
  // 12 slots: warps 0-3 own two slots each, warps 4-7 one (the rows' uneven deal).
  std::vector<int> owned(warps, 0);
  for (int s = 0; s < 12; ++s) ++owned[size_t(slot_owner(unsigned(s), warps))];
  CHECK(owned == std::vector<int>{2, 2, 2, 2, 1, 1, 1, 1});
}
