// linear_cublaslt.cpp: v3 of the projection, CublasLtLinear: cuBLASLt with the fastest of its candidate
// algorithms for each shape, timed once; above kTunedMaxRows, once for each power-of-two bucket of rows
// (the contract is in linear.h).
//
// Why: at decode batch sizes (M = 32 ... 256) cublasGemmEx's default picks big output tiles, and a
// (256 x 1024) output cut into 128 x 128 tiles is 16 blocks for 132 SMs: o_proj and down_proj ran at
// 14-18% of copy bandwidth (05_attention/NOTES.md). cuBLASLt's heuristic offers other tilings and
// split-K configurations; which one wins is an empirical question, so we time them on the real shape.
//
// Why the buckets: cublasGemmEx chooses its algorithm on the host at every call, and a row count it has
// not seen costs it 0.3-4 ms there (81-122 ms the first time a process runs a prefill-sized product),
// while the GPU, at the start of a prefill step, has nothing queued to run meanwhile. Prompts bring a new
// row count almost every prefill step (04_model_runner/NOTES.md, section 11).
//
// The product is the same column-major reading as linear_cuda.cpp: D (out, n) = W^T (out, in) x (in, n),
// where W is the column-major (in, out) matrix in W's memory, used transposed.
#ifdef NANOVLLM_CUDA
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "06_tensor_parallel/linear.h"

namespace nanovllm {

namespace {

void check_lt(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt ", call, " failed: ", cublasGetStatusString(status));
}

// The descriptors of one product, initialised in place: no allocation, so they can be built inside a
// stream capture.
struct Problem {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t w, x, y;  // W: column-major (in, out); x: (in, n); y: (out, n)

  Problem(bool y_is_fp32, int n, int in, int out) {
    check_lt(cublasLtMatmulDescInit(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescInit");
    const cublasOperation_t transpose = CUBLAS_OP_T;
    check_lt(cublasLtMatmulDescSetAttribute(&op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)),
             "cublasLtMatmulDescSetAttribute");
    check_lt(cublasLtMatrixLayoutInit(&w, CUDA_R_16BF, uint64_t(in), uint64_t(out), int64_t(in)), "cublasLtMatrixLayoutInit");
    check_lt(cublasLtMatrixLayoutInit(&x, CUDA_R_16BF, uint64_t(in), uint64_t(n), int64_t(in)), "cublasLtMatrixLayoutInit");
    check_lt(cublasLtMatrixLayoutInit(&y, y_is_fp32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(out), uint64_t(n), int64_t(out)),
             "cublasLtMatrixLayoutInit");
  }
};

// A shape whose algorithm is chosen once. rows is chosen_rows(n); alignment is the largest power of two,
// up to 256, that divides the addresses of x, W and y (an algorithm may need aligned buffers).
struct ShapeKey {
  int device, rows, in, out;
  bool y_is_fp32;
  int alignment;
  bool operator<(const ShapeKey& o) const {
    return std::tie(device, rows, in, out, y_is_fp32, alignment) <
           std::tie(o.device, o.rows, o.in, o.out, o.y_is_fp32, o.alignment);
  }
};

struct Choice {
  bool found = false;  // false: cuBLASLt offers no algorithm for this shape (v1 runs instead)
  cublasLtMatmulAlgo_t algo{};
};

// The process-wide table of choices (see linear.h: why one table).
struct ChoiceTable {
  std::mutex mutex;
  std::map<ShapeKey, Choice> choices;
};
ChoiceTable& choice_table() {
  static ChoiceTable table;
  return table;
}

// The row count of n's choice: up to kTunedMaxRows, n rounded up to a multiple of 16 (the CUDA graph batch
// sizes above 16 are multiples of 16, but for max_num_seqs, the last, which takes the choice of the multiple
// above it); above, the power of two at or above n (one choice serves every prompt length of the bucket).
int chosen_rows(int n) {
  if (n <= kTunedMaxRows) return (n + 15) / 16 * 16;
  int rows = kTunedMaxRows;
  while (rows < n) rows *= 2;
  return rows;
}

int alignment_of(const void* p) {
  int a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % uintptr_t(a) != 0) a /= 2;
  return a;
}

}  // namespace

CublasLtLinear::CublasLtLinear(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
  CUDA_CHECK(cudaEventCreate(&start_));
  CUDA_CHECK(cudaEventCreate(&stop_));
  // The buffer that evicts L2 between timed runs, allocated once here: a cudaMalloc or cudaFree later,
  // in the middle of a run, may wait for the whole GPU, and with tensor-parallel ranks sharing it, for a
  // peer spinning in a collective that waits for this rank (06_tensor_parallel/all_reduce.h).
  int device = 0, l2_bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  if (cudaMalloc(&flush_, size_t(l2_bytes)) == cudaSuccess) {
    flush_bytes_ = size_t(l2_bytes);
  } else {
    (void)cudaGetLastError();  // without the memory for it, candidates are timed warm
    flush_ = nullptr;
  }
}

CublasLtLinear::~CublasLtLinear() {
  if (flush_) cudaFree(flush_);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cublasLtDestroy(handle_);
}

size_t CublasLtLinear::chosen_shapes() {
  ChoiceTable& table = choice_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  return table.choices.size();
}

bool CublasLtLinear::has_choice(int n, int in_features, int out_features, bool y_is_fp32) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  ChoiceTable& table = choice_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  return table.choices.count(ShapeKey{device, chosen_rows(n), in_features, out_features, y_is_fp32, 256}) > 0;
}

bool CublasLtLinear::run(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                         int out_features) {
  if (n == 0 || out_features == 0) return true;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int alignment = std::min(alignment_of(x), std::min(alignment_of(W), alignment_of(y)));
  const ShapeKey key{device, chosen_rows(n), in_features, out_features, y_is_fp32, alignment};
  Problem p(y_is_fp32, n, in_features, out_features);
  const float alpha = 1.0f, beta = 0.0f;
  // y = 1 * W^T x + 0 * y (beta 0: y is not read).
  auto matmul = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, &p.op, &alpha, W, &p.w, x, &p.x, &beta, y, &p.y, y, &p.y, &algo, workspace_,
                          workspace_bytes_, stream_);
  };

  Choice choice;
  bool known = false;
  {
    ChoiceTable& table = choice_table();
    std::lock_guard<std::mutex> lock(table.mutex);
    auto it = table.choices.find(key);
    if (it != table.choices.end()) choice = it->second, known = true;
  }
  if (!known) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) return false;  // no timing (it synchronises) inside a capture

    // Candidates: what the heuristic offers within our workspace and alignment.
    cublasLtMatmulPreferenceOpaque_t preference;
    check_lt(cublasLtMatmulPreferenceInit(&preference), "cublasLtMatmulPreferenceInit");
    const uint64_t max_workspace = workspace_bytes_;
    check_lt(cublasLtMatmulPreferenceSetAttribute(&preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                  sizeof(max_workspace)),
             "cublasLtMatmulPreferenceSetAttribute");
    const uint32_t align = uint32_t(alignment);
    for (cublasLtMatmulPreferenceAttributes_t attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check_lt(cublasLtMatmulPreferenceSetAttribute(&preference, attribute, &align, sizeof(align)),
               "cublasLtMatmulPreferenceSetAttribute");
    cublasLtMatmulHeuristicResult_t candidates[kCandidates] = {};
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(handle_, &p.op, &p.w, &p.x, &p.y, &p.y, &preference, kCandidates, candidates,
                                       &found) != CUBLAS_STATUS_SUCCESS)
      found = 0;

    // L2 (50 MB on an H200) would hold these weights between runs; a decode step reads them from memory.
    // Overwriting a buffer of L2's size (flush_) before each run evicts them.
    float best_ms = FLT_MAX;
    for (int i = 0; i < found; i++) {
      if (candidates[i].state != CUBLAS_STATUS_SUCCESS || matmul(candidates[i].algo) != CUBLAS_STATUS_SUCCESS) continue;
      float total_ms = 0;  // the first run above was the warm-up
      for (int r = 0; r < kTimedRuns; r++) {
        if (flush_) CUDA_CHECK(cudaMemsetAsync(flush_, r, flush_bytes_, stream_));
        CUDA_CHECK(cudaEventRecord(start_, stream_));
        check_lt(matmul(candidates[i].algo), "cublasLtMatmul");
        CUDA_CHECK(cudaEventRecord(stop_, stream_));
        CUDA_CHECK(cudaEventSynchronize(stop_));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
        total_ms += ms;
      }
      if (total_ms < best_ms) best_ms = total_ms, choice.found = true, choice.algo = candidates[i].algo;
    }
    ChoiceTable& table = choice_table();
    std::lock_guard<std::mutex> lock(table.mutex);
    table.choices.emplace(key, choice);  // another thread may have chosen first: theirs stays
    choice = table.choices.at(key);
  }
  // The algorithm was chosen for one n of the bucket; should cuBLASLt refuse it for this n (a workspace
  // that grows with n, say), nothing was queued and v1 runs instead. cuBLASLt checks the algorithm against
  // the shape when it is called, on the host, without choosing anything.
  return choice.found && matmul(choice.algo) == CUBLAS_STATUS_SUCCESS;
}

}  // namespace nanovllm
#endif
