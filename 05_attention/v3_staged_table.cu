// v3_staged_table.cu: v2 with the block's block-table entries staged in shared memory, so that a key's
// slot costs no global load on the critical path.
//
// Idea:     in v2 every step reads a block-table entry and only then can load K/V: two dependent memory
//           round trips per step. The entries of a partition are few (512 keys / 16-token blocks = 32),
//           so the block copies them into shared memory once, and a key's slot is a shared-memory read.
// Adds:     sm_table and one __syncthreads; a context whose entries do not fit reads the global table.
// Launch:   as v2 (grid (max_partitions, num_kv_heads, num_seqs), 128 threads, then the combine).
// Measured: see NOTES.md: slower than v2 on the H200. The entry is read by KG lanes at once and hits L1,
//           so staging saves little and adds a barrier. Kept as the record of what did not pay.
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
namespace {

constexpr int kTableEntries = 64;  // block-table entries staged per block: 512 keys / 16 + 1 = 33 at most

// As attention_v2_split_k_kernel: block (partition, kv_head, seq) -> partial (m, l, O) of its G heads.
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) attention_v3_staged_table_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;
  const int seq = blockIdx.z, kv_head = blockIdx.y, partition = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);
  const int key_begin = partition * p.partition_size;
  const int key_end = min(r.seqlen_k, key_begin + p.partition_size);
  if (key_begin >= key_end) return;

  // Stage the entries of logical blocks first_block .. the block of key_end - 1.
  __shared__ int32_t sm_table[kTableEntries];  // (table_entries): physical block of first_block + i
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

void launch_v3_staged_table(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(p.max_partitions), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, decode_rows(p.num_heads / p.num_kv_heads), [&](auto head_dim, auto rows) {
    attention_v3_staged_table_kernel<decltype(head_dim)::value, decltype(rows)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
  });
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
