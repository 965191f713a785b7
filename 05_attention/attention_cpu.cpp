// attention_cpu.cpp: the reference implementation: the plain definition of attention, one query at a
// time, with a numerically stable softmax. No tiling, no online softmax: that is the GPU's business.
#include <cmath>
#include <cstring>
#include <vector>

#include "05_attention/attention.h"

namespace nanovllm {

void store_kvcache_cpu(float* k_cache, float* v_cache, const float* k, const float* v, int64_t row_stride,
                       const int32_t* slot_mapping, int num_tokens, int kv_dim) {
  for (int i = 0; i < num_tokens; i++) {
    int32_t slot = slot_mapping[i];
    if (slot < 0) continue;  // -1: padding, nothing to store
    std::memcpy(k_cache + int64_t(slot) * kv_dim, k + i * row_stride, sizeof(float) * kv_dim);
    std::memcpy(v_cache + int64_t(slot) * kv_dim, v + i * row_stride, sizeof(float) * kv_dim);
  }
}

namespace {

// One query vector (all heads) against keys 0..num_keys-1 of one sequence, read through its block table.
//   out: (num_heads, head_dim)   q: (num_heads, head_dim)
void attend_one_query(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int32_t* block_table, int num_keys, const AttentionShape& s,
                      std::vector<float>& scores) {
  const int kv_dim = s.num_kv_heads * s.head_dim;
  const int group = s.num_heads / s.num_kv_heads;  // query heads per KV head
  scores.resize(size_t(num_keys));
  for (int h = 0; h < s.num_heads; h++) {
    const int kv_head = h / group;
    const float* qh = q + h * s.head_dim;
    float* oh = out + h * s.head_dim;
    // S = q . K^T * scale, then the softmax with its max subtracted first (exp never overflows).
    float max_score = -INFINITY;
    for (int j = 0; j < num_keys; j++) {
      int64_t slot = int64_t(block_table[j / s.block_size]) * s.block_size + j % s.block_size;
      const float* kj = k_cache + slot * kv_dim + kv_head * s.head_dim;
      float dot = 0;
      for (int d = 0; d < s.head_dim; d++) dot += qh[d] * kj[d];
      scores[j] = dot * s.scale;
      max_score = std::fmax(max_score, scores[j]);
    }
    float sum = 0;
    for (int j = 0; j < num_keys; j++) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    // O = softmax(S) . V
    for (int d = 0; d < s.head_dim; d++) oh[d] = 0;
    for (int j = 0; j < num_keys; j++) {
      int64_t slot = int64_t(block_table[j / s.block_size]) * s.block_size + j % s.block_size;
      const float* vj = v_cache + slot * kv_dim + kv_head * s.head_dim;
      float p = scores[j] / sum;
      for (int d = 0; d < s.head_dim; d++) oh[d] += p * vj[d];
    }
  }
}

}  // namespace

void prefill_attention_cpu(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                           const float* k_cache, const float* v_cache, const int32_t* cu_seqlens_q,
                           const int32_t* cu_seqlens_k, const int32_t* block_tables, int block_table_width,
                           int num_seqs, const AttentionShape& shape) {
  std::vector<float> scores;
  for (int b = 0; b < num_seqs; b++) {
    const int seqlen_q = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    const int seqlen_k = cu_seqlens_k[b + 1] - cu_seqlens_k[b];
    const int32_t* block_table = block_tables + int64_t(b) * block_table_width;
    for (int i = 0; i < seqlen_q; i++) {
      const int row = cu_seqlens_q[b] + i;
      // Bottom-right causal mask: the last query sees every key.
      const int num_keys = seqlen_k - seqlen_q + i + 1;
      attend_one_query(out + row * out_stride, q + row * q_stride, k_cache, v_cache, block_table, num_keys,
                       shape, scores);
    }
  }
}

void decode_attention_cpu(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                          const float* k_cache, const float* v_cache, const int32_t* context_lens,
                          const int32_t* block_tables, int block_table_width, int num_seqs,
                          const AttentionShape& shape) {
  std::vector<float> scores;
  for (int b = 0; b < num_seqs; b++) {
    float* o = out + b * out_stride;
    if (context_lens[b] == 0) {  // padding row
      for (int i = 0; i < shape.num_heads * shape.head_dim; i++) o[i] = 0;
      continue;
    }
    attend_one_query(o, q + b * q_stride, k_cache, v_cache, block_tables + int64_t(b) * block_table_width,
                     context_lens[b], shape, scores);
  }
}

}  // namespace nanovllm
