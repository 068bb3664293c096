// bench_l2_prefetch: does an L2 prefetch land, and what is a prefetched range worth to
// the kernel that reads it next?
//
// Four sessions of the decode log asked L2 for weights ahead of time (prefetch.global.L2
// line by line, or cp.async.bulk.prefetch.L2 in bulk) and every plan lost. The side
// branch of the twenty-first session (decode_side_prefetch.cuh) lost too, and its
// timeline showed no gate/up block finishing early, as if the prefetched rows were not
// in L2 when gate/up read them. This benchmark asks the question with nothing else
// running. For each form, `kRounds` times:
//   1. push the range out of L2 (a read of a buffer eight times L2's size: clean lines);
//   2. ask L2 for the range (l2_prefetch, the side branch's kernel, 8 blocks as in the
//      model), wait for the kernel, then 20 us more of idle time for the requests to
//      retire;
//   3. time a kernel that reads the range once (every SM, 8 loads of 16 bytes in flight a
//      thread).
// The read's time after "nothing" (cold, from HBM) and after a full read of the range
// (warm, from L2) bracket it; `landed` = (cold - t) / (cold - warm) estimates the share
// of the range that was in L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "decode_device.cuh"  // xor_of_grid_share
#include "decode_side_prefetch.cuh"
#include "device_buffer.cuh"
#include "globaltimer.cuh"
#include "matmul_common.cuh"  // chapter 03: multiprocessor_count

namespace {

using namespace bielik;

constexpr int kRounds = 9;
constexpr int kReadThreads = 256;

// Reads `vectors` uint4 of `data` once (streaming loads, as the decode GEMVs read
// weights; eight in flight a thread) and writes one value per block only if it matches a
// constant, so that no load can be dropped.
__global__ void __launch_bounds__(kReadThreads) read_range(const uint4* data, size_t vectors, unsigned* sums) {
  const unsigned sum = decode_device::xor_of_grid_share(data, vectors, size_t(blockIdx.x) * blockDim.x + threadIdx.x,
                                                        size_t(gridDim.x) * blockDim.x);
  if (sum == 0x9e3779b9u) sums[blockIdx.x] = sum;  // rarely true; the compiler cannot know
}

__global__ void spin_ns(unsigned ns) {
  const unsigned long long start = globaltimer_ns();
  while (globaltimer_ns() - start < ns) {
  }
}

struct Form {
  std::string name;
  bool prefetch;
  L2PrefetchForm prefetch_form;
  int stride;
  bool warm;       ///< a full read of the range instead of a prefetch
  int blocks = 8;  ///< the prefetch kernel's
};

}  // namespace

int main() {
  try {
    if (!cuda_device_available()) {
      std::printf("bench_l2_prefetch: no CUDA device\n");
      return 1;
    }
    std::printf("bench_l2_prefetch: %s\n", describe_device().c_str());
    int device = 0, l2_bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
    const size_t flush_bytes = std::max<size_t>(size_t(8) * l2_bytes, size_t(256) << 20);
    DeviceBuffer<unsigned char> flush(flush_bytes);
    flush.fill_bytes(0x33);
    const int read_blocks = multiprocessor_count() * 4;
    DeviceBuffer<unsigned> sums{size_t(read_blocks)};
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t before, after, prefetch_start, prefetch_end;
    for (cudaEvent_t* event : {&before, &after, &prefetch_start, &prefetch_end}) CUDA_CHECK(cudaEventCreate(event));

    constexpr L2PrefetchForm kLines = L2PrefetchForm::kLines;
    std::vector<Form> forms = {{"nothing (cold: from HBM)", false, kLines, 128, false},
                               {"a full read of the range (warm: from L2)", false, kLines, 128, true},
                               {"prefetch.global.L2, one per 128 bytes", true, kLines, 128, false},
                               {"prefetch.global.L2, one per 64 bytes", true, kLines, 64, false},
                               {"prefetch.global.L2, one per 32 bytes", true, kLines, 32, false},
                               {"cp.async.bulk.prefetch.L2, 16 KB requests", true, L2PrefetchForm::kBulk, 128, false},
                               {"loads whose values are dropped (8 blocks)", true, L2PrefetchForm::kLoads, 128, false},
                               {"loads whose values are dropped (132 blocks)", true, L2PrefetchForm::kLoads, 128, false, 132}};
    BenchTable table("l2_prefetch",
                     {"range MB", "before the read", "prefetch kernel us", "read us (median)", "read GB/s", "landed"});
    std::printf("L2 %d MB; the range is pushed out by a read of %zu MB before every round\n", l2_bytes >> 20,
                flush_bytes >> 20);
    // 8 and 16 MB (the side branch's sizes), and half of L2.
    for (size_t range_mb : {size_t(8), size_t(16), size_t(l2_bytes >> 21)}) {
      const size_t bytes = range_mb << 20;
      // A pattern whose XOR over the range is known, to check the load form's checksum.
      std::vector<unsigned> pattern(bytes / sizeof(unsigned));
      unsigned expected_xor = 0;
      for (size_t i = 0; i < pattern.size(); ++i) expected_xor ^= pattern[i] = unsigned(i * 2654435761u + 12345u);
      DeviceBuffer<unsigned char> data(bytes);
      CUDA_CHECK(cudaMemcpy(data.data(), pattern.data(), bytes, cudaMemcpyHostToDevice));
      DeviceBuffer<unsigned> checksum{size_t(1)};
      double cold = 0, warm = 0;
      for (const Form& form : forms) {
        std::vector<float> read_ms, prefetch_ms;
        for (int round = 0; round < kRounds; ++round) {
          // Push the range out with a READ of the flush buffer: a memset would leave L2
          // full of dirty lines, whose write-backs would then slow every read below.
          read_range<<<read_blocks, kReadThreads, 0, stream>>>(reinterpret_cast<const uint4*>(flush.data()),
                                                               flush_bytes / 16, sums.data());
          L2PrefetchPlan plan;
          plan.range[0] = {data.data(), bytes};
          plan.count = 1;
          plan.form = form.prefetch_form;
          plan.checksum = checksum.data();
          CUDA_CHECK(cudaMemsetAsync(checksum.data(), 0, sizeof(unsigned), stream));
          plan.stride_bytes = form.stride;
          // Everything is queued before the GPU gets to it (the 20 us idle kernel covers
          // the host's launches), so the events time the kernels, not the launch path.
          CUDA_CHECK(cudaEventRecord(prefetch_start, stream));
          if (form.prefetch) l2_prefetch(plan, form.blocks, stream);
          if (form.warm) {
            read_range<<<read_blocks, kReadThreads, 0, stream>>>(reinterpret_cast<const uint4*>(data.data()),
                                                                 bytes / 16, sums.data());
          }
          CUDA_CHECK(cudaEventRecord(prefetch_end, stream));
          spin_ns<<<1, 1, 0, stream>>>(20000);  // 20 us idle: the requests retire
          CUDA_CHECK(cudaEventRecord(before, stream));
          read_range<<<read_blocks, kReadThreads, 0, stream>>>(reinterpret_cast<const uint4*>(data.data()),
                                                               bytes / 16, sums.data());
          CUDA_CHECK(cudaGetLastError());
          CUDA_CHECK(cudaEventRecord(after, stream));
          CUDA_CHECK(cudaStreamSynchronize(stream));
          float ms = 0;
          CUDA_CHECK(cudaEventElapsedTime(&ms, prefetch_start, prefetch_end));
          prefetch_ms.push_back(ms);
          CUDA_CHECK(cudaEventElapsedTime(&ms, before, after));
          read_ms.push_back(ms);
          if (form.prefetch_form == L2PrefetchForm::kLoads && form.prefetch) {
            unsigned got = 0;
            CUDA_CHECK(cudaMemcpy(&got, checksum.data(), sizeof(got), cudaMemcpyDeviceToHost));
            if (got != expected_xor) {
              std::fprintf(stderr, "bench_l2_prefetch: the load form's checksum is %08x, expected %08x\n", got,
                           expected_xor);
              return 1;
            }
          }
        }
        std::sort(read_ms.begin(), read_ms.end());
        std::sort(prefetch_ms.begin(), prefetch_ms.end());
        const double read_us = 1000.0 * read_ms[kRounds / 2];
        if (&form == &forms[0]) cold = read_us;
        if (&form == &forms[1]) warm = read_us;
        const double landed = cold > warm ? (cold - read_us) / (cold - warm) : 0.0;
        table.add_row({std::to_string(range_mb), form.name,
                       form.prefetch ? fmt(1000.0 * prefetch_ms[kRounds / 2], 1) : "",
                       fmt(read_us, 2), fmt(gb_per_s(double(bytes), read_us * 1e-3), 0),
                       &form == &forms[0] ? "" : fmt(100.0 * landed, 0) + "%"});
      }
    }
    table.print();
    for (cudaEvent_t event : {before, after, prefetch_start, prefetch_end}) cudaEventDestroy(event);
    cudaStreamDestroy(stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_l2_prefetch: %s\n", e.what());
    return 1;
  }
}
