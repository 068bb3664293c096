/// @file embedding.cuh
/// @brief Chapter 01: token embedding lookup (a gather of table rows).
///
/// out[t, :] = table[token_ids[t], :] for t in 0..T-1.
///
/// Symbols (docs/conventions.md): T tokens, C hidden size, V vocabulary size.
/// All GPU pointers are device pointers; bf16 is `__nv_bfloat16`.
///
/// Invalid ids: an id outside [0, V) would read outside the table. Every kernel checks
/// each id; for a bad one it writes a zero row (never reads out of bounds) and adds 1
/// to `*invalid_id_count` when that pointer is not null. The model validates prompt ids
/// on the host before they reach the GPU; the counter is the GPU's own safety net and
/// what the tests use to prove the check is there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace bielik {

/// Plain C++ reference (fp32 values of the bf16 table). Throws std::out_of_range naming
/// the position and the id for an id outside [0, V).
/// @param out       (T, C) output rows
/// @param table     (V, C) embedding table
/// @param token_ids (T)    token ids
void embedding_cpu(float* out, const float* table, const int32_t* token_ids, int T, int C, int V);

/// v1: one thread per output element. Simple, coalesced, but 2-byte accesses.
/// @param out              (T, C) device, written fully
/// @param table            (V, C) device
/// @param token_ids        (T) device
/// @param invalid_id_count (1) device counter, may be nullptr
void embedding_v1_thread_per_element(__nv_bfloat16* out, const __nv_bfloat16* table, const int32_t* token_ids,
                                     int T, int C, int V, int* invalid_id_count, cudaStream_t stream = 0);

/// v2: one block per row, 16-byte (8 x bf16) vector copies when C % 8 == 0,
/// scalar copies otherwise. Same parameters as v1.
void embedding_v2_row_vectorized(__nv_bfloat16* out, const __nv_bfloat16* table, const int32_t* token_ids,
                                 int T, int C, int V, int* invalid_id_count, cudaStream_t stream = 0);

/// v3: one warp per row, four 16-byte loads in flight per thread before the stores
/// (C % 8 == 0; other C use v2's scalar path). Same parameters as v1.
void embedding_v3_warp_per_row(__nv_bfloat16* out, const __nv_bfloat16* table, const int32_t* token_ids, int T,
                               int C, int V, int* invalid_id_count, cudaStream_t stream = 0);

/// Every GPU version, in order, so tests and the benchmark loop over the same list.
using EmbeddingLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const int32_t*, int, int, int, int*,
                                   cudaStream_t);
struct EmbeddingVersion {
  const char* name;
  EmbeddingLauncher launch;
};
inline constexpr EmbeddingVersion kEmbeddingVersions[] = {
    {"v1_thread_per_element", embedding_v1_thread_per_element},
    {"v2_row_vectorized", embedding_v2_row_vectorized},
    {"v3_warp_per_row", embedding_v3_warp_per_row},
};

/// The version later chapters call. Measured on the H200 (README): v3 wins on long
/// prompts (93% of copy bandwidth at T=32768), v2 on a handful of rows (decode, T = 1),
/// where v3's 256-thread blocks with one busy warp only add latency; at T = 4096 they
/// tie (11.5 us each). Where between 1 and 4096 v2 stops winning on the H200 was not
/// recorded, so the switch at 512 is a choice inside the tie. On an H100 (README,
/// bench_embedding_h100.txt) v2 wins up to T = 2048 and ties v3 from 4096 on, so there
/// the switch at 512 costs 0.3-0.7 us at 1024-2048 rows; it stays until an H200 run
/// says where that card's crossover is.
inline void embedding_forward(__nv_bfloat16* out, const __nv_bfloat16* table, const int32_t* token_ids, int T,
                              int C, int V, int* invalid_id_count, cudaStream_t stream = 0) {
  if (T <= 512) {
    embedding_v2_row_vectorized(out, table, token_ids, T, C, V, invalid_id_count, stream);
  } else {
    embedding_v3_warp_per_row(out, table, token_ids, T, C, V, invalid_id_count, stream);
  }
}

}  // namespace bielik
