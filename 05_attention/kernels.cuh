// kernels.cuh: what attention.cu (the dispatch) and the version files v0_naive.cu .. v12_wgmma_prefill.cu
// share: the one parameter struct every kernel takes, and the launcher each version file defines.
// Included only by .cu files.
#pragma once

#include <cstdint>

#include "05_attention/attention.h"

namespace nanovllm {

// Everything a kernel needs, passed by value. Prefill and decode differ in where a sequence's queries and
// keys come from: prefill has cu_seqlens_q/k, decode has one query per sequence and context_lens (and
// cu_seqlens_q == nullptr). `rows` below: the query tokens, cu_seqlens_q[num_seqs] in prefill and num_seqs
// in decode.
struct AttentionParams {
  bf16* out;                    // (rows, num_heads * head_dim), row i at out + i * out_stride
  int64_t out_stride;
  const bf16* q;                // (rows, num_heads * head_dim), row i at q + i * q_stride
  int64_t q_stride;
  const bf16* k_cache;          // (num_blocks, block_size, num_kv_heads, head_dim)
  const bf16* v_cache;          // (num_blocks, block_size, num_kv_heads, head_dim)
  const int32_t* block_tables;  // (num_seqs, block_table_width): physical block of each logical block
  int block_table_width;
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;       // softmax scale, head_dim^-0.5
  float scale_log2;  // scale * log2(e): scores kept in base 2, so that exp is one exp2f call (softmax.cuh)
  // Prefill (varlen): sequence b has queries cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and
  // cu_seqlens_k[b+1] - cu_seqlens_k[b] keys. (num_seqs + 1) each.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  // Decode: sequence b has query row b and context_lens[b] keys. (num_seqs)
  const int32_t* context_lens;
  // Split-K decode (v2 and later): each (sequence, query head) gets max_partitions partial results.
  int partition_size;   // keys per partition
  int max_partitions;   // partitions launched per sequence (grid.x): ceil(max_context_len / partition_size)
                        // in v2-v9; `splits` in v10 and v11
  float* part_m;        // (num_seqs, num_heads, max_partitions): running max (base 2)
  float* part_l;        // (num_seqs, num_heads, max_partitions): sum of exp2(s - m)
  float* part_O;        // (num_seqs, num_heads, max_partitions, head_dim): unnormalised output
  // v10 and v11: each sequence's context cut into `splits` near-equal partitions, whatever its length (v10
  // decode_splits; v11 cluster_decode_splits capped at tensor_core_decode_max_cluster(), or decode_splits
  // where the GPU has no clusters); 0 = partitions of partition_size keys (v2-v9). With 1 split the block
  // writes `out` itself.
  int splits;
  // Decode with chapter 04's qk_norm_rope_store done by the attention kernel (decode_attention_fused_cuda;
  // v9, v10 and v11): q and k in the qkv rows that q points into are raw, and the cache lacks this step's key.
  // Each block norms and rotates its G query heads itself; the block whose partition holds a sequence's
  // last key first writes that key's K (normed, rotated) and V to the sequence's slot. nullptr q_norm: the
  // plain decode (q ready, every key in the cache).
  const bf16* q_norm;           // (head_dim) RMSNorm weights
  const bf16* k_norm;           // (head_dim)
  const float* cos_table;       // (max_position, head_dim / 2)
  const float* sin_table;       // (max_position, head_dim / 2)
  const int32_t* positions;     // (num_seqs): the position of each sequence's new token
  const int32_t* slot_mapping;  // (num_seqs): its cache slot, -1 for a padding row
  bf16* k_cache_out;            // k_cache and v_cache, writable
  bf16* v_cache_out;
  float eps;
  // v9's kernel (v10, v11): let the next kernel launch right after the wait instead of after the tile loop. Set
  // where the next kernel is o_proj's merge at one sequence (decode_attention_o_proj_cuda), whose blocks bring
  // their weights before their own wait.
  bool next_at_wait = false;
};

// Keys per partition of a sequence with `context` keys: partition_size, or for v10 and v11 the context over
// `splits` rounded up to whole 16-key tiles (at least one tile): context 1,000 over 2 splits, 500 -> 512;
// over 3, 334 -> 336.
__host__ __device__ inline int partition_size_for(const AttentionParams& p, int context) {
  if (p.splits == 0) return p.partition_size;
  const int keys = (context + p.splits - 1) / p.splits;
  return keys <= 16 ? 16 : (keys + 15) / 16 * 16;
}

// The launch size the dispatch knows: num_seqs, the most query rows of one sequence (1 in decode) and
// the most keys (max_context_len in decode, bounding the partitions).
struct LaunchDims {
  int num_seqs;
  int max_seqlen_q;
  int max_context_len;
};

// One launcher per version and phase it implements (each in its own file). They check nothing: the
// dispatch has already picked a version that takes this shape (attention_version_for).
void launch_v0_naive(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v1_gqa(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v2_split_k(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v3_staged_table(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v4_prefetch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v5_tensor_core_prefill(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v6_pipelined_decode(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v7_head_major(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v8_l2_prefetch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v9_tensor_core_decode(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v10_split_by_batch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
void launch_v11_cluster_combine(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
// v12 on a GPU of compute capability 9.0 running code built for sm_90a (wgmma_prefill_available); v5
// elsewhere.
void launch_v12_wgmma_prefill(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream);
bool wgmma_prefill_available();
// v9's kernel alone (v9_tensor_core_decode.cu): the partials, or `out` itself when p.splits == 1; with
// `cluster` (v11; p.splits == p.max_partitions <= tensor_core_decode_max_cluster(): 16, or 8 where the
// GPU holds no cluster of 16) the splits of a (sequence, KV head) are a thread-block
// cluster that merges them into `out` itself.
void launch_tensor_core_decode_kernel(const AttentionParams& p, int num_seqs, cudaStream_t stream,
                                      bool cluster = false);
// Whether the code loaded for this GPU can launch that cluster (sm_90 and later); the most splits it can
// hold: tensor_core_decode_max_cluster (attention.h).
bool tensor_core_decode_clusters_available();
// The second kernel of split-K decode (v2_split_k.cu): merges the partitions into `out`.
void launch_decode_combine(const AttentionParams& p, int num_seqs, cudaStream_t stream);
// At one sequence, the combine moved into o_proj (o_proj_merge.cu; decode_attention_o_proj_cuda): merges
// p's partitions into `out` and writes each KV head's share of out @ W^T, partials (num_kv_heads, 1, hidden) fp32,
// W (hidden, num_heads * head_dim) bf16. A KV head's query heads span at most kOProjMergeMaxColumns of W's columns,
// and the context is cut into at most kMaxOProjMergeSplits partitions (p.splits).
constexpr int kOProjMergeMaxColumns = 512, kMaxOProjMergeSplits = 128;
void launch_o_proj_merge(const AttentionParams& p, float* partials, const bf16* W, int hidden, cudaStream_t stream);

// Where one sequence's queries and keys are. Query i (0-based, of seqlen_q) is row q_row0 + i of q and
// out; it sees keys 0 .. seqlen_k - seqlen_q + i (causal, bottom-right aligned).
struct SeqRange {
  int q_row0, seqlen_q, seqlen_k;
};

__device__ inline SeqRange seq_range(const AttentionParams& p, int seq) {
  if (p.cu_seqlens_q == nullptr) return {seq, 1, p.context_lens[seq]};  // decode: one query
  const int q_row0 = p.cu_seqlens_q[seq];
  return {q_row0, p.cu_seqlens_q[seq + 1] - q_row0, p.cu_seqlens_k[seq + 1] - p.cu_seqlens_k[seq]};
}

}  // namespace nanovllm
