// v8_l2_prefetch.cu: v2's split-K decode, with each warp asking L2 for the K/V rows of its next step
// while it computes this one.
//
// Idea:     a decode kernel is fast when enough bytes are on their way from DRAM at every moment. In v2 a
//           warp's loads are in flight only between its load and its first use of the data; while the
//           warp computes, it asks for nothing, and v2's 96 registers leave room for 5 blocks per SM. v4
//           tried to load the next step into registers early and lost two of those blocks to the
//           registers that held it (144 a thread: 3 blocks). A prefetch into L2 (PTX
//           `prefetch.global.L2`) holds no register and has no result to wait for: the warp names the
//           cache lines of its next step, DRAM starts on them, and the real loads one step later find
//           them in L2 (a few hundred cycles instead of a DRAM round trip under load).
// Adds:     prefetch_next_step: each lane names one 128-byte line of the warp's next step. A warp step
//           reads GROUPS x kKeysPerGroup keys x (K, V) x HEAD_DIM x 2 bytes = 4,096 bytes for any head
//           dim (8 keys of 512 B at head_dim 128; 16 keys of 256 B at 64): exactly 32 lines.
// Launch:   as v2: grid (max_partitions, num_kv_heads, num_seqs), 128 threads; then v2's combine.
// Measured: see NOTES.md.
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
namespace {

// Lane `lane` of a warp asks L2 for its line of the warp step that starts at key warp_base: lines go
// key by key, K before V, kLinesPerRow per row (HEAD_DIM * 2 bytes / 128). Keys at or past key_end
// are not fetched.
template <int HEAD_DIM, class PageOf>
__device__ inline void prefetch_next_step(const AttentionParams& p, PageOf page_of, int warp_base, int key_end,
                                          int kv_head, int lane) {
  constexpr int kLinesPerRow = HEAD_DIM * 2 / 128;  // 2 at head_dim 128, 1 at 64
  const int key = warp_base + lane / (2 * kLinesPerRow);
  const bool is_v = (lane / kLinesPerRow) % 2 == 1;
  const int line = lane % kLinesPerRow;
  if (key >= key_end) return;
  const int logical = key / p.block_size;
  const int64_t slot = int64_t(page_of(logical)) * p.block_size + (key - logical * p.block_size);
  const bf16* row = (is_v ? p.v_cache : p.k_cache) + slot * p.num_kv_heads * HEAD_DIM + kv_head * HEAD_DIM;
  asm volatile("prefetch.global.L2 [%0];" ::"l"(row + line * 64));
}

// Block (partition, kv_head, seq): as attention_v2_split_k_kernel, plus the prefetch.
// The prefetch's address arithmetic would take v2's 96 registers to 118 (4 blocks per SM instead of 5);
// the launch bound holds the small-group shapes at v2's 5 blocks per SM, without spills.
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32, ROWS <= 2 ? 5 : 1) attention_v8_l2_prefetch_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;  // this lane: key group, and dims [8c, 8c + 8)
  const int seq = blockIdx.z, kv_head = blockIdx.y, partition = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);

  const int key_begin = partition * p.partition_size;
  const int key_end = min(r.seqlen_k, key_begin + p.partition_size);
  if (key_begin >= key_end) return;

  float q[ROWS][8];
  int limit[ROWS];
  load_query_rows<HEAD_DIM, ROWS>(p, r, kv_head, 0, G, c, q, limit);
  RowStates<ROWS> st;
  st.init();

  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  auto page_of = [&](int logical) { return block_table[logical]; };
  const int first = key_begin + warp * L::GROUPS * kKeysPerGroup;
  for (int warp_base = first; warp_base < key_end; warp_base += L::kStepKeys) {
    prefetch_next_step<HEAD_DIM>(p, page_of, warp_base + L::kStepKeys, key_end, kv_head, lane);
    const int base = warp_base + group * kKeysPerGroup;
    uint4 k_raw[kKeysPerGroup], v_raw[kKeysPerGroup];
    load_kv<HEAD_DIM>(p, page_of, base, key_end, kv_head, c, k_raw, v_raw);
    attend_keys<L::KG, ROWS>(st, q, limit, base, key_end, k_raw, v_raw);
  }

  if (reduce_block<HEAD_DIM, ROWS>(st)) store_partials<HEAD_DIM, ROWS>(p, seq, st, kv_head, partition, c);
}

}  // namespace

void launch_v8_l2_prefetch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(p.max_partitions), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, decode_rows(p.num_heads / p.num_kv_heads), [&](auto head_dim, auto rows) {
    attention_v8_l2_prefetch_kernel<decltype(head_dim)::value, decltype(rows)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
  });
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
