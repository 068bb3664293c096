/// @file decode_side_prefetch.cuh
/// @brief Chapter 08: ask L2 for weights from a kernel OUTSIDE the decode step's chain.
///
/// From the end of one layer's down projection to the end of the next layer's O
/// projection, the step is latency-bound (QKV, the attention, O: ~10 us a layer with
/// ~11 MB of weights), and HBM is mostly idle, while gate/up, 55 MB, waits its turn.
/// Earlier sessions asked L2 for part of gate/up's weights from INSIDE the chain (the
/// small GEMVs, or gate/up's own blocks) and lost every time: a PDL dependent's
/// `griddepcontrol.wait` returns only once the kernel before it has finished and its
/// memory operations are complete, so prefetches still queued at a boundary lengthen it
/// (DECODE_LOG.md, seventeenth session). Here the prefetches come from a small kernel on
/// a second stream of the captured graph: it depends on the previous layer's down
/// projection, but no kernel of the chain depends on it (the branch rejoins after the
/// step's last kernel), so no boundary of the chain waits for its requests.
///
/// What it asks for: the last rows of the layer's gate and up weights, which the last
/// blocks of the gate/up GEMV read (block b of decode_gemv reads units b * u .. b * u + u
/// - 1 of each half: the blocks that start late, when O's blocks leave, read the tail),
/// and optionally the last rows of the down weights.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace bielik {

/// Contiguous bytes to ask L2 for. begin 16-byte aligned and bytes a multiple of 16 for
/// the bulk and load forms; the per-line form takes any range.
struct L2PrefetchRange {
  const void* begin = nullptr;
  size_t bytes = 0;
};

constexpr int kMaxL2PrefetchRanges = 3;

/// How the kernel asks for the bytes.
enum class L2PrefetchForm {
  kLines,  ///< one `prefetch.global.L2` per stride_bytes (an L2 line is 128 bytes in four
           ///< 32-byte sectors), spread over every thread
  kBulk,   ///< one `cp.async.bulk.prefetch.L2` per kL2BulkPrefetchChunk bytes (sm_90)
  kLoads,  ///< ordinary 16-byte loads (no L1 allocation) whose values are dropped
           ///< (into `checksum` when it is set): a prefetch that costs registers and
           ///< issue slots, and should land as a read does (bench_l2_prefetch's warm row)
};

struct L2PrefetchPlan {
  L2PrefetchRange range[kMaxL2PrefetchRanges];
  int count = 0;
  L2PrefetchForm form = L2PrefetchForm::kLines;
  int stride_bytes = 128;  ///< kLines: one request per this many bytes (32, 64 or 128)
  /// kLoads, measurement only (bench_l2_prefetch): every thread XORs the 32-bit words it
  /// loaded into *checksum, which proves that the loads happened. nullptr: no output.
  unsigned* checksum = nullptr;
};

constexpr size_t kL2BulkPrefetchChunk = 16384;

/// Launches the prefetching kernel on `stream` (`blocks` blocks of 256 threads). Nothing
/// is written but the load form's optional checksum; the kernel ends once its requests
/// are issued (the load form: once its loads have arrived). Throws
/// std::invalid_argument for a bad plan (a null or, in the bulk and load forms, misaligned range;
/// a stride other than 32, 64 or 128).
void l2_prefetch(const L2PrefetchPlan& plan, int blocks, cudaStream_t stream);

}  // namespace bielik
