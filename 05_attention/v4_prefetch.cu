// v4_prefetch.cu: v3 with software prefetching: the next step's K/V are loaded into registers before
// this step computes, so the loads of step i + 1 overlap the arithmetic of step i.
//
// Idea:     in v2 and v3 a warp loads, waits, computes, loads again: while it computes it has nothing in
//           flight. Double-buffering in registers keeps one step of loads always outstanding.
// Adds:     k_next/v_next, a second set of 2 x kKeysPerGroup 16-byte values per lane (32 registers of data;
//           48 more in all by ptxas, 144 against v2's 96 at head_dim 128, group 2), and the swap at the end
//           of each step.
// Launch:   as v2 (grid (max_partitions, num_kv_heads, num_seqs), 128 threads, then the combine).
// Measured: see NOTES.md: slower than v2 on the H200. The extra registers cost two blocks of five per SM,
//           more warps in flight than the overlap gains; other warps were already hiding the latency.
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
namespace {

constexpr int kTableEntries = 64;  // as v3

// As attention_v2_split_k_kernel: block (partition, kv_head, seq) -> partial (m, l, O) of its G heads.
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) attention_v4_prefetch_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;
  const int seq = blockIdx.z, kv_head = blockIdx.y, partition = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);
  const int key_begin = partition * p.partition_size;
  const int key_end = min(r.seqlen_k, key_begin + p.partition_size);
  if (key_begin >= key_end) return;

  __shared__ int32_t sm_table[kTableEntries];  // (table_entries): as v3
  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  const int first_block = key_begin / p.block_size;
  const int table_entries = (key_end - 1) / p.block_size - first_block + 1;
  const bool staged = table_entries <= kTableEntries;
  if (staged)
    for (int i = threadIdx.x; i < table_entries; i += blockDim.x) sm_table[i] = block_table[first_block + i];
  __syncthreads();  // the staged table is complete before any warp reads it
  auto page_of = [&](int logical) { return staged ? sm_table[logical - first_block] : block_table[logical]; };

  float q[ROWS][8];
  int limit[ROWS];
  load_query_rows<HEAD_DIM, ROWS>(p, r, kv_head, 0, G, c, q, limit);
  RowStates<ROWS> st;
  st.init();

  int warp_base = key_begin + warp * L::GROUPS * kKeysPerGroup;
  uint4 k_now[kKeysPerGroup], v_now[kKeysPerGroup];
  if (warp_base < key_end)
    load_kv<HEAD_DIM>(p, page_of, warp_base + group * kKeysPerGroup, key_end, kv_head, c, k_now, v_now);
  for (; warp_base < key_end; warp_base += L::kStepKeys) {
    uint4 k_next[kKeysPerGroup], v_next[kKeysPerGroup];
    const bool more = warp_base + L::kStepKeys < key_end;  // the same for the whole warp
    if (more)
      load_kv<HEAD_DIM>(p, page_of, warp_base + L::kStepKeys + group * kKeysPerGroup, key_end, kv_head, c, k_next,
                        v_next);
    attend_keys<L::KG, ROWS>(st, q, limit, warp_base + group * kKeysPerGroup, key_end, k_now, v_now);
    if (more) {
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; u++) k_now[u] = k_next[u], v_now[u] = v_next[u];
    }
  }

  if (reduce_block<HEAD_DIM, ROWS>(st)) store_partials<HEAD_DIM, ROWS>(p, seq, st, kv_head, partition, c);
}

}  // namespace

void launch_v4_prefetch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(p.max_partitions), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, decode_rows(p.num_heads / p.num_kv_heads), [&](auto head_dim, auto rows) {
    attention_v4_prefetch_kernel<decltype(head_dim)::value, decltype(rows)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
  });
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
