/// @file weight_stream.cuh
/// @brief A ring of shared-memory stages that Hopper's bulk-copy engine (TMA) fills with
/// weight bytes while the block computes on earlier stages. Used by this chapter's
/// bench_weight_stream (the ring's ceiling) and by chapter 08's decode kernels
/// (decode_gemv_stream.cu, decode_kernels.cu, decode_step_streamed.cu; the attention's O
/// projection and decode_device.cuh take its copy_async_bulk and mbarrier helpers). None
/// of this chapter's GEMVs uses it: gemv_v1 and gemv_v2 stream with register loads
/// (ptx::load_streaming_16, matmul_ptx.cuh).
///
/// Why: a GEMV at T = 1 reads every weight byte once and does 2 flops per 2 bytes, so
/// its speed is the speed of the weight stream. Keeping HBM busy needs a few MB in
/// flight across the GPU (Little's law: bandwidth x latency, 4.2 TB/s x ~1.5 us). With
/// register loads (gemv_v1) the bytes in flight are bounded by registers, and a warp
/// issues its next loads only after it has used the previous ones. Here one thread per
/// block asks the copy engine for whole contiguous runs of a weight row
/// (`cp.async.bulk`, up to a few KB per instruction); the bytes land in shared memory
/// and an mbarrier counts them in. The ring keeps S - 1 stages in flight while the
/// block works on one, and the first S are requested before the kernel even waits for
/// its input (with PDL that overlaps the previous kernel's tail).
///
/// Protocol (all threads of the block run the same loop over stages 0, 1, ...):
///   stream.init(...)            thread 0 sets up the barriers, __syncthreads after
///   stream.prefill(fetch)       thread 0 requests stages 0 .. S-1
///   for each stage s:
///     stream.wait(s)            everyone: the bytes of stage s are in shared memory
///     ... read stream.stage(s) ...
///     __syncthreads()           everyone is done with the slot
///     stream.refill(s, fetch)   thread 0 requests stage s + S into the freed slot
/// fetch(stage, slot_bytes_ptr, barrier) issues the copies of one stage with
/// copy_async_bulk() and returns the bytes requested (the barrier expects exactly those).
///
/// Needs sm_90 (compiled as empty stubs for older targets: the host side checks
/// weight_stream_supported() and uses another kernel there).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "pdl.cuh"

namespace bielik {

/// True when the current device has the bulk-copy engine (compute capability 9.0+).
inline bool weight_stream_supported() { return device_is_sm90_or_newer(); }

namespace stream_ptx {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* barrier, int arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals));
#endif
}

/// Makes the initialized barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void barrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/// One arrival that also tells the barrier how many bytes the copies will deliver.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
#endif
}

/// Spins until the barrier's phase with this parity has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
#endif
}

/// Polls (never suspends) until the barrier's phase with this parity has completed.
__device__ __forceinline__ void barrier_poll(uint64_t* barrier, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "POLL_AGAIN:\n"
      "mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra POLL_AGAIN;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace stream_ptx

/// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
/// shared memory on the bulk-copy engine; `barrier` counts them in. The weights are
/// read once per token, so the L2 is told to evict them first (the activations and the
/// KV cache, reused across kernels, should stay).
__device__ __forceinline__ void copy_async_bulk(void* shared_destination, const void* global_source, uint32_t bytes,
                                                uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(stream_ptx::shared_address(shared_destination)),
      "l"(global_source), "r"(bytes), "r"(stream_ptx::shared_address(barrier)), "l"(policy)
      : "memory");
#endif
}

/// The ring: `stages` slots of `slot_bytes` each (a multiple of 16) in shared memory,
/// one mbarrier per slot. Lives in shared memory set up by the kernel; see the file
/// comment for the protocol.
struct WeightStream {
  unsigned char* slots;  ///< (stages, slot_bytes)
  uint64_t* barriers;    ///< (stages)
  int stages;
  int slot_bytes;
  int total;  ///< stages the block will consume

  /// Thread 0 initializes the barriers; the caller must __syncthreads() before wait().
  __device__ void init(unsigned char* slot_memory, uint64_t* barrier_memory, int num_stages, int bytes_per_slot,
                       int total_stages) {
    slots = slot_memory;
    barriers = barrier_memory;
    stages = num_stages;
    slot_bytes = bytes_per_slot;
    total = total_stages;
    if (threadIdx.x == 0) {
      for (int i = 0; i < stages; ++i) stream_ptx::barrier_init(&barriers[i], 1);
      stream_ptx::barrier_init_fence();
    }
  }

  __device__ unsigned char* stage(int s) const { return slots + size_t(s % stages) * slot_bytes; }

  /// Thread 0 requests stage s into its slot: fetch(s, destination, barrier) issues the
  /// copies and returns their byte count, announced to the barrier first.
  template <typename Fetch>
  __device__ void request(int s, Fetch&& fetch) const {
    if (threadIdx.x != 0 || s >= total) return;
    uint64_t* barrier = &barriers[s % stages];
    fetch(s, stage(s), barrier);
  }

  template <typename Fetch>
  __device__ void prefill(Fetch&& fetch) const {
    for (int s = 0; s < stages && s < total; ++s) request(s, fetch);
  }

  /// Everyone: waits for the bytes of stage s. Slot s % stages is on its (s / stages)-th
  /// use, so the phase to wait for has that parity.
  __device__ void wait(int s) const { stream_ptx::barrier_wait(&barriers[s % stages], uint32_t(s / stages) & 1u); }

  /// The same wait with mbarrier.test_wait in a loop instead of try_wait (which may
  /// suspend the thread): bench_weight_stream compares the two.
  __device__ void wait_polling(int s) const {
    stream_ptx::barrier_poll(&barriers[s % stages], uint32_t(s / stages) & 1u);
  }

  /// After the block's __syncthreads() that ends its reads of stage s: thread 0 requests
  /// stage s + stages into the same slot.
  template <typename Fetch>
  __device__ void refill(int s, Fetch&& fetch) const {
    request(s + stages, fetch);
  }
};

/// Inside a fetch: announce `bytes` to the barrier, then issue the copies.
__device__ __forceinline__ void expect_bytes(uint64_t* barrier, uint32_t bytes) {
  stream_ptx::barrier_expect_bytes(barrier, bytes);
}

}  // namespace bielik
