// attention.cu: the KV-cache write, and the dispatch of prefill and decode attention to the kernel
// versions (one file each, README.md walks them in order):
//
//   v0_naive.cu                 one warp per (sequence, query head, query row)       prefill, decode
//   v1_gqa.cu                   a block per (sequence, KV head): GQA-shared loads    prefill, decode
//   v2_split_k.cu               + context partitions and a combine kernel            decode
//   v3_staged_table.cu          + block-table entries staged in shared memory        decode
//   v4_prefetch.cu              + next K/V loaded into registers while computing     decode
//   v5_tensor_core_prefill.cu   FlashAttention-2 on tensor cores (mma.sync)          prefill
//   v6_pipelined_decode.cu      v2 with K/V streamed through a cp.async pipeline     decode
//   v7_head_major.cu            v2 with the grid head-fastest                        decode
//   v8_l2_prefetch.cu           v2 + an L2 prefetch of each warp's next step         decode
//   v9_tensor_core_decode.cu    split-K decode on tensor cores (mma.sync)            decode
//   v10_split_by_batch.cu       v9, split only to fill the GPU (often no combine)    decode
//   v11_cluster_combine.cu      v10, the splits merged in a thread-block cluster     decode (default)
//   v12_wgmma_prefill.cu        v5 on Hopper's warpgroup tensor cores (wgmma)        prefill (default)
//
// Which one runs: attention_version_for (attention_versions.cpp). Measured results: NOTES.md.
// Build: `make CUDA_ARCH=90`; run one version: `build/nanovllm bench-step --random qwen3-0.6b
// --attention-version N`.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "05_attention/kernels.cuh"
#include "05_attention/softmax.cuh"

namespace nanovllm {

// ---------------------------------------------------------------------------------------------------
// store_kvcache

namespace {

// Token i's K and V rows (kv_dim values each) -> cache slot slot_mapping[i]; -1 stores nothing. One block
// per token; 16-byte copies when every row is 16-byte aligned (VEC = 8 values), else one value at a time.
template <int VEC>
__global__ void store_kvcache_kernel(bf16* k_cache, bf16* v_cache, const bf16* k, const bf16* v, int64_t row_stride,
                                     const int32_t* slot_mapping, int kv_dim) {
  using Chunk = std::conditional_t<VEC == 8, Bf16x8, bf16>;
  const int token = blockIdx.x;
  const int32_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding row
  Chunk* k_dst = reinterpret_cast<Chunk*>(k_cache + int64_t(slot) * kv_dim);
  Chunk* v_dst = reinterpret_cast<Chunk*>(v_cache + int64_t(slot) * kv_dim);
  const Chunk* k_src = reinterpret_cast<const Chunk*>(k + token * row_stride);
  const Chunk* v_src = reinterpret_cast<const Chunk*>(v + token * row_stride);
  for (int c = threadIdx.x; c < kv_dim / VEC; c += blockDim.x) k_dst[c] = k_src[c], v_dst[c] = v_src[c];
}

}  // namespace

void store_kvcache_cuda(bf16* k_cache, bf16* v_cache, const bf16* k, const bf16* v, int64_t row_stride,
                        const int32_t* slot_mapping, int num_tokens, int kv_dim, cudaStream_t stream) {
  if (num_tokens == 0) return;
  const bool aligned = kv_dim % 8 == 0 && row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v) % 16 == 0 && reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
  // 128 threads: a row of Qwen3's kv_dim (1,024 values) is 128 chunks of 8, one a thread.
  if (aligned)
    store_kvcache_kernel<8><<<num_tokens, 128, 0, stream>>>(k_cache, v_cache, k, v, row_stride, slot_mapping, kv_dim);
  else
    store_kvcache_kernel<1><<<num_tokens, 128, 0, stream>>>(k_cache, v_cache, k, v, row_stride, slot_mapping, kv_dim);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------
// Dispatch

namespace {

using Launcher = void (*)(const AttentionParams&, const LaunchDims&, cudaStream_t);

// Indexed by version number; nullptr where a version does not implement the phase (the table in
// attention_versions.cpp says the same, and attention_version_for never returns such a pair).
constexpr Launcher kPrefillLaunchers[] = {launch_v0_naive, launch_v1_gqa, nullptr, nullptr, nullptr,
                                          launch_v5_tensor_core_prefill, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                          launch_v12_wgmma_prefill};
constexpr Launcher kDecodeLaunchers[] = {launch_v0_naive,    launch_v1_gqa, launch_v2_split_k, launch_v3_staged_table,
                                         launch_v4_prefetch, nullptr,       launch_v6_pipelined_decode,
                                         launch_v7_head_major, launch_v8_l2_prefetch,
                                         launch_v9_tensor_core_decode, launch_v10_split_by_batch,
                                         launch_v11_cluster_combine, nullptr};

// The fields every version reads; the phase-specific ones are filled by the caller.
AttentionParams make_params(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                            const bf16* v_cache, const int32_t* block_tables, int width, const AttentionShape& s) {
  AttentionParams p{};
  p.out = out, p.out_stride = out_stride, p.q = q, p.q_stride = q_stride;
  p.k_cache = k_cache, p.v_cache = v_cache, p.block_tables = block_tables, p.block_table_width = width;
  p.num_heads = s.num_heads, p.num_kv_heads = s.num_kv_heads, p.head_dim = s.head_dim, p.block_size = s.block_size;
  p.scale = s.scale, p.scale_log2 = s.scale * kLog2e;
  return p;
}

// v1-v4 and v6-v8 load and store q and out rows 16 bytes at a time, which needs 16-byte aligned rows; v5 and
// v9-v12 (4 bytes at a time at most) are held to the same rule. v0 takes any.
void check_alignment(int version, const bf16* q, int64_t q_stride, const bf16* out, int64_t out_stride) {
  if (version == 0) return;
  if (q_stride % 8 != 0 || out_stride % 8 != 0 || reinterpret_cast<uintptr_t>(q) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 16 != 0)
    fail("attention v", version, " needs 16-byte aligned q and out rows (strides ", q_stride, ", ", out_stride, ")");
}

}  // namespace

void prefill_attention_cuda(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                            const bf16* v_cache, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                            const int32_t* block_tables, int block_table_width, int num_seqs, int max_seqlen_q,
                            const AttentionShape& shape, int version, cudaStream_t stream) {
  const int v = attention_version_for(AttentionPhase::Prefill, version, shape);
  if (num_seqs == 0 || max_seqlen_q == 0) return;
  check_alignment(v, q, q_stride, out, out_stride);
  AttentionParams p =
      make_params(out, out_stride, q, q_stride, k_cache, v_cache, block_tables, block_table_width, shape);
  p.cu_seqlens_q = cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_k;
  kPrefillLaunchers[v](p, LaunchDims{num_seqs, max_seqlen_q, 0}, stream);
  CUDA_CHECK_LAUNCH();
}

int decode_partition_size(int num_seqs, const AttentionShape& s) {
  // Enough blocks to fill the GPU (132 SMs on an H200) even for a handful of sequences; long partitions
  // for big batches, where every block then covers the whole of a typical context.
  const int work = num_seqs * s.num_kv_heads;
  if (work >= 1024) return 512;
  if (work >= 256) return 256;
  if (work >= 64) return 128;
  return 64;
}

int decode_splits(int num_seqs, const AttentionShape& s) {
  // About one block per SM of an H200 (132): measured at batch 1-256 and context 1,000 (NOTES.md, v10),
  // more blocks than that only shorten each block's run of keys, and its fixed costs (loading q, filling
  // the pipeline, merging its warps) stay. Once the batch alone gives that many blocks, 1 split.
  constexpr int kBlocksToFill = 128;
  const int work = num_seqs * s.num_kv_heads;
  return std::max(1, (kBlocksToFill + work - 1) / work);
}

int cluster_decode_splits(int num_seqs, const AttentionShape& s) {
  // As decode_splits, and 2 where that gives 1 split of fewer than two blocks an SM (an SM holds two of v9's
  // blocks): the 16-sequence graph at 8 KV heads, whose 128 blocks left each SM one. Two splits merged in
  // the cluster (no combine kernel) made that step 0.02-0.07 ms faster at contexts of 500, 1,000 and 2,000
  // on the H200, where the same two splits at 32 sequences, and other counts at 1-8, were slower or
  // mixed (NOTES.md, "Two blocks an SM at 16 sequences").
  constexpr int kTwoBlocksAnSm = 256;
  const int splits = decode_splits(num_seqs, s);
  return splits == 1 && num_seqs * s.num_kv_heads < kTwoBlocksAnSm ? 2 : splits;
}

size_t decode_attention_scratch_bytes(int max_seqs, int max_context_len, const AttentionShape& s) {
  // v2-v9 cut the context into decode_partition_size partitions, v10 into decode_splits (and v11 too where
  // the GPU has no clusters); v0 and v1 need no scratch, nor do v10 with 1 split and v11 merging in its
  // cluster (cluster_decode_splits).
  size_t most = 0;
  for (int b = 1; b <= max_seqs; b++) {
    const int size = decode_partition_size(b, s);
    const size_t parts = size_t(std::max(1, (max_context_len + size - 1) / size));
    most = std::max(most, size_t(b) * s.num_heads * std::max<size_t>(parts, size_t(decode_splits(b, s))));
  }
  return most * (size_t(s.head_dim) + 2) * sizeof(float);
}

namespace {

// A decode's parameters for version v (attention_version_for's answer, or 10 for the merge in o_proj):
// `fused` null for the plain decode.
AttentionParams decode_params(int v, bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride,
                              const bf16* k_cache, const bf16* v_cache, const int32_t* context_lens,
                              const int32_t* block_tables, int block_table_width, int num_seqs, int max_context_len,
                              const AttentionShape& shape, float* scratch, const QkNormRopeInputs* fused) {
  check_alignment(v, q, q_stride, out, out_stride);
  AttentionParams p =
      make_params(out, out_stride, q, q_stride, k_cache, v_cache, block_tables, block_table_width, shape);
  p.context_lens = context_lens;
  // The partials of split-K (v2 and later; unused by v0 and v1), laid out as
  // decode_attention_scratch_bytes counted them: m, then l, then O.
  p.partition_size = decode_partition_size(num_seqs, shape);
  p.max_partitions = std::max(1, (max_context_len + p.partition_size - 1) / p.partition_size);
  if (v == 10) p.splits = decode_splits(num_seqs, shape), p.max_partitions = p.splits;
  if (v == 11) {  // up to the largest cluster, by cluster_decode_splits (without clusters v11 is v10: splits and a combine)
    const int most = tensor_core_decode_max_cluster();
    p.splits = most > 1 ? std::min(cluster_decode_splits(num_seqs, shape), most) : decode_splits(num_seqs, shape);
    p.max_partitions = p.splits;
  }
  const size_t entries = size_t(num_seqs) * shape.num_heads * p.max_partitions;
  p.part_m = scratch;
  p.part_l = scratch + entries;
  p.part_O = scratch + 2 * entries;
  if (fused) {
    p.q_norm = fused->q_norm, p.k_norm = fused->k_norm, p.cos_table = fused->cos_table, p.sin_table = fused->sin_table;
    p.positions = fused->positions, p.slot_mapping = fused->slot_mapping, p.eps = fused->eps;
    p.k_cache_out = const_cast<bf16*>(k_cache), p.v_cache_out = const_cast<bf16*>(v_cache);
  }
  return p;
}

// decode_attention_cuda and decode_attention_fused_cuda: `fused` null for the plain decode.
void decode(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
            const int32_t* context_lens, const int32_t* block_tables, int block_table_width, int num_seqs,
            int max_context_len, const AttentionShape& shape, float* scratch, int version,
            const QkNormRopeInputs* fused, cudaStream_t stream) {
  const int v = attention_version_for(AttentionPhase::Decode, version, shape);
  if (num_seqs == 0) return;
  const AttentionParams p = decode_params(v, out, out_stride, q, q_stride, k_cache, v_cache, context_lens, block_tables,
                                          block_table_width, num_seqs, max_context_len, shape, scratch, fused);
  kDecodeLaunchers[v](p, LaunchDims{num_seqs, 1, max_context_len}, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void decode_attention_cuda(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                           const bf16* v_cache, const int32_t* context_lens, const int32_t* block_tables,
                           int block_table_width, int num_seqs, int max_context_len, const AttentionShape& shape,
                           float* scratch, int version, cudaStream_t stream) {
  decode(out, out_stride, q, q_stride, k_cache, v_cache, context_lens, block_tables, block_table_width, num_seqs,
         max_context_len, shape, scratch, version, nullptr, stream);
}

bool decode_attention_fuses_qk_norm_rope(int version, const AttentionShape& shape) {
  const int v = attention_version_for(AttentionPhase::Decode, version, shape);
  return v == 9 || v == 10 || v == 11;
}

void decode_attention_fused_cuda(bf16* out, int64_t out_stride, const bf16* qkv, int64_t qkv_stride, bf16* k_cache,
                                 bf16* v_cache, const int32_t* context_lens, const int32_t* block_tables,
                                 int block_table_width, int num_seqs, int max_context_len, const AttentionShape& shape,
                                 float* scratch, int version, const QkNormRopeInputs& qk, cudaStream_t stream) {
  if (!decode_attention_fuses_qk_norm_rope(version, shape))
    fail("attention v", attention_version_for(AttentionPhase::Decode, version, shape),
         " cannot do qk-norm, RoPE and the KV write itself (v9, v10 and v11 can)");
  decode(out, out_stride, qkv, qkv_stride, k_cache, v_cache, context_lens, block_tables, block_table_width, num_seqs,
         max_context_len, shape, scratch, version, &qk, stream);
}

bool decode_attention_o_proj_fits(int version, int num_seqs, const AttentionShape& shape) {
  // v10's kernel and its splits (v11's too: at one sequence v11's cluster is what this replaces); at least 2
  // splits, or there is nothing to merge; a KV head's query heads at most o_proj_merge's columns a block.
  const int v = attention_version_for(AttentionPhase::Decode, version, shape);
  const int columns = shape.num_heads / shape.num_kv_heads * shape.head_dim;
  return (v == 10 || v == 11) && num_seqs == 1 && decode_splits(1, shape) > 1 &&
         decode_splits(1, shape) <= kMaxOProjMergeSplits && columns <= kOProjMergeMaxColumns;
}

void decode_attention_o_proj_cuda(float* partials, const bf16* o_proj, int hidden, bf16* out, const bf16* qkv,
                                  int64_t qkv_stride, bf16* k_cache, bf16* v_cache, const int32_t* context_lens,
                                  const int32_t* block_tables, int block_table_width, int max_context_len,
                                  const AttentionShape& shape, float* scratch, int version, const QkNormRopeInputs& qk,
                                  cudaStream_t stream) {
  if (!decode_attention_o_proj_fits(version, 1, shape))
    fail("internal: decode_attention_o_proj_cuda cannot run attention v",
         attention_version_for(AttentionPhase::Decode, version, shape), " at ", shape.num_heads, "/",
         shape.num_kv_heads, " heads of ", shape.head_dim, " (decode_attention_o_proj_fits)");
  if (reinterpret_cast<uintptr_t>(o_proj) % 16 != 0 || reinterpret_cast<uintptr_t>(partials) % 16 != 0)
    fail("internal: decode_attention_o_proj_cuda needs 16-byte aligned o_proj and partials");
  // v10's parameters at one sequence: decode_splits partitions, each block writing its partials.
  const int q_dim = shape.num_heads * shape.head_dim;
  AttentionParams p = decode_params(10, out, q_dim, qkv, qkv_stride, k_cache, v_cache, context_lens, block_tables,
                                    block_table_width, 1, max_context_len, shape, scratch, &qk);
  p.next_at_wait = true;  // o_proj's merge: its weights on their way during the tile loop
  launch_tensor_core_decode_kernel(p, 1, stream);
  CUDA_CHECK_LAUNCH();
  launch_o_proj_merge(p, partials, o_proj, hidden, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
