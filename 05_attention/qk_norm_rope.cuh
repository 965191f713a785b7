// qk_norm_rope.cuh: the per-head qk-norm and RoPE of Qwen3 as warp-wide device helpers (load_head,
// load_norm_rope_factors, norm_rope_head, store_head, and copy_head, which copies a v head to the cache as it
// is), shared by every kernel that norms or rotates a head: the decode kernel of v9, v10 and v11 when it does
// that work itself (decode_attention_fused_cuda), and chapter 04's
// qk_norm_rope_kernel and qk_norm_rope_store_kernel (04_model_runner/layers.cu). Here rather than in
// chapter 04 because chapter 04 depends on this chapter, not the other way round. One set of helpers, so
// that every path computes the same bits.
#pragma once
#ifdef NANOVLLM_CUDA

#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

// One head of q or k, held by one warp: lane l holds PER_LANE = HEAD_DIM / 64 consecutive elements of
// each half, x1[e] = x[j] and x2[e] = x[j + HEAD_DIM/2] with j = l * PER_LANE + e (head_dim 128: 2 each,
// j in [0, 63]). Every head of every kernel that norms or rotates one goes through these helpers, so
// that the fused kernels compute exactly the bits of the ones they replace.
template <int HEAD_DIM>
__device__ inline void load_head(const bf16* x, float (&x1)[HEAD_DIM / 64], float (&x2)[HEAD_DIM / 64], int lane) {
  constexpr int HALF = HEAD_DIM / 2, PER_LANE = HALF / 32;
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) {
    const int j = lane * PER_LANE + e;
    x1[e] = __bfloat162float(x[j]);
    x2[e] = __bfloat162float(x[j + HALF]);
  }
}

// What norm_rope_head multiplies this lane's elements by: the norm weight w (head_dim) and the RoPE row's
// cos and sin at j and j + HEAD_DIM/2 (rotate-half pairs share them). Nothing here depends on the head's
// values, so a kernel launched overlapped loads the factors before it waits for the previous kernel
// (cuda_utils.h): the weights are constants and the position is a step input.
template <int HEAD_DIM>
struct NormRopeFactors {
  float w1[HEAD_DIM / 64], w2[HEAD_DIM / 64], cos[HEAD_DIM / 64], sin[HEAD_DIM / 64];
};

// w (HEAD_DIM,) bf16, cos_row and sin_row (HEAD_DIM / 2,) fp32, the tables' rows at the token's position ->
// this lane's factors (its PER_LANE j of each half).
template <int HEAD_DIM>
__device__ inline NormRopeFactors<HEAD_DIM> load_norm_rope_factors(const bf16* w, const float* cos_row,
                                                                   const float* sin_row, int lane) {
  constexpr int HALF = HEAD_DIM / 2, PER_LANE = HALF / 32;
  NormRopeFactors<HEAD_DIM> f;
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) {
    const int j = lane * PER_LANE + e;
    f.w1[e] = __bfloat162float(w[j]);
    f.w2[e] = __bfloat162float(w[j + HALF]);
    f.cos[e] = cos_row[j];
    f.sin[e] = sin_row[j];
  }
  return f;
}

// RMSNorm over the head (a warp-wide sum of squares), times the weight w (head_dim), then rotate-half
// RoPE ("neox": x[j] pairs with x[j + HEAD_DIM/2]) by angle[position, j]. The result stays fp32: it is
// rounded to bf16 once, when stored (no rounding between the norm and the rotation; nano-vllm rounds
// there, a difference of one bf16 ulp at most). All 32 lanes of the warp call it (warp_sum, full mask).
// Qwen3's RMSNorm multiplies by w itself (Gemma's by 1 + w); eps is the config's rms_norm_eps (1e-6).
template <int HEAD_DIM>
__device__ inline void norm_rope_head(float (&x1)[HEAD_DIM / 64], float (&x2)[HEAD_DIM / 64],
                                      const NormRopeFactors<HEAD_DIM>& f, float eps) {
  constexpr int PER_LANE = HEAD_DIM / 64;
  float sum_sq = 0;
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) sum_sq += x1[e] * x1[e] + x2[e] * x2[e];
  const float inv_rms = rsqrtf(warp_sum(sum_sq) / HEAD_DIM + eps);
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) {
    const float a = x1[e] * inv_rms * f.w1[e];
    const float b = x2[e] * inv_rms * f.w2[e];
    x1[e] = a * f.cos[e] - b * f.sin[e];
    x2[e] = b * f.cos[e] + a * f.sin[e];
  }
}

// The same, loading its factors on the way.
template <int HEAD_DIM>
__device__ inline void norm_rope_head(float (&x1)[HEAD_DIM / 64], float (&x2)[HEAD_DIM / 64], const bf16* w,
                                      const float* cos_row, const float* sin_row, int lane, float eps) {
  norm_rope_head<HEAD_DIM>(x1, x2, load_norm_rope_factors<HEAD_DIM>(w, cos_row, sin_row, lane), eps);
}

// A head copied as it is (v: no norm, no rotation), by one warp: every load before the first store. dst
// and src are both bf16 pointers, so the compiler may not move a load above a store that might alias it;
// loading first takes that question away. Predicted ~2 µs a call off, measured 0.13 µs at 256 rows: the
// loads had not waited for one another after all (04_model_runner/NOTES.md section 13, "V copies with
// every load before the first store"). Kept as the clearer copy, never slower.
template <int HEAD_DIM>
__device__ inline void copy_head(bf16* dst, const bf16* src, int lane) {
  bf16 v[HEAD_DIM / 32];
#pragma unroll
  for (int e = 0; e < HEAD_DIM / 32; e++) v[e] = src[lane + 32 * e];
#pragma unroll
  for (int e = 0; e < HEAD_DIM / 32; e++) dst[lane + 32 * e] = v[e];
}

// x (HEAD_DIM,) bf16 <- this lane's x1, x2 in load_head's layout, each rounded to bf16 once.
template <int HEAD_DIM>
__device__ inline void store_head(bf16* x, const float (&x1)[HEAD_DIM / 64], const float (&x2)[HEAD_DIM / 64],
                                  int lane) {
  constexpr int HALF = HEAD_DIM / 2, PER_LANE = HALF / 32;
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) {
    const int j = lane * PER_LANE + e;
    x[j] = __float2bfloat16(x1[e]);
    x[j + HALF] = __float2bfloat16(x2[e]);
  }
}

}  // namespace nanovllm

#endif  // NANOVLLM_CUDA
