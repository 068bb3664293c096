// The KV cache: storage, the append kernel and the length bookkeeping.
//
// The append is a copy: T_new * Hkv * D values for K and as many for V, each (token,
// kv head) row of D values moving from token-major (T_new, Hkv, D), as the projection
// writes it, to head-major (Hkv, max_context, D), as decode attention reads it. One
// thread moves one 16-byte vector (8 values), so a decode step's append (Bielik:
// 2 * 256 values) is a single tiny block. Its cost is launch latency, never bandwidth.
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "kv_cache.cuh"

namespace bielik {

namespace {

// Reads the position from `d_length` when it is not null (the graph form), else uses
// `position`. The whole append is skipped if it would not fit: all-or-nothing, like the
// host check, and never a write past max_context.
__global__ void kv_cache_append_kernel(int4* k_cache,        // (Hkv, max_context, D/8) 16-byte vectors
                                       int4* v_cache,        // (Hkv, max_context, D/8)
                                       const int4* k_new,    // (T_new, Hkv, D/8)
                                       const int4* v_new,    // (T_new, Hkv, D/8)
                                       const int* d_length,  // (1) or nullptr
                                       int position, int T_new, int Hkv, int vectors_per_row,
                                       int max_context) {
  int start = d_length ? *d_length : position;
  if (start < 0 || long(start) + T_new > max_context) return;
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  size_t per_token = size_t(Hkv) * vectors_per_row;
  if (index >= T_new * per_token) return;
  int t = int(index / per_token);
  int head = int(index % per_token) / vectors_per_row;
  int vec = int(index % vectors_per_row);
  size_t destination = (size_t(head) * max_context + start + t) * vectors_per_row + vec;
  k_cache[destination] = k_new[index];
  v_cache[destination] = v_new[index];
}

void launch_append(__nv_bfloat16* k_cache, __nv_bfloat16* v_cache, const __nv_bfloat16* k_new,
                   const __nv_bfloat16* v_new, const int* d_length, int position, int T_new, int Hkv, int D,
                   int max_context, cudaStream_t stream) {
  auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (D <= 0 || D % 8 != 0 || misaligned(k_cache) || misaligned(v_cache) || misaligned(k_new) || misaligned(v_new)) {
    throw std::invalid_argument("kv_cache_append: needs D % 8 == 0 and 16-byte aligned pointers (D = " +
                                std::to_string(D) + ")");
  }
  if (T_new < 0 || Hkv <= 0 || max_context <= 0) {
    throw std::invalid_argument("kv_cache_append: needs T_new >= 0, Hkv >= 1 and max_context >= 1 (T_new = " +
                                std::to_string(T_new) + ", Hkv = " + std::to_string(Hkv) +
                                ", max_context = " + std::to_string(max_context) + ")");
  }
  if (d_length == nullptr) {
    // The host knows the position: refuse what does not fit here, with the message of
    // KvCache::append, instead of letting the kernel's guard skip the whole append
    // silently. (The device-length form cannot know the position on the host; its
    // caller checks with kv_cache_check_room, and the kernel's guard is the backstop.)
    if (position < 0) {
      throw std::invalid_argument("kv_cache_append: negative position " + std::to_string(position));
    }
    kv_cache_check_room(position, T_new, max_context);
  }
  if (T_new == 0) return;
  size_t total = size_t(T_new) * Hkv * (D / 8);
  int threads = 256;
  unsigned blocks = unsigned((total + threads - 1) / threads);
  kv_cache_append_kernel<<<blocks, threads, 0, stream>>>(
      reinterpret_cast<int4*>(k_cache), reinterpret_cast<int4*>(v_cache), reinterpret_cast<const int4*>(k_new),
      reinterpret_cast<const int4*>(v_new), d_length, position, T_new, Hkv, D / 8, max_context);
  CUDA_CHECK_LAUNCH();
}

// Positions [0, count) of the cache back to token-major, one 16-byte vector a thread.
__global__ void kv_cache_gather_kernel(int4* k_out,          // (count, Hkv, D/8)
                                       int4* v_out,          // (count, Hkv, D/8)
                                       const int4* k_cache,  // (Hkv, max_context, D/8)
                                       const int4* v_cache,  // (Hkv, max_context, D/8)
                                       int count, int Hkv, int vectors_per_row, int max_context) {
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  size_t per_token = size_t(Hkv) * vectors_per_row;
  if (index >= count * per_token) return;
  int t = int(index / per_token);
  int head = int(index % per_token) / vectors_per_row;
  int vec = int(index % vectors_per_row);
  size_t source = (size_t(head) * max_context + t) * vectors_per_row + vec;
  k_out[index] = k_cache[source];
  v_out[index] = v_cache[source];
}

__global__ void kv_cache_advance_kernel(int* d_length, int T_new) { *d_length += T_new; }

}  // namespace

void kv_cache_append(__nv_bfloat16* k_cache, __nv_bfloat16* v_cache, const __nv_bfloat16* k_new,
                     const __nv_bfloat16* v_new, int position, int T_new, int Hkv, int D, int max_context,
                     cudaStream_t stream) {
  launch_append(k_cache, v_cache, k_new, v_new, nullptr, position, T_new, Hkv, D, max_context, stream);
}

void kv_cache_append_at_device_length(__nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                                      const __nv_bfloat16* k_new, const __nv_bfloat16* v_new,
                                      const int* d_length, int T_new, int Hkv, int D, int max_context,
                                      cudaStream_t stream) {
  launch_append(k_cache, v_cache, k_new, v_new, d_length, 0, T_new, Hkv, D, max_context, stream);
}

void kv_cache_gather_token_major(__nv_bfloat16* k_out, __nv_bfloat16* v_out, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, int count, int Hkv, int D, int max_context,
                                 cudaStream_t stream) {
  auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (D % 8 != 0 || count < 0 || count > max_context || misaligned(k_out) || misaligned(v_out) ||
      misaligned(k_cache) || misaligned(v_cache)) {
    throw std::invalid_argument("kv_cache_gather_token_major: needs D % 8 == 0, 0 <= count <= max_context and "
                                "16-byte aligned pointers (D = " + std::to_string(D) + ", count = " +
                                std::to_string(count) + ")");
  }
  if (count == 0) return;
  size_t total = size_t(count) * Hkv * (D / 8);
  int threads = 256;
  unsigned blocks = unsigned((total + threads - 1) / threads);
  kv_cache_gather_kernel<<<blocks, threads, 0, stream>>>(
      reinterpret_cast<int4*>(k_out), reinterpret_cast<int4*>(v_out), reinterpret_cast<const int4*>(k_cache),
      reinterpret_cast<const int4*>(v_cache), count, Hkv, D / 8, max_context);
  CUDA_CHECK_LAUNCH();
}

void kv_cache_advance_device_length(int* d_length, int T_new, cudaStream_t stream) {
  kv_cache_advance_kernel<<<1, 1, 0, stream>>>(d_length, T_new);
  CUDA_CHECK_LAUNCH();
}

KvCache::KvCache(int layers, int Hkv, int D, int max_context)
    : layers_(layers), Hkv_(Hkv), D_(D), max_context_(max_context) {
  if (layers <= 0 || Hkv <= 0 || D <= 0 || max_context <= 0 || D % 8 != 0) {
    throw std::invalid_argument("KvCache: need positive layers, Hkv, max_context and D % 8 == 0 (got layers=" +
                                std::to_string(layers) + " Hkv=" + std::to_string(Hkv) + " D=" +
                                std::to_string(D) + " max_context=" + std::to_string(max_context) + ")");
  }
  k_ = DeviceBuffer<__nv_bfloat16>(size_t(layers) * layer_elements());
  v_ = DeviceBuffer<__nv_bfloat16>(size_t(layers) * layer_elements());
  d_length_ = DeviceBuffer<int>(1);
  d_length_.fill_bytes(0);
}

void KvCache::check_layer(int layer) const {
  if (layer < 0 || layer >= layers_) {
    throw std::out_of_range("KvCache: layer " + std::to_string(layer) + " outside [0, " +
                            std::to_string(layers_) + ")");
  }
}

__nv_bfloat16* KvCache::k(int layer) {
  check_layer(layer);
  return k_.data() + size_t(layer) * layer_elements();
}
__nv_bfloat16* KvCache::v(int layer) {
  check_layer(layer);
  return v_.data() + size_t(layer) * layer_elements();
}
const __nv_bfloat16* KvCache::k(int layer) const {
  check_layer(layer);
  return k_.data() + size_t(layer) * layer_elements();
}
const __nv_bfloat16* KvCache::v(int layer) const {
  check_layer(layer);
  return v_.data() + size_t(layer) * layer_elements();
}

void KvCache::append(int layer, const __nv_bfloat16* k_new, const __nv_bfloat16* v_new, int T_new,
                     cudaStream_t stream) {
  check_layer(layer);
  check_room(T_new);  // throws before any launch
  kv_cache_append(k(layer), v(layer), k_new, v_new, length_, T_new, Hkv_, D_, max_context_, stream);
}

void KvCache::commit_host(int T_new) {
  check_room(T_new);
  length_ += T_new;
}

void KvCache::commit(int T_new, cudaStream_t stream) {
  commit_host(T_new);
  kv_cache_advance_device_length(d_length_.data(), T_new, stream);
}

void KvCache::reset(cudaStream_t stream) {
  length_ = 0;
  CUDA_CHECK(cudaMemsetAsync(d_length_.data(), 0, sizeof(int), stream));
}

}  // namespace bielik
