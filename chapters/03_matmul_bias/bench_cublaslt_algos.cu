// bench_cublaslt_algos: what cuBLASLt's heuristic picks for Bielik's prefill GEMMs, and
// what the same algorithms do with their K loop split over more thread blocks (split-K).
//
// Why: at a 512-token prompt the O projection's output is 512 x 1536, 48 tiles of
// 128 x 128 for 132 SMs, and down's K = 8960 is long. An output tile is one SM's work,
// so fewer tiles than SMs leave SMs idle unless the K loop is split (each split
// accumulates its share of K; a reduction adds the shares). This program prints, for
// each shape and T: the heuristic's top algorithms (its tile, stages, split-K and time),
// then the first one forced to split K in 2..8 parts with each reduction scheme
// cuBLASLt allows (cublasLtMatmulAlgoCheck must accept it; the bias epilogue stays on).
// Each time is the median of 7 runs, each after a 256 MB memset that pushes the weights
// out of L2 (in the model every layer's weights come from HBM). Every split result is
// checked against the heuristic's first pick (max abs difference).
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.cuh"
#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

constexpr size_t kWorkspaceBytes = size_t(64) << 20;

struct Shape {
  const char* name;
  int C_in, C_out;
};

struct Problem {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
};

// y^T = W x^T in cuBLAS's column-major view, bias epilogue (matmul_cublaslt.cu explains).
Problem make_problem(int T, int C_in, int C_out, const __nv_bfloat16* bias) {
  Problem p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t transpose = CUBLAS_OP_T, as_is = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.operation, CUBLASLT_MATMUL_DESC_TRANSB, &as_is, sizeof(as_is)));
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  cudaDataType_t bias_type = CUDA_R_16BF;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, C_in, C_out, C_in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, C_in, T, C_in));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, C_out, T, C_out));
  return p;
}

void destroy(Problem& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.d);
  cublasLtMatmulDescDestroy(p.operation);
}

template <typename T>
T config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  T value{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof(value), &written);
  return value;
}

std::string describe(const cublasLtMatmulAlgo_t& algo) {
  return "id " + std::to_string(config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + ", tile " +
         std::to_string(config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID)) + ", stages " +
         std::to_string(config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) + ", cluster " +
         std::to_string(config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)) + ", split-K " +
         std::to_string(config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + ", reduction " +
         std::to_string(config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
}

}  // namespace

int main() {
  if (!cuda_device_available()) {
    std::printf("bench_cublaslt_algos: no CUDA device\n");
    return 1;
  }
  std::printf("device: %s\n", describe_device().c_str());
  cublasLtHandle_t handle;
  CUBLAS_CHECK(cublasLtCreate(&handle));
  DeviceBuffer<char> workspace(kWorkspaceBytes);
  DeviceBuffer<char> flush(size_t(256) << 20);
  const Shape shapes[] = {{"qkv 1536->2048", 1536, 2048},
                          {"o 1536->1536", 1536, 1536},
                          {"gate_up 1536->17920", 1536, 17920},
                          {"down 8960->1536", 8960, 1536}};
  BenchTable table("cublaslt_algos", {"shape", "T", "algorithm", "us (median, L2 flushed)", "vs first pick",
                                      "max abs diff vs first pick"});
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (const Shape& shape : shapes) {
    for (int T : {128, 512, 2048}) {
      const std::vector<uint16_t> x_host = random_bf16(size_t(T) * shape.C_in, 1, 1.0f);
      const std::vector<uint16_t> w_host = random_bf16(size_t(shape.C_out) * shape.C_in, 2, 0.03f);
      const std::vector<uint16_t> b_host = random_bf16(shape.C_out, 3, 0.5f);
      DeviceBuffer<uint16_t> x(x_host), W(w_host), bias(b_host), y(size_t(T) * shape.C_out),
          y_first(size_t(T) * shape.C_out);
      auto bf16 = [](DeviceBuffer<uint16_t>& b) { return reinterpret_cast<__nv_bfloat16*>(b.data()); };
      Problem p = make_problem(T, shape.C_in, shape.C_out, bf16(bias));
      cublasLtMatmulPreference_t preference;
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
      size_t workspace_bytes = kWorkspaceBytes;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &workspace_bytes, sizeof(workspace_bytes)));
      constexpr int kTop = 8;
      cublasLtMatmulHeuristicResult_t results[kTop];
      int found = 0;
      CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, p.operation, p.a, p.b, p.d, p.d, preference, kTop, results,
                                                  &found));
      cublasLtMatmulPreferenceDestroy(preference);
      auto run = [&](const cublasLtMatmulAlgo_t& algo, DeviceBuffer<uint16_t>& out) {
        const float alpha = 1.0f, beta = 0.0f;
        return cublasLtMatmul(handle, p.operation, &alpha, W.data(), p.a, x.data(), p.b, &beta, out.data(), p.d,
                              out.data(), p.d, &algo, workspace.data(), kWorkspaceBytes, 0);
      };
      auto time = [&](const cublasLtMatmulAlgo_t& algo) {
        std::vector<float> times;
        for (int i = 0; i < 7; ++i) {
          CUDA_CHECK(cudaMemsetAsync(flush.data(), i, flush.bytes()));
          CUDA_CHECK(cudaEventRecord(start));
          CUBLAS_CHECK(run(algo, y));
          CUDA_CHECK(cudaEventRecord(stop));
          CUDA_CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
          times.push_back(ms * 1000.0f);
        }
        std::sort(times.begin(), times.end());
        return double(times[times.size() / 2]);
      };
      auto difference = [&]() {
        const std::vector<uint16_t> a = y.to_host(), b = y_first.to_host();
        double worst = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          worst = std::max(worst, double(std::fabs(bf16_bits_to_float(a[i]) - bf16_bits_to_float(b[i]))));
        }
        return worst;
      };
      const std::string shape_name = shape.name;
      double first_us = 0;
      for (int i = 0; i < found; ++i) {
        const double us = time(results[i].algo);
        if (i == 0) {
          first_us = us;
          CUBLAS_CHECK(run(results[0].algo, y_first));
          CUDA_CHECK(cudaDeviceSynchronize());
        }
        table.add_row({shape_name, std::to_string(T), "heuristic #" + std::to_string(i) + ": " + describe(results[i].algo),
                       fmt(us, 1), fmt(first_us / us, 2) + "x", fmt(difference(), 4)});
      }
      // The first pick with its K loop split, each reduction scheme cuBLASLt accepts.
      uint32_t schemes = 0;
      size_t written = 0;
      cublasLtMatmulAlgoCapGetAttribute(&results[0].algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                        sizeof(schemes), &written);
      int32_t splitk_support = 0;
      cublasLtMatmulAlgoCapGetAttribute(&results[0].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_support,
                                        sizeof(splitk_support), &written);
      std::printf("%s T=%d: first pick split-K support %d, reduction scheme mask 0x%x\n", shape.name, T,
                  splitk_support, schemes);
      for (uint32_t splits : {2u, 3u, 4u, 6u, 8u}) {
        for (uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE),
                                uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                                uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
          if (!(schemes & scheme)) continue;
          cublasLtMatmulAlgo_t algo = results[0].algo;
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits));
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme));
          cublasLtMatmulHeuristicResult_t check{};
          if (cublasLtMatmulAlgoCheck(handle, p.operation, p.a, p.b, p.d, p.d, &algo, &check) !=
                  CUBLAS_STATUS_SUCCESS ||
              check.workspaceSize > kWorkspaceBytes) {
            continue;
          }
          const double us = time(algo);
          table.add_row({shape_name, std::to_string(T), "first pick, split-K " + std::to_string(splits) +
                                                            ", reduction " + std::to_string(scheme),
                         fmt(us, 1), fmt(first_us / us, 2) + "x", fmt(difference(), 4)});
        }
      }
      destroy(p);
      std::fflush(stdout);
    }
  }
  table.print();
  cublasLtDestroy(handle);
  return 0;
}
