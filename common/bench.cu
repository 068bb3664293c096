#include "bench.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cuda_check.cuh"
#include "device_buffer.cuh"

namespace bielik {

BenchTiming time_gpu(const std::function<void()>& launch, const BenchOptions& options) {
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  DeviceBuffer<char> scrub(options.flush_l2 ? size_t(std::max(l2_bytes, 1 << 20)) * 2 : 0);

  for (int i = 0; i < options.warmup; ++i) launch();
  CUDA_CHECK(cudaDeviceSynchronize());

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < options.repeats; ++i) {
    if (options.flush_l2) CUDA_CHECK(cudaMemsetAsync(scrub.data(), i & 0xff, scrub.bytes()));
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  BenchTiming timing;
  timing.repeats = static_cast<int>(times.size());
  timing.median_ms = times[times.size() / 2];
  timing.min_ms = times.front();
  timing.max_ms = times.back();
  return timing;
}

namespace {

// Median over `samples` of the time of enqueue() on `stream`, divided by `count` (the
// launches enqueue() makes), between two events on that stream.
BenchTiming median_per_launch(const std::function<void()>& enqueue, cudaStream_t stream, int count, int samples) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int s = 0; s < samples; ++s) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    enqueue();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms / count);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return BenchTiming{times[times.size() / 2], times.front(), times.back(), samples};
}

}  // namespace

BenchTiming time_gpu_back_to_back(const std::function<void(int)>& launch, int count, int samples) {
  for (int i = 0; i < count; ++i) launch(i);  // warm-up
  CUDA_CHECK(cudaDeviceSynchronize());
  return median_per_launch([&] { for (int i = 0; i < count; ++i) launch(i); }, 0, count, samples);
}

BenchTiming time_gpu_graph(const std::function<void(int, CUstream_st*)>& launch, int count, int samples) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < count; ++i) launch(i, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const BenchTiming timing =
      median_per_launch([&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, stream, count, samples);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return timing;
}

double measure_copy_bandwidth_gbs(size_t bytes) {
  DeviceBuffer<char> source(bytes), destination(bytes);
  source.fill_bytes(1);
  BenchTiming timing = time_gpu(
      [&] { CUDA_CHECK(cudaMemcpyAsync(destination.data(), source.data(), bytes, cudaMemcpyDeviceToDevice)); },
      BenchOptions{3, 20, false});  // 1 GiB dwarfs the L2: no flush needed
  return gb_per_s(2.0 * double(bytes), timing.median_ms);
}

std::string describe_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  std::ostringstream text;
  text << properties.name << " (sm_" << properties.major << properties.minor << ", "
       << properties.multiProcessorCount << " SMs, " << (properties.totalGlobalMem >> 30) << " GiB)";
  return text.str();
}

BenchTable::BenchTable(std::string name, std::vector<std::string> columns)
    : name_(std::move(name)), columns_(std::move(columns)) {}

void BenchTable::add_row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

void BenchTable::print() const {
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = columns_[c].size();
    for (const auto& row : rows_) widths[c] = std::max(widths[c], c < row.size() ? row[c].size() : 0);
  }
  auto print_row = [&](const std::vector<std::string>& cells) {
    std::printf("|");
    for (size_t c = 0; c < columns_.size(); ++c) {
      std::printf(" %-*s |", int(widths[c]), c < cells.size() ? cells[c].c_str() : "");
    }
    std::printf("\n");
  };
  std::printf("\n### %s\n\n", name_.c_str());
  print_row(columns_);
  std::printf("|");
  for (size_t c = 0; c < columns_.size(); ++c) std::printf("%s|", std::string(widths[c] + 2, '-').c_str());
  std::printf("\n");
  for (const auto& row : rows_) print_row(row);
  std::fflush(stdout);

  if (const char* directory = std::getenv("BIELIK_BENCH_DIR")) {
    std::string file_name = name_;  // table names may hold '/' ("TFLOP/s"): not in a file name
    for (char& c : file_name) {
      if (c == '/' || c == ' ') c = '_';
    }
    // CSV (RFC 4180): a field with a comma or a quote is quoted, its quotes doubled.
    auto field = [](const std::string& text) {
      if (text.find_first_of(",\"\n") == std::string::npos) return text;
      std::string quoted = "\"";
      for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
      return quoted + "\"";
    };
    std::ofstream csv(std::string(directory) + "/" + file_name + ".csv");
    for (size_t c = 0; c < columns_.size(); ++c) csv << (c ? "," : "") << field(columns_[c]);
    csv << "\n";
    for (const auto& row : rows_) {
      for (size_t c = 0; c < row.size(); ++c) csv << (c ? "," : "") << field(row[c]);
      csv << "\n";
    }
  }
}

std::string fmt(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

}  // namespace bielik
