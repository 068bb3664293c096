/// @file bench.cuh
/// @brief The GPU benchmark harness shared by every bench_* program.
///
/// Method (docs/conventions.md): warm up, then time each repeat with CUDA events around
/// the launch only, flush the L2 cache between repeats (a memset of a buffer twice the
/// L2 size) so memory-bound kernels are measured from HBM and not from cache, and report
/// the median. Throughput is compared with ceilings measured in the same run: the
/// device-to-device copy bandwidth (bytes read + bytes written) and cuBLAS.
#pragma once

#include <functional>
#include <string>
#include <vector>

// cudaStream_t is `CUstream_st*` (cuda_runtime.h); declared here so that C++-only files
// can include this header without the CUDA headers.
struct CUstream_st;

namespace bielik {

struct BenchOptions {
  int warmup = 3;         ///< untimed launches first (module load, caches, clocks)
  int repeats = 30;       ///< timed launches; the median is reported
  bool flush_l2 = true;   ///< scrub L2 before each timed launch
};

struct BenchTiming {
  double median_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  int repeats = 0;
};

/// Times `launch` (which enqueues work on the default stream) with CUDA events.
BenchTiming time_gpu(const std::function<void()>& launch, const BenchOptions& options = {});

/// Steady-state time of one launch when `count` launches are queued back to back, as
/// inside a model's forward pass: the CPU-side launch latency then overlaps the previous
/// kernel. `launch(i)` enqueues launch i; give each i its own buffers (rotating over more
/// bytes than the L2 holds) so the kernel still reads from HBM. Returns the median over
/// `samples` of (time of the whole batch) / count.
BenchTiming time_gpu_back_to_back(const std::function<void(int)>& launch, int count, int samples = 10);

/// The same steady state with the CPU out of the way: the `count` launches are captured
/// once into a CUDA graph (`launch(i, stream)` enqueues launch i on `stream`; kernels
/// launched with programmatic dependent launch keep it as a graph edge), and the graph
/// is replayed; returns the median over `samples` replays of (replay time) / count.
/// This is how a decode step runs its kernels, and it takes the host's launch rate
/// (several us per launch on some machines) out of the measurement of short kernels.
BenchTiming time_gpu_graph(const std::function<void(int, CUstream_st*)>& launch, int count, int samples = 10);

/// Median device-to-device copy bandwidth in GB/s, counting bytes read plus bytes
/// written, over a copy of `bytes` bytes. This is the ceiling for memory-bound kernels.
double measure_copy_bandwidth_gbs(size_t bytes = size_t(1) << 30);

/// "NVIDIA H200 (sm_90, 132 SMs)".
std::string describe_device();

/// GB/s for `bytes` moved in `ms` milliseconds (1 GB = 1e9 bytes).
inline double gb_per_s(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }
/// TFLOP/s for `flops` in `ms` milliseconds.
inline double tflop_per_s(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

/// A Markdown table printed at the end of a benchmark, so it pastes into a README.
/// When the environment variable BIELIK_BENCH_DIR is set, the rows are also written to
/// $BIELIK_BENCH_DIR/NAME.csv (NAME: the table's name) for the benchmark report.
class BenchTable {
 public:
  BenchTable(std::string name, std::vector<std::string> columns);
  void add_row(std::vector<std::string> cells);
  void print() const;

 private:
  std::string name_;
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

/// printf-style number formatting for table cells: fmt(1.2345, 2) == "1.23".
std::string fmt(double value, int decimals = 2);

}  // namespace bielik
