// attention_versions.cpp: the table of CUDA attention kernel versions and the rule that picks the one
// that runs. Plain C++ (no CUDA), so that the command line and the CPU-only tests can read it.
#include "01_sequence/base/common.h"
#include "05_attention/attention.h"

namespace nanovllm {

const std::vector<AttentionVersion>& attention_versions() {
  // number, name (the file 05_attention/<name>.cu), prefill, decode, idea
  static const std::vector<AttentionVersion> table = {
      {0, "v0_naive", true, true,
       "one warp per (sequence, query head, query row), one key at a time, online softmax (m_i, l_i, O_i)"},
      {1, "v1_gqa", true, true,
       "a thread block per (sequence, KV head): the group's query heads share every K/V load; 16-byte loads"},
      {2, "v2_split_k", false, true,
       "decode context cut into partitions of separate blocks, merged by a combine kernel (flash-decoding)"},
      {3, "v3_staged_table", false, true, "v2 + the block's block-table entries staged in shared memory"},
      {4, "v4_prefetch", false, true, "v3 + the next keys' K/V loaded into registers before this step computes"},
      {5, "v5_tensor_core_prefill", true, false,
       "FlashAttention-2 on tensor cores: mma.sync m16n8k16, ldmatrix, cp.async double buffer, swizzle"},
      {6, "v6_pipelined_decode", false, true,
       "v2 with K/V streamed through shared memory by a 4-stage cp.async pipeline (no registers held)"},
      {7, "v7_head_major", false, true,
       "v2 with the grid head-fastest: the blocks running together read whole token rows of the cache"},
      {8, "v8_l2_prefetch", false, true,
       "v2 + each warp asks L2 for its next step's K/V lines while it computes (no registers held)"},
      {9, "v9_tensor_core_decode", false, true,
       "split-K decode on tensor cores: the G query rows ride in one mma; per-warp cp.async pipelines"},
      {10, "v10_split_by_batch", false, true,
       "v9 with each context split just enough to fill the GPU; from 16 sequences on, 1 split and no combine"},
      {11, "v11_cluster_combine", false, true,
       "v10 with a context's splits one thread-block cluster, merged in distributed shared memory: no combine"},
      {12, "v12_wgmma_prefill", true, false,
       "v5 on Hopper's warpgroup tensor cores: wgmma, B straight from shared memory, asynchronous (sm_90a)"},
  };
  return table;
}

int attention_version_for(AttentionPhase phase, int requested, const AttentionShape& shape) {
  const std::vector<AttentionVersion>& table = attention_versions();
  if (requested != kAttentionVersionDefault && (requested < 0 || requested >= int(table.size())))
    fail("attention version ", requested, " does not exist (0 to ", table.size() - 1, ", or ",
         kAttentionVersionDefault, " for the default)");
  if (shape.head_dim < 1 || shape.head_dim > 256)
    fail("head_dim ", shape.head_dim, " is not supported by the CUDA attention kernels (1 to 256)");
  const bool decode = phase == AttentionPhase::Decode;
  const int fallback = decode ? kDefaultDecodeVersion : kDefaultPrefillVersion;
  int version = requested == kAttentionVersionDefault ? fallback : requested;
  if (!(decode ? table[size_t(version)].decode : table[size_t(version)].prefill)) version = fallback;
  if (shape.num_kv_heads < 1 || shape.num_heads < 1 || shape.num_heads % shape.num_kv_heads != 0)
    fail("attention: ", shape.num_heads, " query heads do not make groups of ", shape.num_kv_heads, " KV heads");
  if (shape.block_size < 1) fail("attention: a KV block of ", shape.block_size, " tokens");
  // v1-v12 are instantiated for head dims 64 and 128; their decode kernels hold the G query heads of a
  // group as rows of one block, at most 8; v9-v11 copy 16-key tiles that must not cross a KV block, so
  // their block size is a multiple of 16 (the engine's, EngineConfig::validate). Anything else runs on v0,
  // which takes any shape.
  const int group = shape.num_heads / shape.num_kv_heads;
  const bool fast_shape = (shape.head_dim == 64 || shape.head_dim == 128) && (!decode || group <= 8);
  const bool whole_tiles = !decode || version < 9 || shape.block_size % 16 == 0;
  return fast_shape && whole_tiles ? version : 0;
}

}  // namespace nanovllm
