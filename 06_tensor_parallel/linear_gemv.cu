// linear_gemv.cu: v2 of the projection, y (n, out) = x (n, in) @ W (out, in)^T for n <= 16 rows: the
// small batches of decode, where a GEMM is a matrix-vector product in disguise.
//
// At n = 1 each weight is used once (one multiply-add per 2 bytes read), so the product is bound by how
// fast W streams from memory, and the tensor cores have nothing to do. Tiled GEMMs cut W into a few big
// output tiles (M = 1 pads a 64- or 128-row tile) and leave most SMs idle on the small matrices of a
// 0.6B model (o_proj: 1024 x 2048, 4 MB). This kernel gives every warp two weight rows (output features)
// and streams them with 16-byte loads; each chunk of x it loads is used for both rows, and x, at most
// 16 x 3072 bf16 = 96 KB, stays in L1 (W is loaded with the "streaming" hint so it does not push x out).
//
//   lane l of a warp:  chunks c = l, l + 32, l + 64, ... of 8 bf16 (16 bytes) along in_features
//                      (in = 1024: 128 chunks, 4 per lane, all requested before the first is used)
//   acc[m][r]:         lane l's part of y[m, o0 + r], fp32; a warp-wide sum at the end
//
// Versions of the projection (linear.h): v1 cublasGemmEx, v2 this kernel, v3 cuBLASLt with a timed
// algorithm. Prediction and measurement: 04_model_runner/NOTES.md. The CPU reference is linear_cpu.
#include <cstdint>

#include "06_tensor_parallel/linear.h"

namespace nanovllm {

namespace {

constexpr int kWarps = 4;           // warps per block (128 threads)
constexpr int kRowsPerWarp = 2;     // weight rows per warp: each x chunk loaded serves both
constexpr int kChunksInFlight = 4;  // 16-byte weight loads per lane and row issued before any is used:
                                    // 2 rows x 4 x 16 B = 128 B per lane, 4 KB per warp in flight

// y (n, out) OutT = x (n, in) bf16 @ W (out, in)^T bf16, n <= MAX_N; in % 8 == 0, x and W 16-byte aligned.
// Warp w of block b computes output features o0 = (b * kWarps + w) * kRowsPerWarp and o0 + 1 for every
// row m < n (out = 4096: 2048 warps, 512 blocks).
// SILU (the MLP's gate_up with its activation in the ending): warp w of block b takes feature
// j = b * kWarps + w, its two weight rows are gate row j and up row out / 2 + j, and it writes
// y (n, out / 2) bf16 [m][j] = silu(gate) * up, each rounded to bf16 first as the projection would store it:
// the bits of this kernel's projection followed by silu_and_mul_kernel (04_model_runner/layers.cu).
template <int MAX_N, class OutT, bool SILU = false>
__global__ void __launch_bounds__(kWarps * 32)
    linear_gemv_kernel(OutT* y, const bf16* x, const bf16* W, int n, int in, int out) {
  static_assert(kRowsPerWarp == 2, "SILU's two rows are one feature's gate and up");
  const int lane = threadIdx.x % 32;
  const int warp_id = blockIdx.x * kWarps + threadIdx.x / 32;
  const int half = out / 2;
  const int o0 = SILU ? warp_id : warp_id * kRowsPerWarp;  // SILU: the feature
  auto w_row = [&](int r) { return SILU ? (r == 0 ? o0 : half + o0) : o0 + r; };  // weight row r of the warp
  auto row_ok = [&](int r) { return SILU ? o0 < half : o0 + r < out; };
  const bool rows_here = row_ok(0);  // false: a whole warp past the last row
  const int chunks = in / 8;
  const uint4* x4 = reinterpret_cast<const uint4*>(x);  // (n, chunks): 8 bf16 per uint4
  const uint4* w4 = reinterpret_cast<const uint4*>(W);  // (out, chunks)

  float acc[MAX_N][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < MAX_N; m++)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) acc[m][r] = 0.0f;

  for (int base = 0; base < chunks; base += 32 * kChunksInFlight) {
    // Request this round's weight chunks first (past the end of a row or of W: zeros, never used).
    uint4 w[kRowsPerWarp][kChunksInFlight];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
      for (int u = 0; u < kChunksInFlight; u++) {
        const int c = base + 32 * u + lane;
        w[r][u] = c < chunks && row_ok(r) ? __ldcs(w4 + int64_t(w_row(r)) * chunks + c) : make_uint4(0, 0, 0, 0);
      }
    // Launched overlapped: the weights are no other kernel's output, so the first round of them is on its
    // way (for in <= 1,024, all of them) while the previous kernel, which writes x, finishes.
    if (base == 0) {
      wait_for_previous_kernel();
      allow_next_kernel();
      if (!rows_here) return;
    }
#pragma unroll
    for (int u = 0; u < kChunksInFlight; u++) {
      const int c = base + 32 * u + lane;
      if (c >= chunks) break;  // this lane's row tail (in = 96: 12 chunks, lanes 12-31 idle)
      float wf[kRowsPerWarp][8];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) bf16x8_to_float(w[r][u], wf[r]);
#pragma unroll
      for (int m = 0; m < MAX_N; m++) {
        if (m >= n) break;  // the same for every lane
        float xf[8];
        bf16x8_to_float(__ldg(x4 + int64_t(m) * chunks + c), xf);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
          for (int k = 0; k < 8; k++) acc[m][r] += xf[k] * wf[r][k];
      }
    }
  }
  // Every lane holds part of each dot product: sum over the warp, lane 0 writes.
#pragma unroll
  for (int m = 0; m < MAX_N; m++) {
    if (m >= n) break;
    if constexpr (SILU) {
      const float gate = __bfloat162float(__float2bfloat16(warp_sum(acc[m][0])));
      const float up = __bfloat162float(__float2bfloat16(warp_sum(acc[m][1])));
      if (lane == 0) store_float(y + int64_t(m) * half + o0, silu_times(gate, up));
    } else {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        const float sum = warp_sum(acc[m][r]);
        if (lane == 0 && o0 + r < out) store_float(y + int64_t(m) * out + o0 + r, sum);
      }
    }
  }
}

// One instance per power of two up to 16 rows (the CUDA graph batch sizes 1, 2, 4, 8, 16): n = 3 runs
// the 4-row kernel with its last row skipped.
template <class OutT, bool SILU = false>
void launch_gemv(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, cudaStream_t stream) {
  const int warps = SILU ? out / 2 : (out + kRowsPerWarp - 1) / kRowsPerWarp;  // a feature or 2 rows each
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  const unsigned threads = kWarps * 32;
  if (n == 1) {
    launch_overlapped(linear_gemv_kernel<1, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out);
  } else if (n <= 2) {
    launch_overlapped(linear_gemv_kernel<2, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out);
  } else if (n <= 4) {
    launch_overlapped(linear_gemv_kernel<4, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out);
  } else if (n <= 8) {
    launch_overlapped(linear_gemv_kernel<8, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out);
  } else {
    launch_overlapped(linear_gemv_kernel<16, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool linear_gemv_fits(const bf16* x, const bf16* W, int n, int in_features) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n >= 1 && n <= kGemvMaxRows && in_features % 8 == 0 && aligned16(x) && aligned16(W);
}

void linear_gemv_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                      int out_features, cudaStream_t stream) {
  if (!linear_gemv_fits(x, W, n, in_features))
    fail("internal: linear_gemv_cuda needs 1 <= n <= ", kGemvMaxRows, ", in_features % 8 == 0 and 16-byte aligned x "
         "and W (n ", n, ", in_features ", in_features, ")");
  if (out_features == 0) return;
  if (y_is_fp32) {
    launch_gemv(static_cast<float*>(y), x, W, n, in_features, out_features, stream);
  } else {
    launch_gemv(static_cast<bf16*>(y), x, W, n, in_features, out_features, stream);
  }
}

void linear_gemv_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                           cudaStream_t stream) {
  if (!linear_gemv_fits(x, W, n, in_features) || out_features % 2 != 0)
    fail("internal: linear_gemv_silu_cuda needs what linear_gemv_cuda needs and an even out_features (n ", n,
         ", in_features ", in_features, ", out_features ", out_features, ")");
  if (out_features == 0) return;
  launch_gemv<bf16, true>(y, x, W, n, in_features, out_features, stream);
}

}  // namespace nanovllm
