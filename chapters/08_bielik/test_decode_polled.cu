// Chapter 08: the down projection that polls its input (DecodeGemvParams::input_polled)
// instead of waiting for the kernel before it, and the mark that makes a buffer
// "unwritten" again (DecodeGemvParams::mark_unwritten).
//
// The polled form must give the staged form's outputs bit for bit (the same products in
// the same order), whether its input is already written or is written while it runs.
// The second case is the one that matters: a writer kernel on another stream sleeps,
// then writes x's second half, sleeps again, then the first half; the polled GEMV,
// launched after the writer, must start before the first write (its timeline says when
// its first block started) and still produce the staged form's outputs.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16.hpp"
#include "catch_compat.hpp"
#include "cuda_check.cuh"
#include "decode_kernels.cuh"
#include "device_buffer.cuh"
#include "globaltimer.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

// One block: waits `delay_ns`, stamps the time of its first write, copies x's vectors
// [half, count) from `source`, waits `delay_ns` again, then copies [0, half).
__global__ void write_late_kernel(uint4* x, const uint4* source, int count, long long delay_ns,
                                  unsigned long long* first_write_ns) {
  auto pause = [&] {
    if (threadIdx.x == 0) {
      const unsigned long long until = globaltimer_ns() + (unsigned long long)delay_ns;
      while (globaltimer_ns() < until) __nanosleep(1000);
    }
    __syncthreads();
  };
  const int half = count / 2;
  pause();
  if (threadIdx.x == 0) *first_write_ns = globaltimer_ns();
  for (int i = half + int(threadIdx.x); i < count; i += int(blockDim.x)) x[i] = source[i];
  __threadfence();
  pause();
  for (int i = int(threadIdx.x); i < half; i += int(blockDim.x)) x[i] = source[i];
}

struct PolledCase {
  int N, K;
  bool bias;
  int split_warps;  // 0: automatic
};

DecodeGemvParams down_params(const PolledCase& c, DeviceBuffer<uint16_t>& y, const DeviceBuffer<uint16_t>& x,
                             const DeviceBuffer<uint16_t>& W, const DeviceBuffer<uint16_t>& bias) {
  DecodeGemvParams p{};
  p.y = y.data();
  p.x = reinterpret_cast<const __nv_bfloat16*>(x.data());
  p.W = reinterpret_cast<const __nv_bfloat16*>(W.data());
  p.bias = c.bias ? reinterpret_cast<const __nv_bfloat16*>(bias.data()) : nullptr;
  p.N = c.N;
  p.K = c.K;
  p.split_warps = c.split_warps;
  p.stream_evict_first = true;
  p.epilogue_inputs_settled = true;
  return p;
}

}  // namespace

TEST_CASE("decode_gemv input_polled: the staged form's outputs, with its input written before or while it runs",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const PolledCase cases[] = {
      {1536, 8960, true, 0},   // Bielik's down projection: two parts a row, 2 warps a row
      {300, 8968, false, 0},   // odd: the second part shorter, lanes past the row's end
      {4000, 2056, true, 1},   // 2 rows a warp: the second row reads the staged x
      {45, 344, true, 0},      // F <= 2048 (the test models'): one part, O's kernel form
  };
  uint64_t case_seed = seed;
  for (const PolledCase& c : cases) {
    const std::vector<uint16_t> x = random_bf16(c.K, ++case_seed, 2.0f);
    const std::vector<uint16_t> W = random_bf16(size_t(c.N) * c.K, ++case_seed, 1.0f / 64.0f);
    const std::vector<uint16_t> bias = random_bf16(c.N, ++case_seed, 0.5f);
    const std::vector<uint16_t> residual = random_bf16(c.N, ++case_seed, 1.0f);
    DeviceBuffer<uint16_t> d_x(x), d_W(W), d_bias(bias), d_y(residual);
    const DeviceBuffer<uint16_t> d_source(x);

    // The staged form, after a plain stream-ordered copy of x.
    decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, down_params(c, d_y, d_x, d_W, d_bias), false);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> staged = d_y.to_host();
    bool any_nan = false;
    for (uint16_t v : staged) any_nan |= std::isnan(bf16_bits_to_float(v));
    REQUIRE_FALSE(any_nan);

    // The polled form, x written before it starts, with and without PDL.
    for (bool pdl : {false, true}) {
      INFO("N=" << c.N << " K=" << c.K << " written before, pdl " << pdl);
      d_y.copy_from_host(residual);
      DecodeGemvParams p = down_params(c, d_y, d_x, d_W, d_bias);
      p.input_polled = true;
      decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, p, pdl);
      CUDA_CHECK(cudaDeviceSynchronize());
      REQUIRE(d_y.to_host() == staged);
    }

    // The polled form, x written by another stream's kernel while it runs: every thread
    // polling its own vectors, or thread 0 alone polling each part's last vector first.
    for (bool probe : {false, true}) {
      INFO("N=" << c.N << " K=" << c.K << " written while it runs, probe " << probe);
      cudaStream_t writer_stream = nullptr, reader_stream = nullptr;
      CUDA_CHECK(cudaStreamCreateWithFlags(&writer_stream, cudaStreamNonBlocking));
      CUDA_CHECK(cudaStreamCreateWithFlags(&reader_stream, cudaStreamNonBlocking));
      d_y.copy_from_host(residual);
      d_x.fill_bytes(0xFF);  // every value kUnwrittenBf16
      DeviceBuffer<unsigned long long> first_write(1);
      std::vector<unsigned long long> timeline_init(2 * kGemvTimelineEvents);
      for (size_t i = 0; i < timeline_init.size(); ++i) timeline_init[i] = i % 2 == 0 ? ULLONG_MAX : 0;
      DeviceBuffer<unsigned long long> timeline(timeline_init);
      CUDA_CHECK(cudaDeviceSynchronize());
      write_late_kernel<<<1, 256, 0, writer_stream>>>(reinterpret_cast<uint4*>(d_x.data()),
                                                     reinterpret_cast<const uint4*>(d_source.data()), c.K / 8,
                                                     200 * 1000, first_write.data());
      CUDA_CHECK(cudaGetLastError());
      DecodeGemvParams p = down_params(c, d_y, d_x, d_W, d_bias);
      p.input_polled = true;
      p.poll_probe = probe;
      p.timeline = timeline.data();
      decode_gemv(GemvInput::kPlain, GemvOutput::kResidualAdd, p, true, reader_stream);
      CUDA_CHECK(cudaStreamSynchronize(reader_stream));
      CUDA_CHECK(cudaStreamSynchronize(writer_stream));
      CUDA_CHECK(cudaStreamDestroy(writer_stream));
      CUDA_CHECK(cudaStreamDestroy(reader_stream));
      const unsigned long long written_at = first_write.to_host()[0];
      const std::vector<unsigned long long> stamps = timeline.to_host();
      const unsigned long long first_start = stamps[2 * kTimelineStart];
      const unsigned long long last_end = stamps[2 * kTimelineEnd + 1];
      INFO("first block started " << (long long)(written_at - first_start) << " ns before the first write; last "
                                  << "block ended " << (long long)(last_end - written_at) << " ns after it");
      // Not vacuous: the GEMV was running, and so polling, before x had any value.
      REQUIRE(first_start < written_at);
      REQUIRE(last_end > written_at);
      REQUIRE(d_y.to_host() == staged);
    }
  }
}

TEST_CASE("decode_gemv: SwiGLU never stores kUnwrittenBf16, even for a NaN", "[ch08][gpu][kernels]") {
  // An input of kUnwrittenBf16 (a NaN with every payload bit set) makes every output NaN;
  // none may carry that bit pattern, or a polled down projection would wait for it.
  const int N = 64, K = 256;
  std::vector<uint16_t> x(K, kUnwrittenBf16);
  const std::vector<uint16_t> W = random_bf16(size_t(2) * N * K, fresh_seed(), 0.1f);
  std::vector<uint16_t> norm(K, float_to_bf16_bits(1.0f));
  DeviceBuffer<uint16_t> d_x(x), d_W(W), d_norm(norm), d_y(N);
  d_y.fill_bytes(0);
  for (GemvInput input : {GemvInput::kPlain, GemvInput::kRmsNorm}) {
    DecodeGemvParams p{};
    p.y = d_y.data();
    p.x = reinterpret_cast<const __nv_bfloat16*>(d_x.data());
    p.norm_weight = reinterpret_cast<const __nv_bfloat16*>(d_norm.data());
    p.W = reinterpret_cast<const __nv_bfloat16*>(d_W.data());
    p.N = N;
    p.K = K;
    p.eps = 1e-6f;
    decode_gemv(input, GemvOutput::kSwiGLU, p, false);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (uint16_t v : d_y.to_host()) {
      INFO("output bits " << v);
      REQUIRE(std::isnan(bf16_bits_to_float(v)));
      REQUIRE(v != kUnwrittenBf16);
    }
  }
}

TEST_CASE("decode_gemv mark_unwritten: the values become kUnwrittenBf16, the outputs do not change; bad uses "
          "are refused",
          "[ch08][gpu][kernels]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const int N = 2048, K = 1536, marked = 8960;  // QKV's shape, gate/up's output
  const std::vector<uint16_t> x = random_bf16(K, seed, 2.0f);
  const std::vector<uint16_t> W = random_bf16(size_t(N) * K, seed + 1, 1.0f / 40.0f);
  std::vector<uint16_t> norm = random_bf16(K, seed + 2, 0.2f);
  for (auto& v : norm) v = float_to_bf16_bits(1.0f + bf16_bits_to_float(v));
  DeviceBuffer<uint16_t> d_x(x), d_W(W), d_norm(norm), d_y(N), d_marked(marked + 8);
  auto params = [&] {
    DecodeGemvParams p{};
    p.y = d_y.data();
    p.x = reinterpret_cast<const __nv_bfloat16*>(d_x.data());
    p.norm_weight = reinterpret_cast<const __nv_bfloat16*>(d_norm.data());
    p.W = reinterpret_cast<const __nv_bfloat16*>(d_W.data());
    p.N = N;
    p.K = K;
    p.eps = 1e-6f;
    return p;
  };
  d_y.fill_bytes(0x7F);
  decode_gemv(GemvInput::kRmsNorm, GemvOutput::kBf16, params(), true);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> plain = d_y.to_host();

  const std::vector<uint16_t> before = random_bf16(marked + 8, seed + 3, 1.0f);
  d_marked.copy_from_host(before);
  d_y.fill_bytes(0x7F);
  DecodeGemvParams p = params();
  p.mark_unwritten = UnwrittenMark{reinterpret_cast<__nv_bfloat16*>(d_marked.data()), marked};
  decode_gemv(GemvInput::kRmsNorm, GemvOutput::kBf16, p, true);
  CUDA_CHECK(cudaDeviceSynchronize());
  REQUIRE(d_y.to_host() == plain);
  const std::vector<uint16_t> after = d_marked.to_host();
  for (int i = 0; i < marked; ++i) {
    INFO("value " << i);
    REQUIRE(after[i] == kUnwrittenBf16);
  }
  for (int i = marked; i < marked + 8; ++i) REQUIRE(after[i] == before[i]);  // nothing past count

  auto refused = [&](DecodeGemvParams q, GemvInput input, GemvOutput output,
                     DecodeGemvKernel kernel = DecodeGemvKernel::kAuto) {
    return error_of([&] { decode_gemv(input, output, q, false, 0, kernel); });
  };
  DecodeGemvParams bad = params();
  bad.mark_unwritten = UnwrittenMark{reinterpret_cast<__nv_bfloat16*>(d_marked.data()), 7};
  REQUIRE(contains(refused(bad, GemvInput::kRmsNorm, GemvOutput::kBf16), "mark_unwritten"));
  bad.mark_unwritten = UnwrittenMark{reinterpret_cast<__nv_bfloat16*>(d_marked.data()) + 1, 8};
  REQUIRE(contains(refused(bad, GemvInput::kRmsNorm, GemvOutput::kBf16), "16-byte aligned"));
  bad.mark_unwritten = UnwrittenMark{reinterpret_cast<__nv_bfloat16*>(d_marked.data()), 8};
  REQUIRE(contains(refused(bad, GemvInput::kRmsNorm, GemvOutput::kBf16, DecodeGemvKernel::kRegisterPipelined),
                   "register-loads"));
  DecodeGemvParams polled = params();
  polled.input_polled = true;
  REQUIRE(contains(refused(polled, GemvInput::kRmsNorm, GemvOutput::kBf16), "polled input"));
  polled.N = 1536;  // O's shape, residual add: but read in place
  polled.input_from_global = true;
  REQUIRE(contains(refused(polled, GemvInput::kPlain, GemvOutput::kResidualAdd), "polled input"));
  CUDA_CHECK(cudaDeviceSynchronize());
  // Nothing was launched by the refused calls: d_marked holds what the mark left.
  REQUIRE(d_marked.to_host() == after);
}
