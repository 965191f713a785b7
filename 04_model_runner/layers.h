// layers.h: the model's layers other than attention and the projections (nano-vllm: layers/layernorm.py,
// rotary_embedding.py, activation.py, embed_head.py), as plain C++ references in fp32. layers.cu has
// their CUDA kernels; each kernel is tested against the function here.
#pragma once

#include <cstdint>
#include <vector>

namespace nanovllm {

// out (n, hidden) = rows of table (vocab_size, hidden) picked by ids (n). With tensor parallelism the
// table holds rows [vocab_start, vocab_start + vocab_size) of the vocabulary; ids outside that range give
// zero rows (another rank fills them, and the all-reduce adds them up).
void embedding_cpu(float* out, const float* table, const int32_t* ids, int n, int hidden, int vocab_start,
                   int vocab_size);

// RMSNorm over each row of x (n, hidden): out = x / sqrt(mean(x^2) + eps) * weight.
void rmsnorm_cpu(float* out, const float* x, const float* weight, int n, int hidden, float eps);

// The fused residual variant: residual += x, then out = rmsnorm(residual). residual (n, hidden) is
// updated in place and carries the sum to the next layer.
void add_rmsnorm_cpu(float* out, float* residual, const float* x, const float* weight, int n, int hidden,
                     float eps);

// cos/sin table for rotary embeddings: (max_positions, head_dim / 2) each, as Hugging Face computes it:
// inv_freq[j] = 1 / theta^(2j / head_dim) in fp32, angle = position * inv_freq[j] in fp32.
void build_rope_table(std::vector<float>& cos_table, std::vector<float>& sin_table, int max_positions,
                      int head_dim, double theta);

// Qwen3's per-head RMSNorm of q and k (over head_dim, weights q_norm / k_norm), then rotary embedding on
// both, in place. qkv rows (n, row_stride) start with num_heads q heads then num_kv_heads k heads of
// head_dim values (v follows, untouched). RoPE is the rotate-half ("neox") layout, not GPT-J's
// interleaved pairs: for j < head_dim/2, (x[j], x[j + head_dim/2]) is rotated by angle[position, j].
void qk_norm_rope_cpu(float* qkv, int64_t row_stride, const float* q_norm, const float* k_norm,
                      const int32_t* positions, const float* cos_table, const float* sin_table, int n,
                      int num_heads, int num_kv_heads, int head_dim, float eps);

// qk_norm_rope_cpu, then store_kvcache_cpu (05_attention): the spec of the fused GPU kernel, which does
// both in one pass. qkv (n, row_stride): q and k normed and rotated in place, v untouched; then row i's k
// and v (kv_dim = num_kv_heads * head_dim values each) go to slot slot_mapping[i] of k_cache and v_cache
// (num_slots, kv_dim), -1 = skip (a padding row).
void qk_norm_rope_store_cpu(float* qkv, int64_t row_stride, const float* q_norm, const float* k_norm,
                            const int32_t* positions, const float* cos_table, const float* sin_table,
                            float* k_cache, float* v_cache, const int32_t* slot_mapping, int n, int num_heads,
                            int num_kv_heads, int head_dim, float eps);

// SwiGLU: out (n, inter) = silu(gate) * up, where gate_up (n, 2 * inter) is [gate | up] per row.
void silu_and_mul_cpu(float* out, const float* gate_up, int n, int inter);

// out (m, cols) = rows `rows[0..m)` of x: the last token of each prefilled sequence, for the LM head.
void gather_rows_cpu(float* out, const float* x, const int32_t* rows, int m, int cols);

// ids (m,): ids[i] = tokens[rows[i]] where rows[i] >= 0 (a token sampled by the step before, still only on
// the device when this step was queued), unchanged where rows[i] = -1.
void take_sampled_tokens_cpu(int32_t* ids, const int32_t* tokens, const int32_t* rows, int m);

}  // namespace nanovllm

// ---------------------------------------------------------------------------------------------------
// CUDA kernels (layers.cu): the same operations on bf16 tensors, fp32 arithmetic inside. Each runs on
// `stream`; all pointers are device pointers. hidden, inter and head_dim must be multiples of 8.
#ifdef NANOVLLM_CUDA
#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

// embedding_cpu: out (n, hidden) = the rows of table (vocab_size, hidden) that ids (n) pick, zeros for ids
// outside [vocab_start, vocab_start + vocab_size).
void embedding_cuda(bf16* out, const bf16* table, const int32_t* ids, int n, int hidden, int vocab_start,
                    int vocab_size, cudaStream_t stream);
// rmsnorm_cpu: out (n, hidden) = x / sqrt(mean(x^2) + eps) * weight, row by row.
void rmsnorm_cuda(bf16* out, const bf16* x, const bf16* weight, int n, int hidden, float eps, cudaStream_t stream);
// residual (bf16) += x, rounded to bf16 as the new residual; out = rmsnorm of the unrounded fp32 sum.
void add_rmsnorm_cuda(bf16* out, bf16* residual, const bf16* x, const bf16* weight, int n, int hidden, float eps,
                      cudaStream_t stream);
// add_rmsnorm_cuda with x the sum of a projection's split-K partials (splits, n, hidden) fp32, added in split
// order and rounded to bf16 as the projection would have stored it (06_tensor_parallel's
// linear_wgmma_partials_cuda; linear version 8): the same bits as that projection followed by add_rmsnorm_cuda.
void add_rmsnorm_partials_cuda(bf16* out, bf16* residual, const float* partials, int splits, const bf16* weight, int n,
                               int hidden, float eps, cudaStream_t stream);
// qk_norm_rope_cpu: q and k heads of each qkv row (n, row_stride) normed and rotated in place, v untouched.
void qk_norm_rope_cuda(bf16* qkv, int64_t row_stride, const bf16* q_norm, const bf16* k_norm,
                       const int32_t* positions, const float* cos_table, const float* sin_table, int n,
                       int num_heads, int num_kv_heads, int head_dim, float eps, cudaStream_t stream);
// qk_norm_rope_cuda and store_kvcache_cuda in one kernel, with the same arithmetic and rounding as the
// two (the same bits in q and in the cache): q, k and v are read once, and k goes to its cache slot
// without the round trip through qkv. Unlike qk_norm_rope_cuda it leaves qkv's k raw (attention reads keys
// from the cache only). Each qkv row starts on a 16-byte boundary (qkv 16-byte aligned, row_stride a multiple of 8;
// checked): each is copied into shared memory in 16-byte pieces. k_cache, v_cache: (num_slots, num_kv_heads *
// head_dim) bf16, one layer's cache. Launched overlapped, it reads positions and slot_mapping (and the
// weights) before waiting for the previous kernel: that kernel must not write them (cuda_utils.h; in a step
// they are the step's upload).
void qk_norm_rope_store_cuda(bf16* qkv, int64_t row_stride, const bf16* q_norm, const bf16* k_norm,
                             const int32_t* positions, const float* cos_table, const float* sin_table,
                             bf16* k_cache, bf16* v_cache, const int32_t* slot_mapping, int n, int num_heads,
                             int num_kv_heads, int head_dim, float eps, cudaStream_t stream);
// silu_and_mul_cpu: out (n, inter) = silu(gate) * up, gate_up (n, 2 * inter) = [gate | up] per row.
void silu_and_mul_cuda(bf16* out, const bf16* gate_up, int n, int inter, cudaStream_t stream);
// gather_rows_cpu: out (m, cols) = rows rows[0..m) of x.
void gather_rows_cuda(bf16* out, const bf16* x, const int32_t* rows, int m, int cols, cudaStream_t stream);
// take_sampled_tokens_cpu: ids[i] = tokens[rows[i]] where rows[i] >= 0, unchanged where rows[i] = -1 (m,).
void take_sampled_tokens_cuda(int32_t* ids, const int32_t* tokens, const int32_t* rows, int m, cudaStream_t stream);

// A CUDA graph's own transfers (04_model_runner/NOTES.md section 3, "The step's inputs read by the graph"):
// no copy engine between two replays, since each copy queued there costs the device 8-16 µs of waiting.
//
// The byte ranges [offsets[i], offsets[i] + bytes[i]) of host (pinned memory, which the device reads
// over PCIe) copied to the same offsets of dst, by one block; every range a multiple of 4 bytes at a
// 4-byte offset, at most kMaxPullRanges of them. Then *counter (device) += 1 and *host_flag = *counter:
// the host knows the ranges were read once the flag reaches the number of pulls it queued.
constexpr int kMaxPullRanges = 16;
struct PullRanges {
  int count = 0;
  int64_t offsets[kMaxPullRanges], bytes[kMaxPullRanges];
};
void pull_ranges_cuda(void* dst, const void* host, const PullRanges& ranges, int64_t* counter,
                      int64_t* host_flag, cudaStream_t stream);
// host[*slot * stride + i] = src[i] for i < n: the sampled tokens written to pinned host memory by the
// device (slot (1,) i32 on the device, 0 or 1); the host may read them once the stream has passed this
// kernel (an event recorded after it).
void push_tokens_cuda(int32_t* host, int64_t stride, const int32_t* src, const int32_t* slot, int n,
                      cudaStream_t stream);

}  // namespace nanovllm
#endif
