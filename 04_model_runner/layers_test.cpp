// Known answers for the CPU layer references (the golden logits test them together; these pin each one).
#include "04_model_runner/layers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace nanovllm;

TEST(Ch04_Layers, RmsNormKnownAnswer) {
  // x = (3, 4): mean(x^2) = 12.5, so out = x / sqrt(12.5 + eps) * w.
  const float x[2] = {3, 4}, w[2] = {1, 2};
  float out[2];
  rmsnorm_cpu(out, x, w, 1, 2, 0.0f);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(out[1], 8 / std::sqrt(12.5), 1e-6);
  // The fused variant adds first and keeps the sum as the new residual.
  float residual[2] = {1, 1}, out2[2];
  const float delta[2] = {2, 3};
  add_rmsnorm_cpu(out2, residual, delta, w, 1, 2, 0.0f);
  EXPECT_EQ(residual[0], 3);
  EXPECT_EQ(residual[1], 4);
  EXPECT_NEAR(out2[0], out[0], 1e-6);
  EXPECT_NEAR(out2[1], out[1], 1e-6);
}

TEST(Ch04_Layers, RmsNormEpsilonIsInsideTheRoot) {
  // Small activations, where eps matters: x = (3e-3, 4e-3), mean(x^2) = 1.25e-5, and eps = 1.25e-5 makes
  // sqrt(mean + eps) = 5e-3 exactly, so out = x / 5e-3 * w = (0.6, 1.6). With eps outside the root,
  // x / (sqrt(mean) + eps), it would be (0.85, 2.25).
  const float x[2] = {3e-3f, 4e-3f}, w[2] = {1, 2};
  float out[2];
  rmsnorm_cpu(out, x, w, 1, 2, 1.25e-5f);
  EXPECT_NEAR(out[0], 0.6, 1e-5);
  EXPECT_NEAR(out[1], 1.6, 1e-5);
  float residual[2] = {0, 0}, out2[2];
  add_rmsnorm_cpu(out2, residual, x, w, 1, 2, 1.25e-5f);
  EXPECT_NEAR(out2[0], 0.6, 1e-5);
  EXPECT_NEAR(out2[1], 1.6, 1e-5);
}

TEST(Ch04_Layers, RopeTableIsHuggingFaceFormula) {
  std::vector<float> cos, sin;
  build_rope_table(cos, sin, 5, 8, 10000.0);  // half = 4, inv_freq[j] = 10000^(-2j/8)
  for (int p = 0; p < 5; p++)
    for (int j = 0; j < 4; j++) {
      double angle = p * std::pow(10000.0, -2.0 * j / 8);
      EXPECT_NEAR(cos[p * 4 + j], std::cos(angle), 1e-6);
      EXPECT_NEAR(sin[p * 4 + j], std::sin(angle), 1e-6);
    }
}

TEST(Ch04_Layers, QkNormRopeRotatesHalvesNotPairs) {
  // One token, one q head and one k head of dim 4, weights 1: after the norm, RoPE rotates the pairs
  // (x[0], x[2]) and (x[1], x[3]) (rotate-half), by position * inv_freq[j].
  const int D = 4;
  std::vector<float> cos, sin;
  build_rope_table(cos, sin, 8, D, 100.0);
  float qkv[3 * D] = {1, 0, 0, 0, /*k*/ 0, 2, 0, 0, /*v*/ 7, 7, 7, 7};
  const float ones[D] = {1, 1, 1, 1};
  const int32_t position = 3;
  qk_norm_rope_cpu(qkv, 3 * D, ones, ones, &position, cos.data(), sin.data(), 1, 1, 1, D, 0.0f);
  // q = (1,0,0,0) normalised = (2,0,0,0) (rms = 1/2); pair (x0, x2) rotated by angle 3 * 100^0 = 3.
  EXPECT_NEAR(qkv[0], 2 * std::cos(3.0), 1e-5);
  EXPECT_NEAR(qkv[2], 2 * std::sin(3.0), 1e-5);
  EXPECT_NEAR(qkv[1], 0, 1e-6);
  EXPECT_NEAR(qkv[3], 0, 1e-6);
  // k = (0,2,0,0) normalised = (0,2,0,0); pair (x1, x3) rotated by 3 * 100^(-1/2) = 0.3.
  EXPECT_NEAR(qkv[D + 1], 2 * std::cos(0.3), 1e-5);
  EXPECT_NEAR(qkv[D + 3], 2 * std::sin(0.3), 1e-5);
  for (int i = 0; i < D; i++) EXPECT_EQ(qkv[2 * D + i], 7);  // v untouched
}

TEST(Ch04_Layers, QkNormWeighsQHeadsWithQNormAndKHeadsWithKNorm) {
  // Two q heads and two k heads of dim 4 at position 0 (no rotation), q_norm 1 and k_norm 3: every head
  // (x, 0, 0, 0) normalises to (2, 0, 0, 0), then takes its own weight: 2 for the q heads, 6 for the k
  // heads, the first k head included.
  const int D = 4, heads = 2, kv_heads = 2, stride = (heads + 2 * kv_heads) * D;
  std::vector<float> cos, sin;
  build_rope_table(cos, sin, 8, D, 100.0);
  const float q_norm[D] = {1, 1, 1, 1}, k_norm[D] = {3, 3, 3, 3};
  float qkv[stride] = {};
  for (int h = 0; h < heads + kv_heads; h++) qkv[h * D] = float(h + 1);
  const int32_t position = 0;
  qk_norm_rope_cpu(qkv, stride, q_norm, k_norm, &position, cos.data(), sin.data(), 1, heads, kv_heads, D, 0.0f);
  for (int h = 0; h < heads + kv_heads; h++) {
    EXPECT_NEAR(qkv[h * D], h < heads ? 2.0f : 6.0f, 1e-5) << "head " << h;
    for (int d = 1; d < D; d++) EXPECT_EQ(qkv[h * D + d], 0.0f) << "head " << h << " dim " << d;
  }
}

TEST(Ch04_Layers, QkNormRopeStoreWritesEachTokensSlotAndSkipsPadding) {
  // Two tokens, one q, k and v head of dim 4; token 0 goes to slot 2, token 1 is padding (-1). q and k
  // come out as qk_norm_rope leaves them, and slot 2 holds token 0's k (normed and rotated) and v (as is).
  const int D = 4, stride = 3 * D, slots = 4;
  std::vector<float> cos, sin;
  build_rope_table(cos, sin, 8, D, 100.0);
  const float ones[D] = {1, 1, 1, 1};
  const int32_t positions[2] = {3, 5}, slot_mapping[2] = {2, -1};
  float qkv[2 * stride] = {1, 0, 0, 0, /*k*/ 0, 2, 0, 0, /*v*/ 7, 8, 9, 10,
                           0, 0, 3, 0, /*k*/ 1, 1, 1, 1, /*v*/ 4, 4, 4, 4};
  float want[2 * stride];
  std::copy(qkv, qkv + 2 * stride, want);
  qk_norm_rope_cpu(want, stride, ones, ones, positions, cos.data(), sin.data(), 2, 1, 1, D, 0.0f);
  std::vector<float> k_cache(slots * D, -1.0f), v_cache(slots * D, -1.0f);
  qk_norm_rope_store_cpu(qkv, stride, ones, ones, positions, cos.data(), sin.data(), k_cache.data(), v_cache.data(),
                         slot_mapping, 2, 1, 1, D, 0.0f);
  for (int i = 0; i < 2 * stride; i++) EXPECT_EQ(qkv[i], want[i]) << i;
  for (int s = 0; s < slots; s++)
    for (int d = 0; d < D; d++) {
      EXPECT_EQ(k_cache[s * D + d], s == 2 ? want[D + d] : -1.0f) << "k slot " << s;
      EXPECT_EQ(v_cache[s * D + d], s == 2 ? want[2 * D + d] : -1.0f) << "v slot " << s;
    }
  EXPECT_NEAR(k_cache[2 * D + 1], 2 * std::cos(0.3), 1e-5);  // k (0,2,0,0) rotated as in the test above
  EXPECT_EQ(v_cache[2 * D + 3], 10);
}

TEST(Ch04_Layers, SiluAndMulKnownAnswer) {
  const float gate_up[4] = {0, 2, 5, -1};  // gate (0, 2), up (5, -1)
  float out[2];
  silu_and_mul_cpu(out, gate_up, 1, 2);
  EXPECT_EQ(out[0], 0);                                  // silu(0) = 0
  EXPECT_NEAR(out[1], -2 / (1 + std::exp(-2.0)), 1e-6);  // silu(2) * -1
}

// An overlapped decode step's inputs (layers.h): a row whose token the step before sampled takes it from that
// step's tokens; a row of -1 keeps the id the host uploaded.
TEST(Ch04_Layers, TakeSampledTokensFillsOnlyTheRowsTheStepBeforeSampled) {
  int32_t ids[5] = {100, 101, 102, 103, 104};
  const int32_t tokens[3] = {7, 8, 9};
  const int32_t rows[5] = {2, -1, 0, -1, 2};
  take_sampled_tokens_cpu(ids, tokens, rows, 5);
  const int32_t want[5] = {9, 101, 7, 103, 9};
  for (int i = 0; i < 5; i++) EXPECT_EQ(ids[i], want[i]) << i;
}

TEST(Ch04_Layers, VocabParallelEmbeddingZeroesOtherRanksIds) {
  // This rank holds ids [10, 13): rows of ids outside are zero, to be filled by the other ranks.
  const float table[3 * 2] = {1, 2, 3, 4, 5, 6};
  const int32_t ids[4] = {9, 10, 12, 13};
  float out[4 * 2];
  embedding_cpu(out, table, ids, 4, 2, 10, 3);
  const float want[8] = {0, 0, 1, 2, 5, 6, 0, 0};
  for (int i = 0; i < 8; i++) EXPECT_EQ(out[i], want[i]) << i;
  const int32_t rows[2] = {3, 1};
  float gathered[4];
  gather_rows_cpu(gathered, out, rows, 2, 2);
  EXPECT_EQ(gathered[0], 0);
  EXPECT_EQ(gathered[2], 1);
  EXPECT_EQ(gathered[3], 2);
}
