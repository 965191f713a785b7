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
// Rows longer than one round (in > 1,024: o_proj's 2,048, down_proj's 3,072) are split over `splits`
// warps of the block, one round each, so that every weight is requested before the kernel's wait instead
// of one round per round trip after it; the warps' sums meet in shared memory, added in split order.
//
// This is v2 of the projection's versions (linear.h lists them all). Prediction and measurement: 04_model_runner/NOTES.md. The CPU reference is linear_cpu.
#include <algorithm>
#include <cstdint>

#include "06_tensor_parallel/linear.h"

namespace nanovllm {

namespace {

constexpr int kWarps = 8;           // warps per block at most (256 threads): splits x pairs of rows
                                    // (down_proj's 3 splits: 6 warps, 192 threads). 4 warps a block
                                    // was 0.02 ms slower at batch 1 (H100; 04_model_runner/NOTES.md,
                                    // section 9, "One block an SM, and the MLP's weights sooner")
constexpr int kMaxSplits = 4;       // in_features split over at most 4 warps: 4,096 in one round
constexpr int kRowsPerWarp = 2;     // weight rows per warp: each x chunk loaded serves both
constexpr int kChunksInFlight = 4;  // 16-byte weight loads per lane and row issued before any is used:
                                    // 2 rows x 4 x 16 B = 128 B per lane, 4 KB per warp in flight

// y (n, out) OutT = x (n, in) bf16 @ W (out, in)^T bf16, n <= MAX_N; in % 8 == 0, x and W 16-byte aligned.
// A block is `splits` x P warps (splits x P <= kWarps; launch_gemv picks them): warp w takes split
// s = w / P of the in_features (chunks [s per, (s + 1) per), per = ceil(chunks / splits)) of pair
// p = w % P of the block, and pair b * P + p of block b computes output features o0 = (b * P + p) * kRowsPerWarp and
// o0 + 1 for every row m < n (out = 4096, one split: 2048 warps, 256 blocks). With one split the warp's
// lanes add up their parts and lane 0 writes; with several, each warp's lane 0 puts its sums in shared
// memory and split 0's lane 0 adds them in split order and writes.
// SILU (the MLP's gate_up with its activation in the ending): pair j = b * P + p is feature j, its two
// weight rows are gate row j and up row out / 2 + j, and it writes y (n, out / 2) bf16 [m][j] =
// silu(gate) * up, each rounded to bf16 first as the projection would store it: the bits of this kernel's
// projection followed by silu_and_mul_kernel (04_model_runner/layers.cu).
template <int MAX_N, class OutT, bool SILU = false>
__global__ void __launch_bounds__(kWarps * 32)
    linear_gemv_kernel(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, int splits) {
  static_assert(kRowsPerWarp == 2, "SILU's two rows are one feature's gate and up");
  // With its activation this is the MLP's gate_up, and down_proj comes next, which reads nothing but its
  // weights before its wait: let it in at once, so that its weights stream while this kernel runs instead
  // of after its wait (cuda_utils.h; 04_model_runner/NOTES.md, section 9, "One block an SM, and the MLP's
  // weights sooner").
  if constexpr (SILU) allow_next_kernel();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int pairs = blockDim.x / 32 / splits;  // P
  const int split = warp / pairs, pair = blockIdx.x * pairs + warp % pairs;
  const int half = out / 2;
  const int o0 = SILU ? pair : pair * kRowsPerWarp;  // SILU: the feature
  auto w_row = [&](int r) { return SILU ? (r == 0 ? o0 : half + o0) : o0 + r; };  // weight row r of the warp
  auto row_ok = [&](int r) { return SILU ? o0 < half : o0 + r < out; };
  const bool rows_here = row_ok(0);  // false: a whole warp past the last row
  const int chunks = in / 8;
  const int per_split = (chunks + splits - 1) / splits;
  const int c_begin = split * per_split, c_end = min(chunks, c_begin + per_split);  // never empty: launch_gemv
  const uint4* x4 = reinterpret_cast<const uint4*>(x);  // (n, chunks): 8 bf16 per uint4
  const uint4* w4 = reinterpret_cast<const uint4*>(W);  // (out, chunks)

  float acc[MAX_N][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < MAX_N; m++)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) acc[m][r] = 0.0f;

  for (int base = c_begin; base < c_end; base += 32 * kChunksInFlight) {
    // Request this round's weight chunks first (past the end of a split, a row or W: zeros, never used).
    uint4 w[kRowsPerWarp][kChunksInFlight];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
      for (int u = 0; u < kChunksInFlight; u++) {
        const int c = base + 32 * u + lane;
        w[r][u] = c < c_end && row_ok(r) ? __ldcs(w4 + int64_t(w_row(r)) * chunks + c) : make_uint4(0, 0, 0, 0);
      }
    // Launched overlapped: the weights are no other kernel's output, so the first round of them is on its
    // way (for in <= 1,024 x splits, all of them) while the previous kernel, which writes x, finishes.
    // The wait sits in the loop's first round, which every thread runs: a split is never empty
    // (launch_gemv), so no thread reads x, or returns, without having waited.
    if (base == c_begin) {
      wait_for_previous_kernel();
      allow_next_kernel();
      if (!rows_here && splits == 1) return;  // with splits, every warp meets at the barrier below
    }
#pragma unroll
    for (int u = 0; u < kChunksInFlight; u++) {
      const int c = base + 32 * u + lane;
      if (c >= c_end) break;  // this lane's split tail (in = 96: 12 chunks, lanes 12-31 idle)
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
  // Every lane holds part of each dot product: sum over the warp, then over the splits.
  float sum[MAX_N][kRowsPerWarp];
#pragma unroll
  for (int m = 0; m < MAX_N; m++)
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) sum[m][r] = m < n ? warp_sum(acc[m][r]) : 0.0f;
  if (splits > 1) {
    __shared__ float part[kWarps][MAX_N][kRowsPerWarp];  // (warp, row of x, weight row): a warp's sums
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < MAX_N; m++)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; r++) part[warp][m][r] = sum[m][r];
    __syncthreads();  // every split's sums are in shared memory before split 0 adds them
    if (split != 0 || !rows_here) return;
#pragma unroll
    for (int m = 0; m < MAX_N; m++)
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++) {
        float total = part[warp][m][r];
        for (int s = 1; s < splits; s++) total += part[s * pairs + warp][m][r];
        sum[m][r] = total;
      }
  }
#pragma unroll
  for (int m = 0; m < MAX_N; m++) {
    if (m >= n || lane != 0) break;
    if constexpr (SILU) {
      const float gate = __bfloat162float(__float2bfloat16(sum[m][0]));
      const float up = __bfloat162float(__float2bfloat16(sum[m][1]));
      store_float(y + int64_t(m) * half + o0, silu_times(gate, up));
    } else {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; r++)
        if (o0 + r < out) store_float(y + int64_t(m) * out + o0 + r, sum[m][r]);
    }
  }
}

// y (n, out) OutT (SILU: (n, out / 2) bf16) = x (n, in) bf16 @ W (out, in)^T bf16; n <= 16, in % 8 == 0.
// One instance per power of two up to 16 rows (the CUDA graph batch sizes 1, 2, 4, 8, 16): n = 3 runs
// the 4-row kernel with its last row skipped. Splits: as many rounds as a row has, at most kMaxSplits
// (so every split starts inside the row: (splits - 1) * ceil(chunks / splits) < chunks when chunks > 128).
template <class OutT, bool SILU = false>
void launch_gemv(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, cudaStream_t stream) {
  const int chunks = in / 8;
  const int splits = std::min(kMaxSplits, std::max(1, (chunks + 32 * kChunksInFlight - 1) / (32 * kChunksInFlight)));
  const int pairs = std::max(1, kWarps / splits);                   // pairs of weight rows a block
  const int warps = SILU ? out / 2 : (out + kRowsPerWarp - 1) / kRowsPerWarp;  // pairs: a feature or 2 rows
  const unsigned blocks = unsigned((warps + pairs - 1) / pairs);
  const unsigned threads = 32 * splits * pairs;
  if (n == 1) {
    launch_overlapped(linear_gemv_kernel<1, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out, splits);
  } else if (n <= 2) {
    launch_overlapped(linear_gemv_kernel<2, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out, splits);
  } else if (n <= 4) {
    launch_overlapped(linear_gemv_kernel<4, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out, splits);
  } else if (n <= 8) {
    launch_overlapped(linear_gemv_kernel<8, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out, splits);
  } else {
    launch_overlapped(linear_gemv_kernel<16, OutT, SILU>, blocks, threads, 0, stream, y, x, W, n, in, out, splits);
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
