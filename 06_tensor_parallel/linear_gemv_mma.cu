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
// Work split: a thread block owns 16 output features, and its warps split the in_features: warp w takes
// every warps-th 32-wide k block, kUnroll of them at once, and the block has as many warps as one such round
// over the whole row needs (linear_gemv_mma_warps: 8 for 1,024 in_features, 16 for 2,048, 24 for 3,072), so
// every weight the block needs is asked for, into registers, before the kernel waits for the one writing x.
// The warps' accumulators then meet in shared memory, every thread adding one output's in warp order.
//
// This is v5 of the projection's versions (linear.h lists them all). CPU reference: linear_cpu. Prediction and measurement: 04_model_runner/NOTES.md.
#include <algorithm>
#include <cstdint>

#include "01_sequence/base/ptx.cuh"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

constexpr int kUnroll = 4;         // 32-wide k blocks a warp loads at once: 2 x 64 B of W per lane
constexpr int kMaxWarps = 24;      // a block's warps: one round of 3,072 in_features (longer rows loop)

// Block b: outputs o0 = 16 b .. o0 + 15 (SILU: 8 features, below), all in_features, blockDim.x / 32 warps.
// X_TILES = 1 for n <= 8 rows of x, 2 for n <= 16. y (n, out) OutT; x (n, in) bf16, W (out, in) bf16, in % 8
// == 0, both 16-byte aligned; blockDim.x = 32 linear_gemv_mma_warps(in).
// SILU (the MLP's gate_up with its activation in the ending): block b takes features j0 = 8 b .. j0 + 7 of
// out / 2, and the mma's rows g and g + 8 are gate row j0 + g and up row out / 2 + j0 + g, so lane (g, t4)
// ends with one feature's gate (c0, c1) and up (c2, c3) of the same x rows. It writes y (n, out / 2) bf16 =
// silu(gate) * up, each rounded to bf16 first as the projection would store it: the bits of this kernel's
// projection followed by silu_and_mul_kernel.
template <int X_TILES, class OutT, bool SILU = false>
__global__ void __launch_bounds__(kMaxWarps * 32)
    linear_gemv_mma_kernel(OutT* y, const bf16* x, const bf16* W, int n, int in, int out) {
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int half = out / 2;
  const int o0 = (SILU ? 8 : 16) * blockIdx.x;
  const bool row_lo = SILU ? o0 + g < half : o0 + g < out, row_hi = SILU ? row_lo : o0 + g + 8 < out;
  const bf16* w_lo = W + int64_t(o0 + g) * in;
  const bf16* w_hi = W + int64_t(SILU ? half + o0 + g : o0 + g + 8) * in;
  const int first = 32 * warp, step = 32 * warps * kUnroll;  // this warp's first k block, and its stride

  uint4 wl[kUnroll], wh[kUnroll];  // a round of W: 16 bytes of rows g and g + 8 per k block
  auto load_weights = [&](int kb) {
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int k = kb + 32 * warps * u + 8 * t4;
      const bool k_ok = k < in;  // in % 8 == 0: the lane's 8 in_features are all in or all out
      wl[u] = k_ok && row_lo ? __ldcs(reinterpret_cast<const uint4*>(w_lo + k)) : make_uint4(0, 0, 0, 0);
      wh[u] = k_ok && row_hi ? __ldcs(reinterpret_cast<const uint4*>(w_hi + k)) : make_uint4(0, 0, 0, 0);
    }
  };
  // Overlapped launch: the weights are nobody's output, so the first round (for in <= kMaxWarps x 128, all
  // of the block's) is on its way while the kernel that writes x finishes.
  load_weights(first);
  wait_for_previous_kernel();
  allow_next_kernel();

  float acc[X_TILES][4] = {};  // C: (output o0 + g (+ 8 for c2, c3), x row 8 tile + 2 t4 + {0, 1})
  for (int kb = first; kb < in; kb += step) {
    if (kb != first) load_weights(kb);
    uint4 xr[X_TILES][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int k = kb + 32 * warps * u + 8 * t4;
#pragma unroll
      for (int t = 0; t < X_TILES; t++) {
        const int row = 8 * t + g;
        xr[t][u] = k < in && row < n ? __ldg(reinterpret_cast<const uint4*>(x + int64_t(row) * in + k))
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

  // The warps' sums through shared memory: part (warps, X_TILES * 4 accumulator slots, 32 lanes). Thread i
  // then adds slot i / 32 of lane i % 32 over the warps, in warp order (SILU: the gate and the up slots of
  // one feature together).
  __shared__ float part[kMaxWarps][X_TILES * 4][32];
#pragma unroll
  for (int t = 0; t < X_TILES; t++)
#pragma unroll
    for (int e = 0; e < 4; e++) part[warp][4 * t + e][lane] = acc[t][e];
  __syncthreads();  // every warp's accumulators are in shared memory before any thread adds them
  constexpr int kSlots = SILU ? X_TILES * 2 : X_TILES * 4;  // SILU: (tile, e < 2) pairs slot 4 t + e with + 2
  for (int i = threadIdx.x; i < kSlots * 32; i += blockDim.x) {
    const int l = i % 32, slot = i / 32;
    const int lg = l / 4, lt4 = l % 4;  // the lane's (g, t4)
    if constexpr (SILU) {
      const int t = slot / 2, e = slot % 2;
      float gate = 0.0f, up = 0.0f;
      for (int w = 0; w < warps; w++) gate += part[w][4 * t + e][l], up += part[w][4 * t + e + 2][l];
      const int j = o0 + lg, row = 8 * t + 2 * lt4 + e;
      if (j < half && row < n)
        store_float(y + int64_t(row) * half + j,
                    silu_times(__bfloat162float(__float2bfloat16(gate)), __bfloat162float(__float2bfloat16(up))));
    } else {
      const int t = slot / 4, e = slot % 4;
      float sum = 0.0f;
      for (int w = 0; w < warps; w++) sum += part[w][slot][l];
      const int o = o0 + lg + 8 * (e / 2), row = 8 * t + 2 * lt4 + e % 2;
      if (o < out && row < n) store_float(y + int64_t(row) * out + o, sum);
    }
  }
}

// y (n, out) OutT (SILU: (n, out / 2) bf16) = x (n, in) @ W (out, in)^T: a block per 16 outputs (SILU: 8
// features, 16 weight rows), X_TILES = ceil(n / 8).
template <int X_TILES, class OutT, bool SILU = false>
void launch(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, cudaStream_t stream) {
  const int features = SILU ? out / 2 : out, per_block = SILU ? 8 : 16;  // SILU: 8 features = 16 weight rows
  const dim3 grid{unsigned((features + per_block - 1) / per_block), 1u, 1u};
  launch_overlapped(linear_gemv_mma_kernel<X_TILES, OutT, SILU>, grid, 32 * linear_gemv_mma_warps(in), 0, stream,
                    y, x, W, n, in, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int linear_gemv_mma_warps(int in_features) {
  return std::min(kMaxWarps, std::max(1, (in_features + 32 * kUnroll - 1) / (32 * kUnroll)));
}

void linear_gemv_mma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                          int out_features, cudaStream_t stream) {
  if (!linear_gemv_fits(x, W, n, in_features))
    fail("linear_gemv_mma_cuda: needs 1 <= n <= ", kGemvMaxRows, ", in_features % 8 == 0 and 16-byte aligned x and W");
  if (out_features == 0) return;
  if (y_is_fp32) {
    float* out = static_cast<float*>(y);
    if (n <= 8) launch<1>(out, x, W, n, in_features, out_features, stream);
    else launch<2>(out, x, W, n, in_features, out_features, stream);
  } else {
    bf16* out = static_cast<bf16*>(y);
    if (n <= 8) launch<1>(out, x, W, n, in_features, out_features, stream);
    else launch<2>(out, x, W, n, in_features, out_features, stream);
  }
}

bool linear_gemv_mma_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                               cudaStream_t stream) {
  if (!linear_gemv_fits(x, W, n, in_features) || out_features % 2 != 0) return false;
  if (out_features == 0) return true;
  if (n <= 8) launch<1, bf16, true>(y, x, W, n, in_features, out_features, stream);
  else launch<2, bf16, true>(y, x, W, n, in_features, out_features, stream);
  return true;
}

}  // namespace nanovllm
