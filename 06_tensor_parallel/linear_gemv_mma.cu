// linear_gemv_mma.cu: v5 of the projection, y (n, out) = x (n, in) @ W (out, in)^T for n <= 16 rows on
// tensor cores, with the weights streamed once in 16-byte loads straight into the mma's registers.
//
// v2 (linear_gemv.cu) streams W once but spends CUDA-core instructions on every weight: a conversion
// and one FMA per row of x, and it rereads every row of x for each pair of weight rows. From two rows on
// it loses to cuBLAS (04_model_runner/NOTES.md). Here the multiplications go to the tensor cores: one
// mma.sync m16n8k16 multiplies 16 weight rows by 16 in_features of up to 8 rows of x.
//
// The trick that lets the weights go from memory to the tensor core with no shuffle and no shared
// memory: a dot product does not care in which order its k terms are added, as long as both operands
// use the same order. The mma's A fragment wants, in lane (g, t4) = (lane / 4, lane % 4), the k indices
// 2 t4 + {0, 1} and 2 t4 + 8 + {0, 1} of row g (and g + 8). We give lane (g, t4) the 8 consecutive
// in_features 8 t4 .. 8 t4 + 7 of each 32-wide block of k (one 16-byte load per weight row) and declare
// that, for the block's two k16 steps s = 0, 1,
//     mma k index 2 t4 + {0, 1}      is in_feature 32 b + 8 t4 + 4 s + {0, 1}
//     mma k index 2 t4 + 8 + {0, 1}  is in_feature 32 b + 8 t4 + 4 s + {2, 3}
// a bijection between the 32 mma k slots of the two steps and the block's 32 in_features. The B operand
// (x^T: k x rows of x) wants k 2 t4 + {0, 1} and 2 t4 + 8 + {0, 1} of x row g: the same 16-byte load of
// x row g at 8 t4 serves it under the same mapping. So every lane loads 16 bytes of W row g, 16 of W row
// g + 8 and 16 of x row g per 32 in_features, and the four 32-bit words of each load are the fragments.
//
// Work split: a thread block of kGemvWarps warps owns 16 output features; its warps take every
// kGemvWarps-th 32-wide k block, kUnroll of them in flight at once, and add their accumulators through
// shared memory at the end. For outputs too few to fill the GPU (o_proj: 64 groups of 16), the in_features
// are also split over `splits` blocks, each writing an fp32 partial that add_partials_cuda adds up.
//
// Versions of the projection (linear.h): v1 cuBLAS, v2 CUDA-core GEMV, v3 cuBLASLt, v4 split-K GEMM, v5
// this file. CPU reference: linear_cpu. Prediction and measurement: 04_model_runner/NOTES.md.
#include <cstdint>

#include "01_sequence/base/ptx.cuh"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

constexpr int kGemvWarps = 4;  // warps per block, splitting the in_features of the block's 16 outputs
constexpr int kUnroll = 4;     // 32-wide k blocks each warp loads before it multiplies: 2 x 64 B of W per lane

// Block (output group, split): outputs o0 = 16 * blockIdx.x .. o0 + 15, in_features of split blockIdx.y
// (k_per_split of them, a multiple of 32). X_TILES = 1 for n <= 8 rows of x, 2 for n <= 16.
// splits == 1: y (n, out); splits > 1: partial[split] (n, out) fp32.
// SILU (the MLP's gate_up with its activation in the ending; splits == 1): block b takes features
// j0 = 8 b .. j0 + 7 of out / 2, and the mma's rows g and g + 8 are gate row j0 + g and up row
// out / 2 + j0 + g, so lane (g, t4) ends with one feature's gate (c0, c1) and up (c2, c3) of the same x
// rows. It writes y (n, out / 2) bf16 = silu(gate) * up, each rounded to bf16 first as the projection
// would store it: the bits of this kernel's projection followed by silu_and_mul_kernel.
template <int X_TILES, class OutT, bool SILU = false>
__global__ void __launch_bounds__(kGemvWarps * 32)
    linear_gemv_mma_kernel(OutT* y, float* partial, const bf16* x, const bf16* W, int n, int in, int out,
                           int k_per_split) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int half = out / 2;
  const int o0 = (SILU ? 8 : 16) * blockIdx.x, split = blockIdx.y;
  const int k_begin = split * k_per_split, k_end = min(in, k_begin + k_per_split);
  const bool row_lo = SILU ? o0 + g < half : o0 + g < out, row_hi = SILU ? row_lo : o0 + g + 8 < out;
  const bf16* w_lo = W + int64_t(o0 + g) * in;
  const bf16* w_hi = W + int64_t(SILU ? half + o0 + g : o0 + g + 8) * in;

  // Overlapped launch: the weights are nobody's output, so ask L2 for this warp's first weight lines
  // before waiting for the kernel that writes x.
#pragma unroll
  for (int u = 0; u < kUnroll; u++) {
    const int k = k_begin + 32 * (warp + u * kGemvWarps) + 8 * t4;
    if (k < k_end && row_lo) asm volatile("prefetch.global.L2 [%0];" ::"l"(w_lo + k));
    if (k < k_end && row_hi) asm volatile("prefetch.global.L2 [%0];" ::"l"(w_hi + k));
  }
  wait_for_previous_kernel();
  allow_next_kernel();

  float acc[X_TILES][4] = {};  // C: (output o0 + g (+ 8 for c2, c3), x row 8 tile + 2 t4 + {0, 1})
  for (int kb = k_begin + 32 * warp; kb < k_end; kb += 32 * kGemvWarps * kUnroll) {
    uint4 wl[kUnroll], wh[kUnroll], xr[X_TILES][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {  // every load of the round first: 16 + 16 (+ x) bytes per lane each
      const int k = kb + 32 * kGemvWarps * u + 8 * t4;
      const bool k_ok = k < k_end;  // in % 8 == 0: the lane's 8 in_features are all in or all out
      wl[u] = k_ok && row_lo ? __ldcs(reinterpret_cast<const uint4*>(w_lo + k)) : make_uint4(0, 0, 0, 0);
      wh[u] = k_ok && row_hi ? __ldcs(reinterpret_cast<const uint4*>(w_hi + k)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int t = 0; t < X_TILES; t++) {
        const int row = 8 * t + g;
        xr[t][u] = k_ok && row < n ? __ldg(reinterpret_cast<const uint4*>(x + int64_t(row) * in + k))
                                   : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      // Step s = 0 takes words x, y of each load (in_features + 0..3), s = 1 words z, w (+ 4..7).
      const uint32_t a_s0[4] = {wl[u].x, wh[u].x, wl[u].y, wh[u].y};
      const uint32_t a_s1[4] = {wl[u].z, wh[u].z, wl[u].w, wh[u].w};
#pragma unroll
      for (int t = 0; t < X_TILES; t++) {
        mma_16816(acc[t], a_s0, xr[t][u].x, xr[t][u].y);
        mma_16816(acc[t], a_s1, xr[t][u].z, xr[t][u].w);
      }
    }
  }

  // The warps' sums, added in warp order through shared memory: (warps, 32 lanes, X_TILES * 4).
  __shared__ float part[kGemvWarps][32][X_TILES * 4];
#pragma unroll
  for (int t = 0; t < X_TILES; t++)
#pragma unroll
    for (int e = 0; e < 4; e++) part[warp][lane][4 * t + e] = acc[t][e];
  __syncthreads();  // every warp's accumulators are in shared memory before warp 0 adds them
  if (warp != 0) return;
  if constexpr (SILU) {
#pragma unroll
    for (int t = 0; t < X_TILES; t++)
#pragma unroll
      for (int e = 0; e < 2; e++) {  // e: the gate, e + 2: the up of feature o0 + g, x row 8 t + 2 t4 + e
        float gate = 0.0f, up = 0.0f;
        for (int w = 0; w < kGemvWarps; w++) gate += part[w][lane][4 * t + e], up += part[w][lane][4 * t + e + 2];
        const int j = o0 + g, row = 8 * t + 2 * t4 + e;
        if (j >= half || row >= n) continue;
        store_float(y + int64_t(row) * half + j,
                    silu_times(__bfloat162float(__float2bfloat16(gate)), __bfloat162float(__float2bfloat16(up))));
      }
  } else {
    const bool direct = gridDim.y == 1;
#pragma unroll
    for (int t = 0; t < X_TILES; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float sum = 0.0f;
        for (int w = 0; w < kGemvWarps; w++) sum += part[w][lane][4 * t + e];
        const int o = o0 + g + 8 * (e / 2), row = 8 * t + 2 * t4 + e % 2;
        if (o >= out || row >= n) continue;
        if (direct) store_float(y + int64_t(row) * out + o, sum);
        else partial[(int64_t(split) * n + row) * out + o] = sum;
      }
  }
}

template <int X_TILES, class OutT>
void launch(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, int splits, float* workspace,
            cudaStream_t stream) {
  const int k_per_split = (in / splits + 31) / 32 * 32;
  const dim3 grid{unsigned((out + 15) / 16), unsigned(splits), 1u};
  launch_overlapped(linear_gemv_mma_kernel<X_TILES, OutT>, grid, kGemvWarps * 32, 0, stream, y, workspace, x, W, n,
                    in, out, k_per_split);
}

}  // namespace

int linear_gemv_mma_splits(int n, int in_features, int out_features, size_t workspace_bytes) {
  // Two blocks per SM of a 132-SM GPU, each split at least one round (kGemvWarps x kUnroll k blocks) deep,
  // the partials within the workspace.
  const int groups = (out_features + 15) / 16;
  int splits = std::min((264 + groups - 1) / groups, std::max(1, in_features / (32 * kGemvWarps * kUnroll)));
  while (splits > 1 && size_t(splits) * n * out_features * sizeof(float) > workspace_bytes) splits--;
  return std::max(1, splits);
}

void linear_gemv_mma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                          int out_features, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!linear_gemv_fits(x, W, n, in_features))
    fail("linear_gemv_mma_cuda: needs 1 <= n <= ", kGemvMaxRows, ", in_features % 8 == 0 and 16-byte aligned x and W");
  const int splits = linear_gemv_mma_splits(n, in_features, out_features, workspace_bytes);
  float* partials = static_cast<float*>(workspace);
  void* target = splits > 1 ? nullptr : y;  // split: the kernel writes partials only
  if (y_is_fp32) {
    float* out = static_cast<float*>(target);
    if (n <= 8) launch<1>(out, x, W, n, in_features, out_features, splits, partials, stream);
    else launch<2>(out, x, W, n, in_features, out_features, splits, partials, stream);
  } else {
    bf16* out = static_cast<bf16*>(target);
    if (n <= 8) launch<1>(out, x, W, n, in_features, out_features, splits, partials, stream);
    else launch<2>(out, x, W, n, in_features, out_features, splits, partials, stream);
  }
  CUDA_CHECK_LAUNCH();
  if (splits > 1) add_partials_cuda(y, y_is_fp32, partials, int64_t(n) * out_features, splits, stream);
}

bool linear_gemv_mma_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                               size_t workspace_bytes, cudaStream_t stream) {
  if (!linear_gemv_fits(x, W, n, in_features) || out_features % 2 != 0 ||
      linear_gemv_mma_splits(n, in_features, out_features, workspace_bytes) != 1)
    return false;
  if (out_features == 0) return true;
  const int half = out_features / 2;
  const dim3 grid{unsigned((half + 7) / 8), 1u, 1u};  // 8 features (16 weight rows) a block
  if (n <= 8)
    launch_overlapped(linear_gemv_mma_kernel<1, bf16, true>, grid, kGemvWarps * 32, 0, stream, y, nullptr, x, W, n,
                      in_features, out_features, in_features);
  else
    launch_overlapped(linear_gemv_mma_kernel<2, bf16, true>, grid, kGemvWarps * 32, 0, stream, y, nullptr, x, W, n,
                      in_features, out_features, in_features);
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace nanovllm
