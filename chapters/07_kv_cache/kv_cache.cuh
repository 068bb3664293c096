/// @file kv_cache.cuh
/// @brief Chapter 07: the KV cache, the memory that makes generation linear.
///
/// Every layer's attention needs the keys and values of ALL earlier tokens. Without a
/// cache a generator recomputes them (and the attention over them) for the whole
/// prefix at every new token; with one, each token's K (after RoPE) and V are computed
/// once, appended here, and read back by every later decode step.
///
/// Layout: (layers, Hkv, max_context, D), bf16. One kv head's keys for positions
/// 0..length-1 are ONE contiguous run of length*D values, so decode attention (which
/// reads exactly that run for each kv head, see decode_attention.cuh) streams it with
/// 16-byte loads and no stride; the README compares this with (layers, max_context,
/// Hkv, D), where the same keys are D-value pieces spaced Hkv*D apart.
///
/// Length: `length()` is the number of tokens whose K and V every layer holds, tracked
/// on the host (for the capacity check before any launch) AND mirrored in a device int
/// (`device_length()`), so a CUDA graph of the decode step can read the position at
/// replay time instead of having it baked into the captured launches.
///
/// One step (prefill of T tokens, or decode with T = 1):
///   for each layer: append(layer, k, v, T)  (writes positions [length, length+T))
///                   attention over length + T keys
///   commit(T)                                (length += T, host and device)
///
/// Symbols (docs/conventions.md): T tokens, Hkv kv heads, D head_dim.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "device_buffer.cuh"

namespace bielik {

/// The capacity check every append goes through, host side, before any launch: throws
/// std::length_error("KV cache full: <length> + <T_new> tokens exceed max_context <max>")
/// when length + T_new > max_context, std::invalid_argument for T_new < 0.
void kv_cache_check_room(int length, int T_new, int max_context);

/// Plain C++ reference of the append: writes k_new/v_new at positions
/// [length, length + T_new) of one layer's cache. Checks room first (never writes
/// out of bounds).
/// @param k_cache (Hkv, max_context, D) one layer, written at the new positions
/// @param v_cache (Hkv, max_context, D)
/// @param k_new   (T_new, Hkv, D) keys after RoPE, token-major as the projection writes them
/// @param v_new   (T_new, Hkv, D)
void kv_cache_append_cpu(float* k_cache, float* v_cache, const float* k_new, const float* v_new, int length,
                         int T_new, int Hkv, int D, int max_context);

/// GPU append at a position known on the host. Checks on the host before launching:
/// std::length_error (kv_cache_check_room's message) when position + T_new >
/// max_context, std::invalid_argument for position < 0, T_new < 0, Hkv < 1 or
/// max_context < 1; the kernel never writes past max_context either.
/// @param k_cache (Hkv, max_context, D) device, one layer
/// @param v_cache (Hkv, max_context, D) device
/// @param k_new   (T_new, Hkv, D) device
/// @param v_new   (T_new, Hkv, D) device
/// Needs D % 8 == 0 and 16-byte aligned pointers (throws std::invalid_argument).
void kv_cache_append(__nv_bfloat16* k_cache, __nv_bfloat16* v_cache, const __nv_bfloat16* k_new,
                     const __nv_bfloat16* v_new, int position, int T_new, int Hkv, int D, int max_context,
                     cudaStream_t stream = 0);

/// GPU append at the position read from device memory (*d_length) when the kernel
/// runs: the form a CUDA graph captures. If *d_length + T_new > max_context the kernel
/// writes nothing (the host must have checked with kv_cache_check_room; this is only
/// the guarantee that a bug cannot write out of bounds). Same pointers as kv_cache_append;
/// T_new < 0, Hkv < 1 or max_context < 1 throw std::invalid_argument.
/// @param d_length (1) device
void kv_cache_append_at_device_length(__nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                      const __nv_bfloat16* k_new, const __nv_bfloat16* v_new,
                                      const int* d_length, int T_new, int Hkv, int D, int max_context,
                                      cudaStream_t stream = 0);

/// The reverse of the append, for attention over the cache with more than one query
/// (a chunk of a long prompt, or a new chat turn on top of the cache): chapter 05's
/// kernel reads token-major k and v (Tkv, Hkv, D), so positions [0, count) of one layer
/// are copied out into that layout. A copy of count*Hkv*D*2 values per layer, small
/// next to the attention that follows (see README: the price of the head-major layout).
/// @param k_out   (count, Hkv, D) device, written
/// @param v_out   (count, Hkv, D) device, written
/// @param k_cache (Hkv, max_context, D) device, one layer
/// @param v_cache (Hkv, max_context, D) device
/// Needs D % 8 == 0, 16-byte aligned pointers and count <= max_context (std::invalid_argument).
void kv_cache_gather_token_major(__nv_bfloat16* k_out, __nv_bfloat16* v_out, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, int count, int Hkv, int D, int max_context,
                                 cudaStream_t stream = 0);

/// *d_length += T_new on the GPU (a one-thread kernel, so it can be captured in a graph).
/// @param d_length (1) device
void kv_cache_advance_device_length(int* d_length, int T_new, cudaStream_t stream = 0);

/// Per-layer K and V caches for one conversation, sized once from the model's shape.
class KvCache {
 public:
  /// Allocates 2 * layers * Hkv * max_context * D bf16 values (Bielik at 8192 tokens:
  /// 2 * 32 * 2 * 8192 * 128 * 2 bytes = 268 MB) and sets the length to 0.
  /// Throws std::invalid_argument for non-positive sizes or D % 8 != 0.
  KvCache(int layers, int Hkv, int D, int max_context);

  int layers() const { return layers_; }
  int kv_heads() const { return Hkv_; }
  int head_dim() const { return D_; }
  int max_context() const { return max_context_; }
  /// Tokens every layer holds (committed). Host copy: no synchronization needed.
  int length() const { return length_; }
  /// (1) device mirror of length(), updated in stream order by commit() and reset().
  const int* device_length() const { return d_length_.data(); }
  int* device_length() { return d_length_.data(); }

  /// (Hkv, max_context, D) device: one layer's keys / values.
  __nv_bfloat16* k(int layer);
  __nv_bfloat16* v(int layer);
  const __nv_bfloat16* k(int layer) const;
  const __nv_bfloat16* v(int layer) const;
  /// Elements in one layer's K (or V): Hkv * max_context * D.
  size_t layer_elements() const { return size_t(Hkv_) * max_context_ * D_; }
  /// Device bytes of the whole cache (K and V, every layer).
  size_t bytes() const { return 2 * layers_ * layer_elements() * sizeof(__nv_bfloat16); }

  /// Throws std::length_error (message in kv_cache_check_room) if T_new more tokens do
  /// not fit. Call it before launching a captured decode graph.
  void check_room(int T_new) const { kv_cache_check_room(length_, T_new, max_context_); }

  /// Writes one layer's new keys (after RoPE) and values at positions
  /// [length(), length() + T_new). Checks room on the host first and throws before any
  /// launch. Does not change length(): every layer appends, then commit() once.
  /// @param k_new (T_new, Hkv, D) device
  /// @param v_new (T_new, Hkv, D) device
  void append(int layer, const __nv_bfloat16* k_new, const __nv_bfloat16* v_new, int T_new,
              cudaStream_t stream = 0);

  /// length += T_new on the host and (in stream order) on the device. Throws like append.
  void commit(int T_new, cudaStream_t stream = 0);
  /// Host half of commit(), for when the device increment ran inside a CUDA graph
  /// (captured with kv_cache_advance_device_length(device_length(), ...)).
  void commit_host(int T_new);

  /// A new conversation: length 0 on host and device. The memory is kept (and not
  /// cleared: positions >= length are never read). Between chat turns do NOT reset:
  /// the next turn's prompt is appended after the previous answer.
  void reset(cudaStream_t stream = 0);

 private:
  void check_layer(int layer) const;

  int layers_, Hkv_, D_, max_context_;
  int length_ = 0;
  DeviceBuffer<__nv_bfloat16> k_;  ///< (layers, Hkv, max_context, D)
  DeviceBuffer<__nv_bfloat16> v_;  ///< (layers, Hkv, max_context, D)
  DeviceBuffer<int> d_length_;     ///< (1) device mirror of length_
};

}  // namespace bielik
