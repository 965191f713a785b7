// qk_norm_rope.cuh: the per-head qk-norm and RoPE of Qwen3 as three warp-wide device helpers, shared by
// every kernel that norms or rotates a head: the decode kernel of v9/v10 when it does that work itself
// (decode_attention_fused_cuda), and chapter 04's qk_norm_rope_kernel and qk_norm_rope_store_kernel
// (04_model_runner/layers.cu). Here rather than in chapter 04 because chapter 04 depends on this chapter,
// not the other way round. One set of helpers, so that every path computes the same bits.
#pragma once
#ifdef NANOVLLM_CUDA

#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

// One head of q or k, held by one warp: lane l holds PER_LANE = HEAD_DIM / 64 consecutive elements of
// each half, x1[e] = x[j] and x2[e] = x[j + HEAD_DIM/2] with j = l * PER_LANE + e (head_dim 128: 2 each,
// j in [0, 63]). Every head of every kernel that norms or rotates one goes through these three helpers, so
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

// RMSNorm over the head (a warp-wide sum of squares), times the weight w (head_dim), then rotate-half
// RoPE ("neox": x[j] pairs with x[j + HEAD_DIM/2]) by angle[position, j]. The result stays fp32: it is
// rounded to bf16 once, when stored (no rounding between the norm and the rotation; nano-vllm rounds
// there, a difference of one bf16 ulp at most).
template <int HEAD_DIM>
__device__ inline void norm_rope_head(float (&x1)[HEAD_DIM / 64], float (&x2)[HEAD_DIM / 64], const bf16* w,
                                      const float* cos_row, const float* sin_row, int lane, float eps) {
  constexpr int HALF = HEAD_DIM / 2, PER_LANE = HALF / 32;
  float sum_sq = 0;
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) sum_sq += x1[e] * x1[e] + x2[e] * x2[e];
  const float inv_rms = rsqrtf(warp_sum(sum_sq) / HEAD_DIM + eps);
#pragma unroll
  for (int e = 0; e < PER_LANE; e++) {
    const int j = lane * PER_LANE + e;
    const float a = x1[e] * inv_rms * __bfloat162float(w[j]);
    const float b = x2[e] * inv_rms * __bfloat162float(w[j + HALF]);
    const float c = cos_row[j], s = sin_row[j];
    x1[e] = a * c - b * s;
    x2[e] = b * c + a * s;
  }
}

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
