/// @file embedding_row.cuh
/// @brief Chapter 01's row copy, as a device function: v2's block copies its token's row
/// with it, and chapter 08's decode argmax copies the next step's input row with it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace bielik {

/// Whether a row copy may use 16-byte accesses: every row of a (V, C) table starts on a
/// 16-byte boundary when C % 8 == 0, and the table and the output must start on one too.
inline bool embedding_rows_vectorizable(const __nv_bfloat16* out, const __nv_bfloat16* table, int C) {
  return C % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0;
}

/// out_row (C) = table[id] (a row of the (V, C) table), or zeros when id is outside
/// [0, V) (never a read out of bounds). Thread `thread` of `threads` copies every
/// threads-th piece: 16 bytes (8 values) with Vectorized (embedding_rows_vectorizable
/// must hold), else one value.
template <bool Vectorized>
__device__ __forceinline__ void embedding_copy_row(__nv_bfloat16* out_row, const __nv_bfloat16* table, int32_t id,
                                                   int C, int V, int thread, int threads) {
  const bool valid = id >= 0 && id < V;
  const __nv_bfloat16* table_row = table + size_t(valid ? id : 0) * C;
  if constexpr (Vectorized) {
    const int vectors = C / 8;
    const int4* source = reinterpret_cast<const int4*>(table_row);
    int4* destination = reinterpret_cast<int4*>(out_row);
    for (int v = thread; v < vectors; v += threads) {
      destination[v] = valid ? __ldg(&source[v]) : make_int4(0, 0, 0, 0);
    }
  } else {
    for (int c = thread; c < C; c += threads) {
      out_row[c] = valid ? table_row[c] : __float2bfloat16(0.0f);
    }
  }
}

}  // namespace bielik
