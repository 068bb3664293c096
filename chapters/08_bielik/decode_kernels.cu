// The fused decode kernels (decode_kernels.cuh): decode_gemv's checks and its dispatch
// to the kernel asked for (the register GEMV, the default, in
// decode_gemv_register_kernels.cuh; the tensor-core and bulk-stream ones in
// decode_gemv_mma.cu and decode_gemv_stream.cu), the separate RoPE + cache append, and
// the argmax.
#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "decode_gemv_register.cuh"
#include "decode_kernels.cuh"
#include "embedding_row.cuh"  // chapter 01: the row copy
#include "weight_stream.cuh"

namespace bielik {

using namespace decode_device;

namespace {

constexpr int kMaxK = kDecodeGemvMaxK;  // K bf16 values of shared memory: 32 KB, under the 48 KB default

// The register GEMV's forms for input In, by output (decode_gemv_register.cuh).
template <GemvInput In>
void launch_gemv_output(GemvOutput output, const DecodeGemvParams& p, bool pipelined, bool pdl,
                        cudaStream_t stream) {
  switch (output) {
    case GemvOutput::kBf16: register_gemv::launch<In, GemvOutput::kBf16>(p, pipelined, pdl, stream); break;
    case GemvOutput::kF32: register_gemv::launch<In, GemvOutput::kF32>(p, pipelined, pdl, stream); break;
    case GemvOutput::kSwiGLU: register_gemv::launch<In, GemvOutput::kSwiGLU>(p, pipelined, pdl, stream); break;
    case GemvOutput::kResidualAdd: register_gemv::launch<In, GemvOutput::kResidualAdd>(p, pipelined, pdl, stream); break;
    case GemvOutput::kRopeAppend: register_gemv::launch<In, GemvOutput::kRopeAppend>(p, pipelined, pdl, stream); break;
  }
}


// One thread per rotation pair (q and k heads) and per v value: every thread makes the
// same two trips to memory (the position, then its inputs), instead of a single block
// looping over ~1k values with a memory round trip per iteration.
__global__ void __launch_bounds__(128) decode_rope_append_kernel(
    __nv_bfloat16* qkv,        // (H + 2 Hkv, D)
    __nv_bfloat16* k_cache,    // (Hkv, max_context, D)
    __nv_bfloat16* v_cache,    // (Hkv, max_context, D)
    const int* d_length,       // (1)
    const float* cos_table,    // (max_positions, D/2)
    const float* sin_table,    // (max_positions, D/2)
    int H, int Hkv, int D, int max_context, int max_positions) {
  pdl_wait();
  pdl_allow_dependents();
  const int pos = *d_length;
  const bool valid = pos >= 0 && pos < max_context && pos < max_positions;
  const int half = D / 2;
  const int pairs = (H + Hkv) * half;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < pairs) {
    const int head = i / half, j = i % half;
    __nv_bfloat16* x = qkv + size_t(head) * D;
    const float x1 = __bfloat162float(x[j]), x2 = __bfloat162float(x[j + half]);
    const float c = valid ? cos_table[size_t(pos) * half + j] : NAN;
    const float s = valid ? sin_table[size_t(pos) * half + j] : NAN;
    const __nv_bfloat16 first = __float2bfloat16(rope_rotate_first(x1, x2, c, s));  // HF rotate-half
    const __nv_bfloat16 second = __float2bfloat16(rope_rotate_second(x1, x2, c, s));
    if (head < H) {
      x[j] = first;
      x[j + half] = second;
    } else if (valid) {
      __nv_bfloat16* k = k_cache + (size_t(head - H) * max_context + pos) * D;
      k[j] = first;
      k[j + half] = second;
    }
  } else if (i < pairs + Hkv * D && valid) {
    const int index = i - pairs, head = index / D, d = index % D;
    v_cache[(size_t(head) * max_context + pos) * D + d] = qkv[size_t(H + Hkv) * D + index];
  }
}

constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads) decode_argmax_kernel(int32_t* token,       // (1)
                                                                       const float* logits,  // (V)
                                                                       int V, int* d_length,
                                                                       int32_t* history,  // (history_size) or null
                                                                       int history_size, NextInputRow next,
                                                                       bool next_vectorized) {
  pdl_wait();
  pdl_allow_dependents();
  const int32_t chosen = block_argmax_commit<kArgmaxThreads>(token, logits, V, d_length, history, history_size);
  if (next.table == nullptr) return;
  // The next step's input row, copied as chapter 01's embedding copies a row (zeros for
  // the -1 of a NaN): 16-byte pieces where the launcher found the pointers and C allow it.
  if (next_vectorized) {
    embedding_copy_row<true>(next.x, next.table, chosen, next.C, V, threadIdx.x, kArgmaxThreads);
  } else {
    embedding_copy_row<false>(next.x, next.table, chosen, next.C, V, threadIdx.x, kArgmaxThreads);
  }
}

}  // namespace

void decode_gemv(GemvInput input, GemvOutput output, const DecodeGemvParams& params, bool pdl, cudaStream_t stream,
                 DecodeGemvKernel kernel) {
  DecodeGemvParams p = params;  // (a copy: the folded argmax's row-copy form is decided here)
  if (p.argmax.token) {
    const ArgmaxFold& f = p.argmax;
    const bool register_loads = kernel == DecodeGemvKernel::kAuto || kernel == DecodeGemvKernel::kRegisterLoads;
    if (output != GemvOutput::kF32 || !register_loads || !f.block_best || !f.blocks_done || f.capacity < 1 ||
        (f.history && (!f.d_length || f.history_size < 1)) || (f.next.table && (!f.next.x || f.next.C <= 0))) {
      throw std::invalid_argument(
          "decode_gemv: a folded argmax needs kF32 on the register kernel (kAuto or kRegisterLoads), block_best with "
          "capacity >= 1 and blocks_done; a history needs d_length and history_size >= 1, the next input row its "
          "destination and C >= 1");
    }
    p.argmax.next_vectorized = f.next.table && embedding_rows_vectorizable(f.next.x, f.next.table, f.next.C);
  }
  const bool x_needed = input != GemvInput::kAttentionMerge;
  if (p.K <= 0 || p.N <= 0 || p.K % 8 != 0 || p.K > kMaxK || !p.y || (x_needed && !aligned_16(p.x)) ||
      !aligned_16(p.W) ||
      (input == GemvInput::kRmsNorm && (!p.norm_weight || !aligned_16(p.norm_weight)))) {
    throw std::invalid_argument("decode_gemv: needs 0 < K <= " + std::to_string(kMaxK) +
                                ", K % 8 == 0, N > 0 and 16-byte aligned x, W (and norm weight); got N=" +
                                std::to_string(p.N) + " K=" + std::to_string(p.K));
  }
  if (p.split_warps != 0 && p.split_warps != 1 && p.split_warps != 2 && p.split_warps != 4 && p.split_warps != 8) {
    throw std::invalid_argument("decode_gemv: split_warps must be 0 (automatic), 1, 2, 4 or 8; got " +
                                std::to_string(p.split_warps));
  }
  if (p.rows_per_warp < 0) {
    throw std::invalid_argument("decode_gemv: rows_per_warp must be 0 (one wave) or more; got " +
                                std::to_string(p.rows_per_warp));
  }
  if (p.loads_before_wait < 0 ||
      (p.loads_before_wait > 0 && (p.second_batch_in_shared || p.input_from_global))) {
    throw std::invalid_argument("decode_gemv: loads_before_wait must be >= 0, and does not combine with "
                                "second_batch_in_shared or input_from_global; got " +
                                std::to_string(p.loads_before_wait));
  }
  if (p.split_blocks < 0) {
    throw std::invalid_argument("decode_gemv: split_blocks must be >= 0 (0: every block splits); got " +
                                std::to_string(p.split_blocks));
  }
  if (p.split_rest != SplitBatchRest::kAfterStaging && p.loads_before_wait == 0) {
    throw std::invalid_argument("decode_gemv: split_rest says when the rest of a split first batch goes out, and "
                                "needs loads_before_wait > 0");
  }
  if (output == GemvOutput::kRopeAppend) {
    const RopeAppendTarget& t = p.rope;
    if (!t.k_cache || !t.v_cache || !t.d_length || !t.cos || !t.sin || t.D <= 0 || t.D % 2 != 0 || t.H <= 0 ||
        t.Hkv <= 0 || p.N != (t.H + 2 * t.Hkv) * (t.D / 2) || t.max_context <= 0 || t.max_positions <= 0) {
      throw std::invalid_argument("decode_gemv kRopeAppend: needs the cache, length and RoPE table pointers, an even D "
                                  "and N = (H + 2 Hkv) D / 2; got N=" + std::to_string(p.N) + " H=" +
                                  std::to_string(t.H) + " Hkv=" + std::to_string(t.Hkv) + " D=" + std::to_string(t.D));
    }
    if (kernel == DecodeGemvKernel::kBulkStream) {
      throw std::invalid_argument("decode_gemv: the bulk-stream kernel has no kRopeAppend form");
    }
  }
  if (input == GemvInput::kAttentionMerge) {
    const AttentionMergeSource& a = p.merge;
    if (output != GemvOutput::kResidualAdd || kernel == DecodeGemvKernel::kBulkStream || !a.partial_acc ||
        !a.partial_ml || !a.d_length || a.H <= 0 || a.D <= 0 || a.D % 8 != 0 || p.K != a.H * a.D ||
        a.num_splits < 1 || a.min_keys_per_split < 1 || a.max_context < 1 || a.new_tokens < 0 ||
        !aligned_16(a.partial_acc)) {
      throw std::invalid_argument(
          "decode_gemv kAttentionMerge: needs kResidualAdd, a register kernel, the partials and length pointers, "
          "D % 8 == 0, K = H * D, num_splits >= 1, min_keys_per_split >= 1, max_context >= 1; got K=" +
          std::to_string(p.K) + " H=" + std::to_string(a.H) + " D=" + std::to_string(a.D) + " splits=" +
          std::to_string(a.num_splits));
    }
  }
  if (input == GemvInput::kRmsNormAddPartials) {
    // gate/up after the fused attention + O (kSwiGLU); QKV (kRopeAppend) and the lm_head
    // (kF32) after the fused MLP (decode_mlp_fused.cuh), QKV on the tensor cores too.
    const ResidualPartials& rp = p.residual_partials;
    const bool compiled = output == GemvOutput::kSwiGLU || output == GemvOutput::kRopeAppend ||
                          output == GemvOutput::kF32;
    const bool tensor_cores_take_it = output == GemvOutput::kRopeAppend;
    if (!compiled || kernel == DecodeGemvKernel::kBulkStream ||
        (kernel == DecodeGemvKernel::kTensorCores && !tensor_cores_take_it) || !rp.partials || !p.norm_weight ||
        !aligned_16(p.norm_weight)) {
      throw std::invalid_argument(
          "decode_gemv kRmsNormAddPartials: needs kSwiGLU, kRopeAppend or kF32 on a register kernel (kRopeAppend "
          "on the tensor cores too), the partials pointer and a 16-byte aligned norm weight");
    }
  }
  if (p.residual_partials.partials) {
    const ResidualPartials& rp = p.residual_partials;
    const bool reader = input == GemvInput::kRmsNormAddPartials || output == GemvOutput::kResidualAdd;
    if (!reader || kernel == DecodeGemvKernel::kBulkStream || rp.count < 1 || rp.count > kMaxResidualPartials ||
        !aligned_16(rp.partials)) {
      throw std::invalid_argument("decode_gemv: residual partials need kRmsNormAddPartials or kResidualAdd, a register "
                                  "kernel, 1 <= count <= " + std::to_string(kMaxResidualPartials) +
                                  " and 16-byte aligned partials; got count=" + std::to_string(rp.count));
    }
  }
  static const bool have_bulk_copy = weight_stream_supported();  // (one GPU a process assumed)
  if (kernel == DecodeGemvKernel::kBulkStream && !have_bulk_copy) {
    throw std::invalid_argument("decode_gemv: the bulk-stream kernel needs sm_90 or newer");
  }
  if (p.stage_input_bulk && !have_bulk_copy) {
    throw std::invalid_argument("decode_gemv: stage_input_bulk needs sm_90 or newer (the bulk-copy engine)");
  }
  if (kernel == DecodeGemvKernel::kBulkStream) {
    decode_gemv_stream(input, output, p, pdl, stream);
    return;
  }
  if (kernel == DecodeGemvKernel::kTensorCores) {
    decode_gemv_mma(input, output, p, pdl, stream);
    return;
  }
  const bool pipelined = kernel == DecodeGemvKernel::kRegisterPipelined;
  if (input == GemvInput::kAttentionMerge) {
    // Only the O projection's form is compiled: merged attention in, residual add out.
    register_gemv::launch<GemvInput::kAttentionMerge, GemvOutput::kResidualAdd>(p, pipelined, pdl, stream);
  } else if (input == GemvInput::kRmsNormAddPartials) {
    // Three forms are compiled: gate/up (SwiGLU out), QKV (RoPE + append) and the lm_head.
    if (output == GemvOutput::kSwiGLU) {
      register_gemv::launch<GemvInput::kRmsNormAddPartials, GemvOutput::kSwiGLU>(p, pipelined, pdl, stream);
    } else if (output == GemvOutput::kRopeAppend) {
      register_gemv::launch<GemvInput::kRmsNormAddPartials, GemvOutput::kRopeAppend>(p, pipelined, pdl, stream);
    } else {
      register_gemv::launch<GemvInput::kRmsNormAddPartials, GemvOutput::kF32>(p, pipelined, pdl, stream);
    }
  } else if (input == GemvInput::kRmsNorm) {
    launch_gemv_output<GemvInput::kRmsNorm>(output, p, pipelined, pdl, stream);
  } else {
    launch_gemv_output<GemvInput::kPlain>(output, p, pipelined, pdl, stream);
  }
}

void decode_rope_append(__nv_bfloat16* qkv, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, const int* d_length,
                        const RopeTable& table, int H, int Hkv, int max_context, bool pdl, cudaStream_t stream) {
  if (table.D <= 0 || table.cos.size() == 0) throw std::invalid_argument("decode_rope_append: table not built");
  const int threads = (H + Hkv) * (table.D / 2) + Hkv * table.D;
  launch_kernel(pdl, decode_rope_append_kernel, dim3((threads + 127) / 128), dim3(128), 0, stream, qkv, k_cache, v_cache,
         d_length,
         static_cast<const float*>(table.cos.data()), static_cast<const float*>(table.sin.data()), H, Hkv, table.D,
         max_context, table.max_positions);
}

void decode_argmax(int32_t* token, const float* logits, int V, int* d_length, bool pdl, cudaStream_t stream,
                   int32_t* history, int history_size, NextInputRow next) {
  if (V <= 0) throw std::invalid_argument("decode_argmax: V must be positive");
  if (history && (!d_length || history_size < 1)) {
    throw std::invalid_argument("decode_argmax: a history needs the length pointer and a size >= 1");
  }
  if (next.table && (!next.x || next.C <= 0)) {
    throw std::invalid_argument("decode_argmax: the next input row needs its destination and C >= 1");
  }
  const bool next_vectorized = next.table && embedding_rows_vectorizable(next.x, next.table, next.C);
  launch_kernel(pdl, decode_argmax_kernel, dim3(1), dim3(kArgmaxThreads), 0, stream, token, logits, V, d_length,
                history, history_size, next, next_vectorized);
}

int32_t decode_argmax_cpu(const float* logits, int V) {
  int32_t best = -1;
  for (int i = 0; i < V; ++i) {
    if (std::isnan(logits[i])) return -1;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace bielik
