// The persistent decode step (decode_persistent.cuh): one kernel per token.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_device.cuh"
#include "decode_device.cuh"
#include "decode_persistent.cuh"
#include "decode_persistent_device.cuh"
#include "matmul_common.cuh"

namespace bielik {

using namespace decode_device;
using namespace persistent_device;

namespace {

// --- GEMV phases --------------------------------------------------------------------------
template <GemvOutput Out, int kBatch>
struct WeightBatch {
  uint4 w[rows_per_unit<Out>()][kBatch];
};

// This warp's units [x, y) of a GEMV with N units, spread over every warp of the grid in
// contiguous runs (neighbouring rows are neighbouring memory).
__device__ __forceinline__ int2 warp_units(int N) {
  const long long warps = (long long)gridDim.x * kWarps;
  const long long w = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  return make_int2(int(w * N / warps), int((w + 1) * N / warps));
}

// The first batch of this warp's first unit: issued before the barrier that ends the
// previous phase, so the bytes are on their way while the grid synchronizes.
template <GemvOutput Out, int kBatch>
__device__ __forceinline__ void prefetch_first_batch(WeightBatch<Out, kBatch>& batch, const DecodeGemvParams& p) {
  const int2 units = warp_units(p.N);
  load_batch<Out, kBatch>(batch.w, p, units.x < units.y ? units.x : -1, threadIdx.x % 32, 32, l2_policy(false));
}

// One GEMV over the whole grid: stage (and normalize) the input, then each warp its
// units, the next step's loads issued before the current step's math.
template <GemvInput In, GemvOutput Out, int kBatch>
__device__ __forceinline__ void gemv_phase(const DecodeGemvParams& p, WeightBatch<Out, kBatch>& batch,
                                           uint4* x_shared, float* scratch) {
  constexpr int kRows = rows_per_unit<Out>();
  uint4 norm_held[kNormHeld];
  load_norm_weight<In>(p, norm_held);
  stage_input<In, true>(p, x_shared, scratch, norm_held);
  const int lane = threadIdx.x % 32;
  const int2 units = warp_units(p.N);
  const int chunks = p.K / 8;
  const int batches_per_unit = (chunks + kBatch * 32 - 1) / (kBatch * 32);
  const int steps = (units.y - units.x) * batches_per_unit;
  WeightBatch<Out, kBatch> next;
  float acc[2] = {0.0f, 0.0f};
  for (int step = 0; step < steps; ++step) {
    const int unit = units.x + step / batches_per_unit, base = (step % batches_per_unit) * kBatch * 32 + lane;
    if (step + 1 < steps) {
      const int next_unit = units.x + (step + 1) / batches_per_unit;
      load_batch<Out, kBatch>(next.w, p, next_unit, ((step + 1) % batches_per_unit) * kBatch * 32 + lane, 32,
                                l2_policy(false));
    }
    accumulate_batch<kRows, kBatch>(acc, batch.w, x_shared, base, 32, chunks);
    if (step % batches_per_unit == batches_per_unit - 1) {
      if (p.bias) {
        finish_row<Out, true>(p, unit, acc, nullptr, 1);
      } else {
        finish_row<Out, false>(p, unit, acc, nullptr, 1);
      }
    }
    batch = next;
  }
}

// kBlocksPerSm: 2 caps registers at 128 (some spilling, 16 warps per SM), 1 lets the
// compiler keep everything in registers (8 warps per SM). bench_model measures both.
template <int D, int G, int kBlocksPerSm>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) decode_step_persistent_kernel(PersistentStep p) {
  extern __shared__ uint4 x_shared[];  // (max(C, F, H D) / 8) the current phase's input
  __shared__ float scratch[kWarps];
  const int C = p.C, QKV_PAIRS = (p.H + 2 * p.Hkv) * D / 2;
  int mark = 0;
  mark_phase(p, mark);

  // The projections of layer l, in the form decode_gemv takes them.
  auto qkv_params = [&](const PersistentLayer& layer) {
    DecodeGemvParams g{p.q, p.x, layer.input_norm, layer.w_qkv, layer.b_qkv, QKV_PAIRS, C, p.eps};
    g.rope = RopeAppendTarget{layer.k_cache, layer.v_cache, p.d_length, p.cos, p.sin, p.H, p.Hkv, D,
                              p.max_context, p.max_positions};
    return g;
  };
  auto o_params = [&](const PersistentLayer& layer) {
    return DecodeGemvParams{p.x, p.attn, nullptr, layer.w_o, layer.b_o, C, p.H * D, p.eps};
  };
  auto gate_up_params = [&](const PersistentLayer& layer) {
    return DecodeGemvParams{p.act, p.x, layer.post_norm, layer.w_gate_up, layer.b_gate_up, p.F, C, p.eps};
  };
  auto down_params = [&](const PersistentLayer& layer) {
    return DecodeGemvParams{p.x, p.act, nullptr, layer.w_down, layer.b_down, C, p.F, p.eps};
  };

  // 0. The embedding row of this step's token (written by the previous step's argmax).
  WeightBatch<GemvOutput::kRopeAppend, 6> qkv_batch;
  prefetch_first_batch(qkv_batch, qkv_params(p.layers[0]));
  {
    // A -1 (NaN logits last step) is reported to the host by the argmax; read row 0
    // rather than outside the table.
    const int token = min(max(__ldcg(p.token), 0), p.V - 1);
    const uint4* row = reinterpret_cast<const uint4*>(p.embed + size_t(token) * C);
    for (int c = blockIdx.x * kThreads + threadIdx.x; c < C / 8; c += gridDim.x * kThreads) {
      reinterpret_cast<uint4*>(p.x)[c] = __ldg(row + c);
    }
  }
  end_phase(p, mark);

  for (int l = 0; l < p.L; ++l) {
    const PersistentLayer layer = p.layers[l];
    gemv_phase<GemvInput::kRmsNorm, GemvOutput::kRopeAppend, 6>(qkv_params(layer), qkv_batch, x_shared, scratch);
    end_phase(p, mark);

    attention_splits<D, G>(p, layer);
    WeightBatch<GemvOutput::kResidualAdd, 8> o_batch;
    prefetch_first_batch(o_batch, o_params(layer));
    end_phase(p, mark);
    merge_splits<D>(p);
    end_phase(p, mark);

    gemv_phase<GemvInput::kPlain, GemvOutput::kResidualAdd, 8>(o_params(layer), o_batch, x_shared, scratch);
    WeightBatch<GemvOutput::kSwiGLU, 6> gate_up_batch;
    prefetch_first_batch(gate_up_batch, gate_up_params(layer));
    end_phase(p, mark);

    gemv_phase<GemvInput::kRmsNorm, GemvOutput::kSwiGLU, 6>(gate_up_params(layer), gate_up_batch, x_shared,
                                                            scratch);
    WeightBatch<GemvOutput::kResidualAdd, 9> down_batch;
    prefetch_first_batch(down_batch, down_params(layer));
    end_phase(p, mark);

    gemv_phase<GemvInput::kPlain, GemvOutput::kResidualAdd, 9>(down_params(layer), down_batch, x_shared, scratch);
    if (l + 1 < p.L) prefetch_first_batch(qkv_batch, qkv_params(p.layers[l + 1]));
    end_phase(p, mark);
  }

  DecodeGemvParams head{p.logits, p.x, p.final_norm, p.lm_head, nullptr, p.V, C, p.eps};
  WeightBatch<GemvOutput::kF32, 8> head_batch;
  prefetch_first_batch(head_batch, head);
  gemv_phase<GemvInput::kRmsNorm, GemvOutput::kF32, 8>(head, head_batch, x_shared, scratch);
  end_phase(p, mark);
  if (blockIdx.x == 0) block_argmax_commit<kThreads>(p.token, p.logits, p.V, p.d_length);
}

using StepKernel = void (*)(PersistentStep);

template <int D, int kBlocksPerSm>
StepKernel kernel_for(int G) {
  return decode::kernel_for_group(G, "persistent decode", [](auto group) -> StepKernel {
    return decode_step_persistent_kernel<D, decltype(group)::value, kBlocksPerSm>;
  });
}

}  // namespace

bool decode_step_persistent_supported(int D, int H, int Hkv) {
  if ((D != 64 && D != 128) || Hkv <= 0 || H % Hkv != 0 || H / Hkv > 8) return false;
  int device = 0, cooperative = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess) return false;
  return cooperative != 0;
}

void decode_step_persistent(const PersistentStep& step, int blocks_per_sm_wanted, cudaStream_t stream) {
  if (!decode_step_persistent_supported(step.D, step.H, step.Hkv) || step.splits < 1 || step.splits > kMaxSplits ||
      (blocks_per_sm_wanted != 1 && blocks_per_sm_wanted != 2) ||
      step.C % 8 != 0 || step.F % 8 != 0 || !step.layers || !step.barrier) {
    throw std::invalid_argument("persistent decode: unsupported shape or missing buffers (D=" +
                                std::to_string(step.D) + " H=" + std::to_string(step.H) +
                                " Hkv=" + std::to_string(step.Hkv) + " splits=" + std::to_string(step.splits) + ")");
  }
  const int G = step.H / step.Hkv;
  StepKernel kernel = blocks_per_sm_wanted == 1 ? (step.D == 128 ? kernel_for<128, 1>(G) : kernel_for<64, 1>(G))
                                                : (step.D == 128 ? kernel_for<128, 2>(G) : kernel_for<64, 2>(G));
  const size_t shared_bytes = size_t(std::max({step.C, step.F, step.H * step.D})) * sizeof(__nv_bfloat16);
  int blocks_per_sm = 0;
  if (shared_bytes > 48 * 1024) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  }
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, shared_bytes));
  if (blocks_per_sm < 1) throw std::invalid_argument("persistent decode: a block does not fit on an SM");
  const int blocks = multiprocessor_count() * std::min(blocks_per_sm, blocks_per_sm_wanted);

  launch_cooperative(kernel, blocks, shared_bytes, stream, step);
}

}  // namespace bielik
