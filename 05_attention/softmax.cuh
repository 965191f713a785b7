// softmax.cuh: the small device helpers every attention version shares: a key's cache slot through the
// block table, and the online softmax of FlashAttention (Dao et al. 2022, after
// Milakov & Gimelshein 2018) in the paper's names.
//
// The online softmax keeps, for one query row over the keys seen so far,
//   m_i  the largest score,
//   l_i  the sum of exp(s_j - m_i),
//   O_i  the sum of exp(s_j - m_i) * v_j   (unnormalised: the output is O_i / l_i at the end).
// A new score (or a block of them) with a larger maximum multiplies l_i and O_i by exp(m_old - m_new)
// first. From v1 on, scores are kept in base 2 (s * scale * log2(e)), so each exp is one exp2f call
// (four instructions; one with exp2_ftz, v12).
// Two states over disjoint sets of keys merge the same way: rescale both to the larger maximum and add.
#pragma once

#include <cstdint>

#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

constexpr float kLog2e = 1.4426950408889634f;

// The cache slot of key j (0-based position in its sequence): block_table lists the sequence's physical
// blocks in logical order. 64-bit, because slot * kv_dim can pass 2^31 elements in a large cache.
__device__ inline int64_t key_slot(const int32_t* block_table, int j, int block_size) {
  return int64_t(block_table[j / block_size]) * block_size + j % block_size;
}

// The factor that moves a sum taken under maximum m_old to maximum m_new >= m_old (base 2). When no key
// has been seen at all (m_new = -inf) there is nothing to rescale, and exp2(-inf - -inf) would be NaN.
__device__ inline float online_softmax_rescale(float m_old, float m_new) {
  return m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
}

// 2^x in one instruction: the special-function unit's ex2.approx with a result below 2^-126 flushed to zero.
// exp2f is the same instruction with a range check and two multiplies around it that keep such results as
// denormals; a probability under 2^-126 (e^-87 of the row's largest) adds nothing an output can hold.
__device__ inline float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Merges the state (m_b, l_b, O_b) into (m_a, l_a, O_a); both cover disjoint sets of keys, N dims of O.
template <int N>
__device__ inline void online_softmax_merge(float& m_a, float& l_a, float (&O_a)[N], float m_b, float l_b,
                                            const float (&O_b)[N]) {
  const float m = fmaxf(m_a, m_b);
  if (m == -INFINITY) return;  // neither side saw a key
  const float alpha = exp2f(m_a - m), beta = exp2f(m_b - m);
  l_a = l_a * alpha + l_b * beta;
#pragma unroll
  for (int d = 0; d < N; d++) O_a[d] = O_a[d] * alpha + O_b[d] * beta;
  m_a = m;
}

}  // namespace nanovllm
