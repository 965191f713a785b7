// layers_cpu.cpp: reference implementations in fp32, written as the formulas read.
#include <cmath>
#include <cstring>

#include "04_model_runner/layers.h"
#include "05_attention/attention.h"

namespace nanovllm {

void embedding_cpu(float* out, const float* table, const int32_t* ids, int n, int hidden, int vocab_start,
                   int vocab_size) {
  for (int i = 0; i < n; i++) {
    int local = ids[i] - vocab_start;
    float* row = out + int64_t(i) * hidden;
    if (local < 0 || local >= vocab_size) {
      std::memset(row, 0, sizeof(float) * hidden);
    } else {
      std::memcpy(row, table + int64_t(local) * hidden, sizeof(float) * hidden);
    }
  }
}

namespace {

void rmsnorm_row(float* out, const float* x, const float* weight, int hidden, float eps) {
  double sum_sq = 0;  // double: the reference should not add its own rounding
  for (int j = 0; j < hidden; j++) sum_sq += double(x[j]) * x[j];
  float inv_rms = float(1.0 / std::sqrt(sum_sq / hidden + eps));
  for (int j = 0; j < hidden; j++) out[j] = x[j] * inv_rms * weight[j];
}

}  // namespace

void rmsnorm_cpu(float* out, const float* x, const float* weight, int n, int hidden, float eps) {
  for (int i = 0; i < n; i++) rmsnorm_row(out + int64_t(i) * hidden, x + int64_t(i) * hidden, weight, hidden, eps);
}

void add_rmsnorm_cpu(float* out, float* residual, const float* x, const float* weight, int n, int hidden,
                     float eps) {
  for (int64_t k = 0; k < int64_t(n) * hidden; k++) residual[k] += x[k];
  rmsnorm_cpu(out, residual, weight, n, hidden, eps);
}

void build_rope_table(std::vector<float>& cos_table, std::vector<float>& sin_table, int max_positions,
                      int head_dim, double theta) {
  const int half = head_dim / 2;
  cos_table.resize(size_t(max_positions) * half);
  sin_table.resize(size_t(max_positions) * half);
  for (int j = 0; j < half; j++) {
    float inv_freq = 1.0f / float(std::pow(theta, double(2 * j) / head_dim));
    for (int p = 0; p < max_positions; p++) {
      float angle = float(p) * inv_freq;  // fp32 product, as torch computes it
      cos_table[size_t(p) * half + j] = float(std::cos(double(angle)));
      sin_table[size_t(p) * half + j] = float(std::sin(double(angle)));
    }
  }
}

void qk_norm_rope_cpu(float* qkv, int64_t row_stride, const float* q_norm, const float* k_norm,
                      const int32_t* positions, const float* cos_table, const float* sin_table, int n,
                      int num_heads, int num_kv_heads, int head_dim, float eps) {
  const int half = head_dim / 2;
  for (int i = 0; i < n; i++) {
    const float* cos_row = cos_table + int64_t(positions[i]) * half;
    const float* sin_row = sin_table + int64_t(positions[i]) * half;
    for (int h = 0; h < num_heads + num_kv_heads; h++) {
      float* x = qkv + i * row_stride + int64_t(h) * head_dim;  // q heads, then k heads
      rmsnorm_row(x, x, h < num_heads ? q_norm : k_norm, head_dim, eps);
      for (int j = 0; j < half; j++) {
        float x1 = x[j], x2 = x[j + half];
        x[j] = x1 * cos_row[j] - x2 * sin_row[j];
        x[j + half] = x2 * cos_row[j] + x1 * sin_row[j];
      }
    }
  }
}

void qk_norm_rope_store_cpu(float* qkv, int64_t row_stride, const float* q_norm, const float* k_norm,
                            const int32_t* positions, const float* cos_table, const float* sin_table,
                            float* k_cache, float* v_cache, const int32_t* slot_mapping, int n, int num_heads,
                            int num_kv_heads, int head_dim, float eps) {
  qk_norm_rope_cpu(qkv, row_stride, q_norm, k_norm, positions, cos_table, sin_table, n, num_heads, num_kv_heads,
                   head_dim, eps);
  const int kv_dim = num_kv_heads * head_dim;
  const float* k = qkv + int64_t(num_heads) * head_dim;  // row i's k at k + i * row_stride, its v kv_dim later
  store_kvcache_cpu(k_cache, v_cache, k, k + kv_dim, row_stride, slot_mapping, n, kv_dim);
}

void silu_and_mul_cpu(float* out, const float* gate_up, int n, int inter) {
  for (int i = 0; i < n; i++) {
    const float* gate = gate_up + int64_t(i) * 2 * inter;
    const float* up = gate + inter;
    for (int j = 0; j < inter; j++) out[int64_t(i) * inter + j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
  }
}

void gather_rows_cpu(float* out, const float* x, const int32_t* rows, int m, int cols) {
  for (int i = 0; i < m; i++) std::memcpy(out + int64_t(i) * cols, x + int64_t(rows[i]) * cols, sizeof(float) * cols);
}

void take_sampled_tokens_cpu(int32_t* ids, const int32_t* tokens, const int32_t* rows, int m) {
  for (int i = 0; i < m; i++)
    if (rows[i] >= 0) ids[i] = tokens[rows[i]];
}

}  // namespace nanovllm
