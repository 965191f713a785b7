// v1_gqa.cu: a thread block per (sequence, KV head), so the query heads that share a KV head share its
// loads; the first kernel on the memory system's terms. The tile machinery lives in gqa_tile.cuh.
//
// Idea:     v0 reads every K/V row once per query head, and G = num_heads / num_kv_heads heads read the
//           same KV head (G = 2 for Qwen3-0.6B): G times the bytes that are needed. Here a block takes a
//           tile of ROWS rows that share one KV head (decode: one query's G heads; prefill: ROWS
//           consecutive (token, head) rows), and each K/V row it loads serves all of them.
// Adds:     GQA sharing of every K/V load; 16-byte loads (KG = head_dim / 8 lanes per key row); 4 warps
//           and their key groups split the keys, each with its own online softmax, merged at the end
//           (gqa_tile.cuh: load_kv, attend_keys, reduce_block).
// Launch:   grid (ceil(max_seqlen_q * G / ROWS), num_kv_heads, num_seqs), 128 threads; ROWS = 8 in prefill,
//           G rounded up to a power of two in decode (at most 8). One block covers a whole context: a
//           batch of a few long sequences leaves most of the GPU idle, which v2 fixes.
// Measured: see NOTES.md.
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
namespace {

constexpr int kPrefillRows = 8;  // (token, head) rows per prefill block

// Block (x, kv_head, seq): rows x * ROWS .. of sequence seq that read KV head kv_head -> their out rows,
// attention over each row's visible keys, all read through the block table.
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) attention_v1_gqa_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;  // this lane: key group, and dims [8c, 8c + 8)
  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);

  // Which rows, which keys: the tile's last row sees the most keys (causal, bottom-right).
  const int first_row = blockIdx.x * ROWS;
  if (first_row >= r.seqlen_q * G) return;  // past this sequence's rows
  const int num_rows = min(ROWS, r.seqlen_q * G - first_row);
  const int key_end = r.seqlen_k - r.seqlen_q + (first_row + num_rows - 1) / G + 1;

  float q[ROWS][8];  // this lane's 8 dims of each row's query, times scale * log2(e)
  int limit[ROWS];   // each row's last visible key
  load_query_rows<HEAD_DIM, ROWS>(p, r, kv_head, first_row, num_rows, c, q, limit);
  RowStates<ROWS> st;
  st.init();

  // Load, then compute: the block-table entry is read right before each key's K/V, so every step waits
  // for two memory round trips, and nothing is in flight while it computes.
  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  auto page_of = [&](int logical) { return block_table[logical]; };
  // The loop bound is the warp's first key, the same for all its lanes: attend_keys shuffles.
  for (int warp_base = warp * L::GROUPS * kKeysPerGroup; warp_base < key_end; warp_base += L::kStepKeys) {
    const int base = warp_base + group * kKeysPerGroup;  // this key group's first key
    uint4 k_raw[kKeysPerGroup], v_raw[kKeysPerGroup];
    load_kv<HEAD_DIM>(p, page_of, base, key_end, kv_head, c, k_raw, v_raw);
    attend_keys<L::KG, ROWS>(st, q, limit, base, key_end, k_raw, v_raw);
  }

  if (reduce_block<HEAD_DIM, ROWS>(st)) store_rows<HEAD_DIM, ROWS>(p, r, st, kv_head, first_row, num_rows, c);
}

}  // namespace

void launch_v1_gqa(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const bool decode = p.cu_seqlens_q == nullptr;
  const int G = p.num_heads / p.num_kv_heads, rows = decode ? decode_rows(G) : kPrefillRows;
  const dim3 grid(unsigned((dims.max_seqlen_q * G + rows - 1) / rows), unsigned(p.num_kv_heads),
                  unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, rows, [&](auto head_dim, auto num_rows) {
    attention_v1_gqa_kernel<decltype(head_dim)::value, decltype(num_rows)::value><<<grid, kWarps * 32, 0, stream>>>(p);
  });
}

}  // namespace nanovllm
