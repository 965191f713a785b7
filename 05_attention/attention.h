// attention.h: the paged KV cache and attention over it (nano-vllm: layers/attention.py; article,
// "sixth stop").
//
// Layout of one layer's cache, the same on CPU and GPU (nano-vllm's):
//   k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)
// so token slot s = block_id * block_size + offset holds its K at k_cache + s * kv_dim, kv_dim =
// num_kv_heads * head_dim. A sequence's block table lists its blocks in logical order.
//
// Every step first writes the new tokens' K/V into their slots (store_kvcache), then attends: prefill
// and decode both read all keys, cached and new, through the block table. Causality is bottom-right
// aligned: with seqlen_q new queries at the end of seqlen_k keys, query i (0-based) sees keys
// 0 .. seqlen_k - seqlen_q + i. GQA: query head h reads KV head h / (num_heads / num_kv_heads).
//
// The plain C++ functions here are the readable spec and the test oracle (fp32); the CUDA kernels (bf16
// storage, fp32 arithmetic) are a ladder of numbered versions, v0_naive.cu to v12_wgmma_prefill.cu,
// behind the two dispatching entry points in attention.cu.
#pragma once

#include <cstdint>

namespace nanovllm {

struct AttentionShape {
  int num_heads;     // query heads
  int num_kv_heads;  // key/value heads (divides num_heads)
  int head_dim;
  int block_size;    // tokens per KV block (v9-v11 decode: a multiple of 16, else v0 runs)
  float scale;       // softmax scale, head_dim^-0.5
};

// Writes K/V rows of num_tokens tokens into their cache slots. k and v rows are kv_dim contiguous values
// each, row i at k + i * row_stride (they are views into the fused qkv projection). slot_mapping[i] = -1
// means "no slot" (padding rows of a CUDA graph batch) and is skipped.
void store_kvcache_cpu(float* k_cache, float* v_cache, const float* k, const float* v, int64_t row_stride,
                       const int32_t* slot_mapping, int num_tokens, int kv_dim);

// Prefill (varlen): sequence b has queries rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q (row i at
// q + i * q_stride, num_heads * head_dim values) and seqlen_k = cu_seqlens_k[b+1] - cu_seqlens_k[b] keys,
// all read from the cache through block_tables[b * block_table_width + ...]. seqlen_k > seqlen_q when
// part of the sequence was cached (prefix hit, or an earlier chunk). out row i (num_heads * head_dim
// values at out + i * out_stride) gets the attention output of query row i.
void prefill_attention_cpu(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                           const float* k_cache, const float* v_cache, const int32_t* cu_seqlens_q,
                           const int32_t* cu_seqlens_k, const int32_t* block_tables, int block_table_width,
                           int num_seqs, const AttentionShape& shape);

// Decode: one query per sequence (row b of q), attending to context_lens[b] keys (the current token's
// included: it was stored first). context_lens[b] = 0 (a padding row) writes zeros.
void decode_attention_cpu(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                          const float* k_cache, const float* v_cache, const int32_t* context_lens,
                          const int32_t* block_tables, int block_table_width, int num_seqs,
                          const AttentionShape& shape);

}  // namespace nanovllm

// ---------------------------------------------------------------------------------------------------
// The CUDA kernel versions: a ladder from a naive kernel to tensor cores (05_attention/README.md walks it,
// NOTES.md has each one's idea, prediction and measurement). This table is plain C++, so that the
// command line and the CPU-only tests can read it without a GPU.
#include <vector>

namespace nanovllm {

enum class AttentionPhase { Prefill, Decode };

struct AttentionVersion {
  int number;         // what --attention-version takes; the file is 05_attention/<name>.cu
  const char* name;   // "v2_split_k"
  bool prefill;       // implements the prefill phase
  bool decode;        // implements the decode phase
  const char* idea;   // the one thing it adds over the previous version
};

// Every version, in ladder order (number i at index i). A version that does not implement a phase runs
// that phase's default instead: selecting v2_split_k runs v2 for decode and the default for prefill.
const std::vector<AttentionVersion>& attention_versions();

// The version to use when none is chosen. -1 rather than 0, because 0 is v0_naive.
constexpr int kAttentionVersionDefault = -1;
// Each phase's default: the fastest measured on the H200 (NOTES.md). One line each to flip.
constexpr int kDefaultPrefillVersion = 12;  // v12_wgmma_prefill (v5 where there is no wgmma)
constexpr int kDefaultDecodeVersion = 11;  // v11_cluster_combine

// The version that really runs for `requested` (kAttentionVersionDefault or a table number) in this
// phase and shape: the phase's default when `requested` is the default or does not implement the phase;
// then v0_naive when the kernel cannot take the shape (v1-v12 are instantiated for head_dim 64 and 128
// only, their decode kernels for GQA groups of at most 8 query heads, and v9-v11 for block sizes that are
// multiples of 16). Throws Error for a number that is not in the table, for head_dim outside 1..256 (v0's
// limit), for heads that do not form groups (num_heads a multiple of num_kv_heads >= 1), and for a
// block_size below 1.
int attention_version_for(AttentionPhase phase, int requested, const AttentionShape& shape);

}  // namespace nanovllm

// ---------------------------------------------------------------------------------------------------
// CUDA (attention.cu and the v*.cu files): the same three operations on a bf16 cache, fp32 arithmetic.
#ifdef NANOVLLM_CUDA
#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

// As store_kvcache_cpu, on bf16: one block a token, 16-byte copies where kv_dim and row_stride are multiples
// of 8 and k, v, k_cache and v_cache 16-byte aligned (one value at a time otherwise).
void store_kvcache_cuda(bf16* k_cache, bf16* v_cache, const bf16* k, const bf16* v, int64_t row_stride,
                        const int32_t* slot_mapping, int num_tokens, int kv_dim, cudaStream_t stream);

// Prefill: as prefill_attention_cpu. max_seqlen_q bounds the launch size. `version`: see
// attention_version_for (kAttentionVersionDefault: the fastest). From v1 on, q and out rows must be
// 16-byte aligned (pointers, and strides multiples of 8; Error otherwise): v1 loads and stores 16 bytes at
// a time, and v5 and v12 (4 bytes at a time) are held to the same rule.
void prefill_attention_cuda(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                            const bf16* v_cache, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                            const int32_t* block_tables, int block_table_width, int num_seqs, int max_seqlen_q,
                            const AttentionShape& shape, int version, cudaStream_t stream);

// Decode: as decode_attention_cpu. From v2 on, flash-decoding: the context is cut into partitions of
// decode_partition_size(...) keys, each attended by its own thread block, and the partial results (max,
// sum, unnormalised output) are merged by a second kernel. max_context_len bounds the number of
// partitions launched (under a CUDA graph it is max_model_len; v2-v9's blocks past a sequence's context
// return at once). v10 cuts every context into decode_splits(...) partitions instead, a number set by the batch
// alone; with 1 split there is no second kernel. v11 cuts each context into cluster_decode_splits(...)
// partitions, at most kMaxClusterSplits (8 where the GPU holds no cluster of 16), a thread-block cluster that
// merges its splits itself (no second kernel either; where the GPU has no clusters, v10's splits and combine).
// q and out rows aligned as prefill_attention_cuda's from v1 on. `scratch` needs
// decode_attention_scratch_bytes(...) bytes, enough for every version. v9-v11 are launched overlapped and
// read context_lens, block_tables and the K/V of every key but each sequence's newest before they wait for
// the previous kernel (cuda_utils.h): that kernel may write the newest key (qk_norm_rope_store_cuda does),
// not those (in a step they are the step's upload and earlier steps' keys).
void decode_attention_cuda(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                           const bf16* v_cache, const int32_t* context_lens, const int32_t* block_tables,
                           int block_table_width, int num_seqs, int max_context_len, const AttentionShape& shape,
                           float* scratch, int version, cudaStream_t stream);

// Bytes of decode's scratch (the partitions' m, l and O) for any batch up to max_seqs and any context up to
// max_context_len, for every version.
size_t decode_attention_scratch_bytes(int max_seqs, int max_context_len, const AttentionShape& shape);
// v2-v9: the keys a partition covers (64 to 512: longer as the batch gives more blocks of its own).
int decode_partition_size(int num_seqs, const AttentionShape& shape);
// v10 (and v11 without clusters): how many partitions every context is cut into, enough for about one
// block an SM; 1 from 16 sequences on at 8 KV heads.
int decode_splits(int num_seqs, const AttentionShape& shape);
// v11's count where the GPU holds clusters: decode_splits, but 2 instead of 1 below two blocks an SM.
int cluster_decode_splits(int num_seqs, const AttentionShape& shape);
constexpr int kMaxClusterSplits = 16, kPortableClusterSplits = 8;  // thread-block clusters: Hopper's most, and
                                                                    // the most every cluster GPU holds
// The most splits v11 puts in one cluster on this GPU: kMaxClusterSplits, kPortableClusterSplits, or 1 where
// the code loaded for it has no clusters.
int tensor_core_decode_max_cluster();

// Decode with chapter 04's qk_norm_rope_store done inside the attention kernel: one launch per layer
// instead of two. qkv (num_seqs, qkv_stride) holds each sequence's new token as the projection left it
// (q, k raw; then v); the kernel norms and rotates q for itself and writes the new token's K (normed,
// rotated) and V to slot_mapping[b] before any block reads that slot; out as decode_attention_cuda. The
// result equals qk_norm_rope_store_cuda then decode_attention_cuda bit for bit on out and on the cache
// (qkv itself is left raw). v9, v10 and v11 only (decode_attention_fuses_qk_norm_rope; the default is v11).
// Like decode_attention_cuda it reads its step inputs (here positions and slot_mapping too) and the older
// keys before waiting for the previous kernel, which writes qkv.
struct QkNormRopeInputs {
  const bf16* q_norm;           // (head_dim)
  const bf16* k_norm;           // (head_dim)
  const float* cos_table;       // (max_position, head_dim / 2)
  const float* sin_table;       // (max_position, head_dim / 2)
  const int32_t* positions;     // (num_seqs)
  const int32_t* slot_mapping;  // (num_seqs), -1 = none (a padding row)
  float eps;
};
bool decode_attention_fuses_qk_norm_rope(int version, const AttentionShape& shape);
void decode_attention_fused_cuda(bf16* out, int64_t out_stride, const bf16* qkv, int64_t qkv_stride, bf16* k_cache,
                                 bf16* v_cache, const int32_t* context_lens, const int32_t* block_tables,
                                 int block_table_width, int num_seqs, int max_context_len, const AttentionShape& shape,
                                 float* scratch, int version, const QkNormRopeInputs& qk, cudaStream_t stream);

// decode_attention_fused_cuda at one sequence, with the projection after attention (o_proj) taking over the
// merge of its splits: v10's kernel writes its partials and no combine kernel runs; o_proj's blocks, one
// (KV head, 64 outputs) each, merge the partials of their KV head's query heads themselves (the combine's
// formula and order) and multiply them by their slice of o_proj's columns (o_proj_merge.cu). out (1, num_heads
// * head_dim) gets attention's output, the bits of v10 with its combine; partials (num_kv_heads, 1, hidden) fp32
// gets each KV head's share of out @ o_proj^T, o_proj (hidden, num_heads * head_dim) bf16 and 16-byte aligned:
// their sum in KV-head order, rounded to bf16, is the projection (add_rmsnorm_partials_cuda, chapter 04,
// adds them). Only where decode_attention_o_proj_fits says so; the rest as decode_attention_fused_cuda.
bool decode_attention_o_proj_fits(int version, int num_seqs, const AttentionShape& shape);
void decode_attention_o_proj_cuda(float* partials, const bf16* o_proj, int hidden, bf16* out, const bf16* qkv,
                                  int64_t qkv_stride, bf16* k_cache, bf16* v_cache, const int32_t* context_lens,
                                  const int32_t* block_tables, int block_table_width, int max_context_len,
                                  const AttentionShape& shape, float* scratch, int version, const QkNormRopeInputs& qk,
                                  cudaStream_t stream);

// The first keys of every cache block a decode step reads, brought into the L2 ahead of attention (kv_warm.cu):
// block e of sequence s (block_tables (num_seqs, table_width) i32, context_lens (num_seqs,) i32) gives its
// first floor(valid * budget_bytes / (all * kv_dim * 4)) keys, K and V, where valid is its keys and all the
// sum of context_lens; every key where the budget covers them all. Writes only *checksum ^= the XOR of the
// 32-bit words it read (so that a test can tell which ones, and the loads are not dead code). A hint: attention
// reads the same bits with or without it. kv_dim a multiple of 8.
void kv_warm_cuda(const bf16* k_cache, const bf16* v_cache, const int* block_tables, const int* context_lens,
                  int table_width, int num_seqs, int block_size, int kv_dim, int64_t budget_bytes, unsigned* checksum,
                  cudaStream_t stream);

}  // namespace nanovllm
#endif
