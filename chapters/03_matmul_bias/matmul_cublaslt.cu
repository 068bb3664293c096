// The reference GEMM: cuBLASLt with its bias epilogue.
//
// cuBLAS is column-major (Fortran's convention): a matrix "A, m x k, leading dimension
// lda" is element (i, j) at A[i + j * lda]. Our tensors are row-major (C's convention):
// element (i, j) of a (rows, cols) tensor is at p[i * cols + j]. The same bytes read
// the other way round are the TRANSPOSE: a row-major (R, C) tensor IS a column-major
// (C, R) matrix with leading dimension C. No copy, only a change of glasses.
//
// Now look at our three tensors through column-major glasses:
//   y (T, C_out) row-major     = y^T, column-major C_out x T, ld = C_out
//   x (T, C_in)  row-major     = x^T, column-major C_in x T,  ld = C_in
//   W (C_out, C_in) row-major  = W^T, column-major C_in x C_out, ld = C_in
// and transpose the formula:   y = x W^T   <=>   y^T = W x^T.
// So we ask cuBLAS for D = op(A) * op(B) with
//   D = y^T  (m = C_out, n = T),
//   A = the bytes of W, which it sees as W^T (C_in x C_out): op(A) = transpose -> W,
//   B = the bytes of x, which it sees as x^T (C_in x T):     op(B) = as is     -> x^T,
//   k = C_in.
// "Transpose A, not B" is the TN GEMM; both operands have k contiguous, the layout
// tensor cores read best, and the one HuggingFace's weights already have.
//
// The bias: CUBLASLT_EPILOGUE_BIAS adds a vector with one entry per ROW of D, broadcast
// over D's columns. Rows of D = y^T are our output features n: exactly b[n] added to
// every token, inside the GEMM, with no extra pass over y. It is not one rounding,
// though: with a bf16 output the product is rounded before the bias is added (measured by
// test_matmul_gpu.cpp on an H100, 2026-12-05: -3.0 where one rounding gives -3.0156), so
// cuBLASLt's outputs can be a bf16 step further from the exact answer than our kernels'.
//
// Caching: creating a handle, a matmul descriptor, layouts and running the algorithm
// heuristic costs tens of microseconds, more than a decode GEMV. They are made once
// per (shape, bias, pointer alignment) and kept for the life of the process.
//
// Alignment: cuBLASLt (13.0 on the H200) refuses bf16 operands that are only 2-byte
// aligned (a tensor starting at an odd element): CUBLAS_STATUS_NOT_SUPPORTED. The model
// never does that, but a library function should not fail on legal input, so such a
// call is handed to our v4 kernel, which has a scalar path for any alignment, and the
// plan remembers the refusal.
#include <cublasLt.h>

#include <map>
#include <stdexcept>
#include <string>
#include <mutex>
#include <tuple>

#include "cuda_check.cuh"
#include "device_buffer.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"

namespace bielik {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// Largest power of two (up to 16) dividing the address: cuBLASLt chooses kernels by it.
int alignment_of(const void* p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  int alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

struct PlanKey {
  int T, C_in, C_out;
  bool has_bias;
  int align_y, align_x, align_W, align_bias;
  bool w_in_out;  ///< W stored (C_in, C_out) (matmul_cublaslt_w_in_out), not (C_out, C_in)
  bool operator<(const PlanKey& o) const {
    return std::tie(T, C_in, C_out, has_bias, align_y, align_x, align_W, align_bias, w_in_out) <
           std::tie(o.T, o.C_in, o.C_out, o.has_bias, o.align_y, o.align_x, o.align_W, o.align_bias, o.w_in_out);
  }
};

struct Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  // W, x, y in cuBLAS's view
  cublasLtMatmulAlgo_t algorithm{};
  bool supported = true;  // false: cuBLASLt refused this shape/alignment, v4 runs it
};

class CublasLt {
 public:
  static CublasLt& instance() {
    static CublasLt lt;  // created at the first call, destroyed at exit
    return lt;
  }

  void matmul(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, int T,
              int C_in, int C_out, cudaStream_t stream, bool w_in_out = false) {
    // The plans and the workspace are shared. The lock orders the enqueueing only: two
    // calls on different streams may still run at once on the GPU and share workspace_.
    // Every caller of this book issues its GEMMs on one stream (chapter 08's model: its
    // own), so they never overlap. Ordering by an event, as chapter 06's scratch does,
    // would break chapter 08's prefill graphs: a captured stream cannot wait on an event
    // recorded outside the capture.
    std::lock_guard<std::mutex> lock(mutex_);
    PlanKey key{T, C_in, C_out, bias != nullptr, alignment_of(y), alignment_of(x), alignment_of(W),
                bias ? alignment_of(bias) : 16, w_in_out};
    auto found = plans_.find(key);
    if (found == plans_.end()) found = plans_.emplace(key, make_plan(key)).first;
    Plan& plan = found->second;
    if (plan.supported) {
      if (bias) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof(bias)));
      }
      const float alpha = 1.0f, beta = 0.0f;
      cublasStatus_t status = cublasLtMatmul(handle_, plan.operation, &alpha, W, plan.a, x, plan.b, &beta, y, plan.d,
                                             y, plan.d, &plan.algorithm, workspace_.data(), workspace_.bytes(), stream);
      if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
        CUBLAS_CHECK(status);
        return;
      }
      plan.supported = false;
    }
    if (w_in_out) {  // no kernel of ours reads that layout
      throw std::invalid_argument("matmul_cublaslt_w_in_out: cuBLASLt refused T=" + std::to_string(T) + " C_in=" +
                                  std::to_string(C_in) + " C_out=" + std::to_string(C_out) +
                                  " at these alignments (pass 16-byte aligned tensors)");
    }
    matmul_v4_tensor_cores(y, x, W, bias, T, C_in, C_out, stream);
  }

  ~CublasLt() {  // at exit; errors are ignored (the CUDA context may already be gone)
    for (auto& [key, plan] : plans_) {
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.d);
      cublasLtMatmulDescDestroy(plan.operation);
    }
    if (handle_) cublasLtDestroy(handle_);
  }

 private:
  CublasLt() : workspace_(kWorkspaceBytes) { CUBLAS_CHECK(cublasLtCreate(&handle_)); }

  Plan make_plan(const PlanKey& key) {
    Plan plan;
    // fp32 accumulation and fp32 alpha/beta; inputs and output bf16.
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // W stored (C_in, C_out) is column-major C_out x C_in already: A as is (the NN GEMM).
    cublasOperation_t transpose = CUBLAS_OP_T, as_is = CUBLAS_OP_N;
    const cublasOperation_t op_a = key.w_in_out ? as_is : transpose;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &as_is, sizeof(as_is)));
    cublasLtEpilogue_t epilogue = key.has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof(epilogue)));
    if (key.has_bias) {
      cudaDataType_t bias_type = CUDA_R_16BF;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                  sizeof(bias_type)));
    }
    // Column-major views (see the comment at the top): rows, columns, leading dimension.
    if (key.w_in_out) {
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, key.C_out, key.C_in, key.C_out));  // W
    } else {
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, key.C_in, key.C_out, key.C_in));  // W^T
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, key.C_in, key.T, key.C_in));      // x^T
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_16BF, key.C_out, key.T, key.C_out));    // y^T

    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    size_t workspace = kWorkspaceBytes;
    uint32_t align_a = key.align_W, align_b = key.align_x, align_d = key.align_y;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace, sizeof(workspace)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                      &align_a, sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                      &align_b, sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                      &align_d, sizeof(align_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                      &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.operation, plan.a, plan.b, plan.d, plan.d,
                                                           preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
      plan.supported = false;  // no algorithm for this shape and alignment
      return plan;
    }
    CUBLAS_CHECK(status);
    plan.algorithm = result.algo;
    return plan;
  }

  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<char> workspace_;
  std::map<PlanKey, Plan> plans_;
};

}  // namespace

void matmul_cublaslt(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                     int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_cublaslt", T, C_in, C_out);  // before the first call creates the handle
  if (T == 0 || C_out == 0) return;
  CublasLt::instance().matmul(y, x, W, bias, T, C_in, C_out, stream);
}

void matmul_cublaslt_w_in_out(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W_in_out,
                              const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_cublaslt_w_in_out", T, C_in, C_out);
  if (T == 0 || C_out == 0) return;
  CublasLt::instance().matmul(y, x, W_in_out, bias, T, C_in, C_out, stream, true);
}

}  // namespace bielik
