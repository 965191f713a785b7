// linear_cuda.cpp: v1 of the projection, y (n, out) = x (n, in) @ W (out, in)^T in one cuBLAS call, and
// CudaLinear, which picks the version for each call (the others: linear.h lists their files).
//
// cuBLAS is column-major. A row-major (rows, cols) matrix is the column-major (cols, rows) matrix with
// the same memory, so the row-major product y = x W^T is the column-major y^T = W x^T: with A = W
// (column-major (in, out), used transposed) and B = x (column-major (in, n), used as is),
// C = y (column-major (out, n)). No copy, no transpose kernel.
#ifdef NANOVLLM_CUDA
#include "06_tensor_parallel/linear.h"

#include <atomic>

namespace nanovllm {

namespace {
// CudaLinear::partials_runs and narrow_wgmma_runs; atomic, as each rank's thread has a CudaLinear of its own.
std::atomic<size_t> g_partials_runs{0}, g_narrow_wgmma_runs{0};
}  // namespace

void linear_cuda(cublasHandle_t handle, void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n,
                 int in_features, int out_features, int sm_target) {
  if (n == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  // The handle keeps its target from call to call, so every call sets its own.
  if (cublasSetSmCountTarget(handle, sm_target) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS refused an SM target of ", sm_target);
  cublasStatus_t status = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out_features, n, in_features, &alpha, W,
                                       CUDA_R_16BF, in_features, x, CUDA_R_16BF, in_features, &beta, y,
                                       y_is_fp32 ? CUDA_R_32F : CUDA_R_16BF, out_features, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS GEMM failed (", cublasGetStatusString(status), ") for (", n, " x ", in_features, ") @ (",
         out_features, " x ", in_features, ")^T");
}

CudaLinear::CudaLinear(cublasHandle_t cublas, cudaStream_t stream, void* workspace, size_t workspace_bytes,
                       int version)
    : cublas_(cublas), stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes),
      lt_(stream, workspace, workspace_bytes), version_(version) {
  if (version < kLinearVersionMin || version > kLinearVersionMax)
    fail("linear version ", version, " does not exist (", kLinearVersionMin, " to ", kLinearVersionMax, ")");
}

void CudaLinear::run(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                     int spare_sms) {
  if (n == 0) return;
  if (runs_wgmma(x, W, n, in_features, out_features,
                 out_features <= kWgmmaNarrowOut ? kWgmmaNarrowRows : kWgmmaFasterRows)) {
    linear_wgmma_cuda(y, y_is_fp32, x, W, n, in_features, out_features, stream_);
    if (n > kWgmmaFasterRows) g_narrow_wgmma_runs++;
    return;
  }
  if (version_ >= 5 && n > kGemvFasterRows && n <= kGemvMmaFasterRows && linear_gemv_fits(x, W, n, in_features)) {
    linear_gemv_mma_cuda(y, y_is_fp32, x, W, n, in_features, out_features, stream_);
    return;
  }
  if (version_ == 4 && n > kGemvFasterRows && n <= kTunedMaxRows && linear_split_k_fits(x, W, n, in_features)) {
    linear_split_k_cuda(y, y_is_fp32, x, W, n, in_features, out_features, workspace_, workspace_bytes_, stream_);
    return;
  }
  if (version_ >= 2 && n <= kGemvFasterRows && linear_gemv_fits(x, W, n, in_features)) {
    linear_gemv_cuda(y, y_is_fp32, x, W, n, in_features, out_features, stream_);
    return;
  }
  // v3's timed choice: up to kTunedMaxRows with version 3, and from version 2 on for the wide outputs (the
  // LM head) there and for every projection above (prefill), once per bucket of rows.
  const bool timed = version_ == 3 || (version_ >= 2 && (out_features > kTunedWideOut || n > kTunedMaxRows));
  if (timed && lt_.run(y, y_is_fp32, x, W, n, in_features, out_features)) return;
  linear_cuda(cublas_, y, y_is_fp32, x, W, n, in_features, out_features, sm_target(spare_sms));
}

int CudaLinear::sm_target(int spare_sms) {
  if (spare_sms <= 0) return 0;
  const int sms = multiprocessor_count();
  return sms > 2 * spare_sms ? sms - spare_sms : 0;  // a small GPU keeps every SM for the GEMM
}

bool CudaLinear::runs_wgmma(const bf16* x, const bf16* W, int n, int in_features, int out_features,
                            int max_rows) const {
  return version_ >= 6 && n > kGemvMmaFasterRows && n <= max_rows && out_features <= kWgmmaMaxOut &&
         linear_split_k_fits(x, W, n, in_features) && linear_wgmma_available();
}

int CudaLinear::run_partials(float* partials, const bf16* x, const bf16* W, int n, int in_features, int out_features) {
  if (version_ != 8 || n < kWgmmaPartialsMinRows || out_features > kWgmmaNarrowOut ||
      !runs_wgmma(x, W, n, in_features, out_features, kWgmmaPartialsMaxRows))
    return 0;
  const int splits = linear_wgmma_partials_cuda(partials, x, W, n, in_features, out_features, stream_);
  if (splits > 0) g_partials_runs++;
  return splits;
}

size_t CudaLinear::partials_runs() { return g_partials_runs.load(); }
size_t CudaLinear::narrow_wgmma_runs() { return g_narrow_wgmma_runs.load(); }

bool CudaLinear::run_silu(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features) {
  if (!fuses_silu(n) || out_features % 2 != 0) return false;
  if (n <= kGemvFasterRows) {  // v2's rows, as run
    if (!linear_gemv_fits(x, W, n, in_features)) return false;
    linear_gemv_silu_cuda(y, x, W, n, in_features, out_features, stream_);
    return true;
  }
  if (n <= kGemvMmaFasterRows)  // v5's rows, as run
    return linear_gemv_mma_silu_cuda(y, x, W, n, in_features, out_features, stream_);
  if (!runs_wgmma(x, W, n, in_features, out_features, kWgmmaSiluRows)) return false;
  linear_wgmma_silu_cuda(y, x, W, n, in_features, out_features, stream_);
  return true;
}

}  // namespace nanovllm
#endif
