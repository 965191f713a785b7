// v7_head_major.cu: v2's split-K decode with the grid in another order: the KV heads of one stretch of
// context side by side.
//
// Idea:     the cache is (blocks, block_size, kv_heads, head_dim): one token's K is num_kv_heads rows of
//           head_dim bf16 back to back (8 x 256 B = 2 KB for Qwen3-0.6B), and a v2 block reads one of
//           them, 256 B out of every 2 KB. v2's grid runs partition-fastest, so the blocks on the GPU at
//           one moment read the same KV head of many token ranges: 256-byte pieces scattered over the
//           cache. Here the grid runs head-fastest: consecutive blocks read the 8 heads of the same
//           tokens, together the whole 2 KB rows, so the memory the GPU reads at one moment is
//           contiguous (DRAM pages are opened once for all the heads rather than once per head).
// Adds:     nothing to the kernel but which block index means what (blockIdx.x: KV head, y: partition).
// Launch:   grid (num_kv_heads, max_partitions, num_seqs), 128 threads; then v2's combine.
// Measured: see NOTES.md.
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
namespace {

// Block (kv_head, partition, seq): as attention_v2_split_k_kernel, with the first two indices swapped.
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) attention_v7_head_major_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;  // this lane: key group, and dims [8c, 8c + 8)
  const int seq = blockIdx.z, partition = blockIdx.y, kv_head = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);  // decode: one query, seqlen_k = context_lens[seq]

  const int key_begin = partition * p.partition_size;
  const int key_end = min(r.seqlen_k, key_begin + p.partition_size);
  if (key_begin >= key_end) return;  // past this sequence's context (or a padding row, context 0)

  float q[ROWS][8];
  int limit[ROWS];
  load_query_rows<HEAD_DIM, ROWS>(p, r, kv_head, 0, G, c, q, limit);
  RowStates<ROWS> st;
  st.init();

  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  auto page_of = [&](int logical) { return block_table[logical]; };
  for (int warp_base = key_begin + warp * L::GROUPS * kKeysPerGroup; warp_base < key_end;
       warp_base += L::kStepKeys) {
    const int base = warp_base + group * kKeysPerGroup;
    uint4 k_raw[kKeysPerGroup], v_raw[kKeysPerGroup];
    load_kv<HEAD_DIM>(p, page_of, base, key_end, kv_head, c, k_raw, v_raw);
    attend_keys<L::KG, ROWS>(st, q, limit, base, key_end, k_raw, v_raw);
  }

  if (reduce_block<HEAD_DIM, ROWS>(st)) store_partials<HEAD_DIM, ROWS>(p, seq, st, kv_head, partition, c);
}

}  // namespace

void launch_v7_head_major(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(p.num_kv_heads), unsigned(p.max_partitions), unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, decode_rows(p.num_heads / p.num_kv_heads), [&](auto head_dim, auto rows) {
    attention_v7_head_major_kernel<decltype(head_dim)::value, decltype(rows)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
  });
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
