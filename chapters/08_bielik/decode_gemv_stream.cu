// decode_gemv on Hopper: the weights come through a ring of shared-memory stages that
// the bulk-copy engine fills (chapter 03's weight_stream.cuh), instead of register loads.
//
// The measured counter-example: it lost to the register version
// (decode_gemv_register_kernels.cuh, the model's default) on every GEMV of a layer, by up
// to 2.3x on the lm_head (DECODE_LOG.md, "Where the decode time goes"). One row-chunk of
// ~3 KB a stage, behind a block-wide barrier, is too small and too serialized for the
// copy engine, where the register version keeps ~6 KB a warp in flight from 24 warps an
// SM. It is kept, tested and benchmarked for that lesson.
//
// Why it was expected to be faster: measured alone with Nsight Compute on the H200, the
// first register GEMVs of a Bielik layer reached 20-60% of peak DRAM throughput (gate/up
// 59%, down 46%, QKV 21%). Each warp issued its next loads only after using the last
// ones, a block's rows were spread over warps with uneven counts, and the bytes in flight
// were capped by registers. Here:
//  * Each block owns a contiguous range of output rows (ranges balanced to within one
//    row), so its weights are one contiguous run of memory, and it streams that run in
//    stages of one row-chunk (up to 2048 values; a gate row and its up row together for
//    the SwiGLU). ~48 KB per block are in flight at all times, ~16 MB over the GPU.
//  * Thread 0 requests the first stages BEFORE the PDL wait: the weights of the small
//    projections (QKV, O: ~20 KB a block) are on chip before the previous kernel ends.
//  * All 256 threads share a stage (one 16-byte vector each), so a row's sum is a warp
//    reduction plus 8 partials in shared memory, and one barrier per stage serves both
//    the ring (the slot can be refilled) and the row sums (they can be read).
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "decode_device.cuh"
#include "decode_kernels.cuh"
#include "matmul_common.cuh"
#include "weight_stream.cuh"

namespace bielik {

using namespace decode_device;

namespace {

constexpr int kMaxChunk = 8 * kThreads;          // values of one row per stage: one uint4 per thread
constexpr int kBarrierBytes = 256;               // room for up to 32 stage barriers
constexpr int kMaxStages = kBarrierBytes / 8;
constexpr int kInFlightTarget = 48 * 1024;       // bytes of ring per block

// How a row of K values is cut into stages: `count` chunks of `values` (the last may be
// shorter), each a multiple of 8 values (16-byte copies).
struct Chunking {
  int values;
  int count;
};

Chunking chunking_for(int K) {
  const int count = (K + kMaxChunk - 1) / kMaxChunk;
  const int values = ((K + count - 1) / count + 7) / 8 * 8;
  return {values, (K + values - 1) / values};
}

template <GemvInput In, GemvOutput Out, bool HasBias>
__global__ void __launch_bounds__(kThreads)
    decode_gemv_stream_kernel(DecodeGemvParams p, int chunk_values, int chunks_per_row, int stages) {
  constexpr int kRows = Out == GemvOutput::kSwiGLU ? 2 : 1;  // gate row n and up row N + n
  // Shared memory: the stage barriers | the input vector (K values) | the ring.
  extern __shared__ __align__(128) unsigned char shared[];
  uint64_t* barriers = reinterpret_cast<uint64_t*>(shared);
  uint4* x_shared = reinterpret_cast<uint4*>(shared + kBarrierBytes);
  unsigned char* ring = shared + kBarrierBytes + (size_t(p.K) * 2 + 127) / 128 * 128;
  __shared__ float row_partial[2][kWarps][kRows];  // double-buffered by row parity
  __shared__ float scratch[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // This block's rows: [row_begin, row_end), balanced over the grid.
  const int row_begin = int((long long)blockIdx.x * p.N / gridDim.x);
  const int row_end = int((long long)(blockIdx.x + 1) * p.N / gridDim.x);
  const int slot_bytes = kRows * chunk_values * 2;
  WeightStream stream;
  stream.init(ring, barriers, stages, slot_bytes, (row_end - row_begin) * chunks_per_row);
  // Stage s = chunk (s % chunks_per_row) of row row_begin + s / chunks_per_row; the up
  // row's chunk sits right after the gate row's in the slot.
  auto fetch = [&](int s, unsigned char* slot, uint64_t* barrier) {
    const int row = row_begin + s / chunks_per_row;
    const int first = (s % chunks_per_row) * chunk_values;
    const uint32_t bytes = uint32_t(min(chunk_values, p.K - first)) * 2;
    expect_bytes(barrier, kRows * bytes);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      copy_async_bulk(slot + r * chunk_values * 2, p.W + (size_t(row) + size_t(r) * p.N) * p.K + first, bytes,
                      barrier);
    }
  };
  // 1. The weights first: nothing writes them, so no need to wait for the previous kernel.
  stream.prefill(fetch);
  uint4 norm_held[kNormHeld];
  load_norm_weight<In>(p, norm_held);
  __syncthreads();  // the barriers are initialized before anyone waits on them

  // 2. The input vector (normalized for kRmsNorm), after the previous kernel is done.
  stage_input<In>(p, x_shared, scratch, norm_held);
  pdl_allow_dependents();

  // 3. The stages. Thread t takes vector t of the chunk (and of the up row's chunk).
  float acc[kRows] = {};
  for (int s = 0; s < stream.total; ++s) {
    const int row = row_begin + s / chunks_per_row, chunk = s % chunks_per_row;
    const int first_vector = chunk * chunk_values / 8;
    const int vectors = (min(chunk_values, p.K - chunk * chunk_values)) / 8;
    stream.wait(s);
    const uint4* slot = reinterpret_cast<const uint4*>(stream.stage(s));
    if (threadIdx.x < vectors) {
      const uint4 xv = x_shared[first_vector + threadIdx.x];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = dot_8(slot[r * (chunk_values / 8) + threadIdx.x], xv, acc[r]);
    }
    const bool row_done = chunk == chunks_per_row - 1;
    if (row_done) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sum = warp_sum(acc[r]);
        if (lane == 0) row_partial[row & 1][warp][r] = sum;
        acc[r] = 0.0f;
      }
    }
    __syncthreads();  // the slot is free, and the row's partials are visible
    stream.refill(s, fetch);
    // Thread 0 finishes the row. The partials of this parity are rewritten two rows
    // later, after at least one more barrier: no race with this read.
    if (row_done && threadIdx.x == 0) {
      float total[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total[r] += row_partial[row & 1][w][r];
      }
      store_output<Out, HasBias>(p, row, total);
    }
  }
}

template <GemvInput In, GemvOutput Out, bool HasBias>
void launch_stream(const DecodeGemvParams& p, bool pdl, cudaStream_t stream) {
  constexpr int kRows = Out == GemvOutput::kSwiGLU ? 2 : 1;
  const Chunking chunks = chunking_for(p.K);
  const int slot_bytes = kRows * chunks.values * 2;
  const int stages = std::clamp(kInFlightTarget / slot_bytes, 2, kMaxStages);
  const size_t shared_bytes = kBarrierBytes + (size_t(p.K) * 2 + 127) / 128 * 128 + size_t(stages) * slot_bytes;
  auto kernel = decode_gemv_stream_kernel<In, Out, HasBias>;
  // Shapes of one model repeat every layer: the occupancy per shared-memory size is
  // asked once. The dynamic shared memory allowed grows to the largest size asked for.
  static std::map<size_t, int> blocks_per_sm;
  static size_t shared_allowed = 48 * 1024;
  if (shared_bytes > shared_allowed) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
    shared_allowed = shared_bytes;
  }
  auto known = blocks_per_sm.find(shared_bytes);
  if (known == blocks_per_sm.end()) {
    int blocks = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, shared_bytes));
    if (blocks < 1) {
      throw std::invalid_argument("decode_gemv (bulk stream): " + std::to_string(shared_bytes) +
                                  " bytes of shared memory do not fit (K=" + std::to_string(p.K) + ")");
    }
    known = blocks_per_sm.emplace(shared_bytes, std::min(blocks, 3)).first;
  }
  // One wave, every block resident from the start (the prefill before the PDL wait needs
  // that), and never more blocks than rows.
  const int blocks = std::min(p.N, multiprocessor_count() * known->second);
  launch_kernel(pdl, kernel, dim3(blocks), dim3(kThreads), shared_bytes, stream, p, chunks.values, chunks.count, stages);
}

template <GemvInput In, GemvOutput Out>
void launch_stream_bias(const DecodeGemvParams& p, bool pdl, cudaStream_t stream) {
  with_bias_flag(p.bias, [&](auto has_bias) { launch_stream<In, Out, decltype(has_bias)::value>(p, pdl, stream); });
}

template <GemvInput In>
void launch_stream_output(GemvOutput output, const DecodeGemvParams& p, bool pdl, cudaStream_t stream) {
  switch (output) {
    case GemvOutput::kBf16: launch_stream_bias<In, GemvOutput::kBf16>(p, pdl, stream); break;
    case GemvOutput::kF32: launch_stream_bias<In, GemvOutput::kF32>(p, pdl, stream); break;
    case GemvOutput::kSwiGLU: launch_stream_bias<In, GemvOutput::kSwiGLU>(p, pdl, stream); break;
    case GemvOutput::kResidualAdd: launch_stream_bias<In, GemvOutput::kResidualAdd>(p, pdl, stream); break;
    case GemvOutput::kRopeAppend: throw std::invalid_argument("decode_gemv_stream: no kRopeAppend form");
  }
}

}  // namespace

void decode_gemv_stream(GemvInput input, GemvOutput output, const DecodeGemvParams& p, bool pdl,
                        cudaStream_t stream) {
  if (input == GemvInput::kRmsNorm) {
    launch_stream_output<GemvInput::kRmsNorm>(output, p, pdl, stream);
  } else if (input != GemvInput::kPlain) {
    throw std::invalid_argument("decode_gemv_stream: only the kPlain and kRmsNorm inputs have a bulk-stream form");
  } else {
    launch_stream_output<GemvInput::kPlain>(output, p, pdl, stream);
  }
}

}  // namespace bielik
