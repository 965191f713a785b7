// gqa_tile.cuh: the pieces of the CUDA-core kernels v1_gqa, v2_split_k, v3_staged_table, v4_prefetch
// and v6_pipelined_decode, v7_head_major, v8_l2_prefetch. Read it with v1_gqa.cu, which introduces them.
//
// The unit of work of a thread block is a tile of ROWS "rows" that share one KV head, a row being (a query
// token, one of the G = num_heads / num_kv_heads query heads that read this KV head):
//   row -> token row / G, query head kv_head * G + row % G.
// In decode a block's rows are one query's G heads, so every K/V row is loaded once for all of them.
//
// Inside the block, kWarps = 4 warps split the keys. Inside a warp, KG = HEAD_DIM / 8 lanes read one K
// (or V) row with 16-byte loads: lane c of the key group holds dims [8c, 8c + 8). A warp thus reads
// GROUPS = 32 / KG keys per load instruction, each row fully coalesced, and each key group takes
// kKeysPerGroup consecutive keys per step (loads in flight). Worked numbers for HEAD_DIM 128: KG = 16
// lanes, GROUPS = 2, a step of the block covers 4 warps x 2 groups x 4 keys = 32 keys.
//
// Every key group keeps its own online-softmax state per row (RowStates, below; its update rule is
// softmax.cuh's); reduce_block merges the groups of a warp (shuffles) and then the warps (shared memory).
#pragma once

#include <type_traits>

#include "05_attention/kernels.cuh"
#include "05_attention/softmax.cuh"

namespace nanovllm {

constexpr int kWarps = 4;         // warps per block; they split the keys
constexpr int kKeysPerGroup = 4;  // keys a key group loads per step

template <int HEAD_DIM>
struct LaneLayout {
  static constexpr int KG = HEAD_DIM / 8;    // lanes per key row: 16 for head_dim 128
  static constexpr int GROUPS = 32 / KG;     // key groups per warp: 2 for head_dim 128
  static constexpr int kStepKeys = kWarps * GROUPS * kKeysPerGroup;  // keys per block step: 32 for 128
};

// One key group's online-softmax state for each of the tile's rows (softmax.cuh): m (base 2), l, and
// this lane's 8 dims of the unnormalised output O.
template <int ROWS>
struct RowStates {
  float m[ROWS], l[ROWS], O[ROWS][8];
  __device__ void init() {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
      for (int d = 0; d < 8; d++) O[r][d] = 0.0f;
    }
  }
};

// This lane's dims [8c, 8c + 8) of the query of each of the tile's rows first_row .. first_row +
// num_rows - 1, pre-multiplied by scale * log2(e), and each row's last visible key (causal, bottom-right:
// seqlen_k - seqlen_q + token). Spare rows (r >= num_rows) repeat the last row's query and get limit -1:
// they see no key and are never written.
template <int HEAD_DIM, int ROWS>
__device__ inline void load_query_rows(const AttentionParams& p, const SeqRange& seq, int kv_head, int first_row,
                                       int num_rows, int c, float (&q)[ROWS][8], int (&limit)[ROWS]) {
  const int G = p.num_heads / p.num_kv_heads;
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    const int row = first_row + min(r, num_rows - 1);
    const int token = row / G, head = kv_head * G + row % G;
    load_bf16x8(p.q + int64_t(seq.q_row0 + token) * p.q_stride + int64_t(head) * HEAD_DIM + 8 * c, q[r]);
#pragma unroll
    for (int d = 0; d < 8; d++) q[r][d] *= p.scale_log2;
    limit[r] = r < num_rows ? seq.seqlen_k - seq.seqlen_q + token : -1;
  }
}

// This lane's 16 bytes (8 dims) of the K and V rows of keys base .. base + kKeysPerGroup - 1, found
// through page_of(logical block) -> physical block. Keys at or past key_end load zeros, not garbage: a
// masked key's weight is 0, and 0 * NaN would be NaN.
template <int HEAD_DIM, class PageOf>
__device__ inline void load_kv(const AttentionParams& p, PageOf page_of, int base, int key_end, int kv_head, int c,
                               uint4 (&k_raw)[kKeysPerGroup], uint4 (&v_raw)[kKeysPerGroup]) {
  const int64_t kv_dim = int64_t(p.num_kv_heads) * HEAD_DIM;  // one token's K (or V) in the cache
  const int64_t head_offset = int64_t(kv_head) * HEAD_DIM + 8 * c;
#pragma unroll
  for (int u = 0; u < kKeysPerGroup; u++) {
    const int j = base + u;
    if (j < key_end) {
      const int logical = j / p.block_size;
      const int64_t slot = int64_t(page_of(logical)) * p.block_size + (j - logical * p.block_size);
      k_raw[u] = *reinterpret_cast<const uint4*>(p.k_cache + slot * kv_dim + head_offset);
      v_raw[u] = *reinterpret_cast<const uint4*>(p.v_cache + slot * kv_dim + head_offset);
    } else {
      k_raw[u] = v_raw[u] = make_uint4(0, 0, 0, 0);  // bf16 zeros
    }
  }
}

// The online-softmax step of every row over keys base .. base + kKeysPerGroup - 1 (this lane's 8 dims
// of each key's K and V, raw bf16). Keys are converted one at a time, so only 8 floats of K or V are live
// at once. Keys at or past key_end, or past a row's limit, are masked (weight 0). All 32 lanes of the warp
// call it together (full-mask shuffles).
template <int KG, int ROWS>
__device__ inline void attend_keys(RowStates<ROWS>& st, const float (&q)[ROWS][8], const int (&limit)[ROWS], int base,
                                   int key_end, const uint4 (&k_raw)[kKeysPerGroup],
                                   const uint4 (&v_raw)[kKeysPerGroup]) {
  float s[ROWS][kKeysPerGroup];  // scores, base 2
#pragma unroll
  for (int u = 0; u < kKeysPerGroup; u++) {
    float k[8];
    bf16x8_to_float(k_raw[u], k);
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      float dot = 0.0f;
#pragma unroll
      for (int d = 0; d < 8; d++) dot += q[r][d] * k[d];
      // Sum over the KG lanes of this key group (xor offsets below KG stay inside the group).
#pragma unroll
      for (int offset = KG / 2; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      s[r][u] = (base + u < key_end && base + u <= limit[r]) ? dot : -INFINITY;
    }
  }
  float weight[ROWS][kKeysPerGroup];  // exp2(s - m_new): the P of the paper
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    float m_new = st.m[r];
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; u++) m_new = fmaxf(m_new, s[r][u]);
    const float alpha = online_softmax_rescale(st.m[r], m_new);
    st.l[r] *= alpha;
#pragma unroll
    for (int d = 0; d < 8; d++) st.O[r][d] *= alpha;
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; u++) {
      weight[r][u] = m_new == -INFINITY ? 0.0f : exp2f(s[r][u] - m_new);  // 0 for masked keys
      st.l[r] += weight[r][u];
    }
    st.m[r] = m_new;
  }
#pragma unroll
  for (int u = 0; u < kKeysPerGroup; u++) {
    float v[8];
    bf16x8_to_float(v_raw[u], v);
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
      for (int d = 0; d < 8; d++) st.O[r][d] += weight[r][u] * v[d];
  }
}

// Merges the key groups of each warp (lanes with the same c hold the same dims), then the kWarps warps
// through shared memory. Returns true in the lanes that hold the block's merged state: warp 0, lanes
// c = 0 .. KG - 1, each with its 8 dims. Every thread of the block must call it, at most once a block: no
// barrier follows warp 0's reads of sm_*, so a second call could let warps 1-3 overwrite them meanwhile.
template <int HEAD_DIM, int ROWS>
__device__ inline bool reduce_block(RowStates<ROWS>& st) {
  constexpr int KG = LaneLayout<HEAD_DIM>::KG;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = lane % KG;
#pragma unroll
  for (int offset = KG; offset < 32; offset <<= 1) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      const float m_b = __shfl_xor_sync(0xffffffffu, st.m[r], offset);
      const float l_b = __shfl_xor_sync(0xffffffffu, st.l[r], offset);
      float O_b[8];
#pragma unroll
      for (int d = 0; d < 8; d++) O_b[d] = __shfl_xor_sync(0xffffffffu, st.O[r][d], offset);
      online_softmax_merge(st.m[r], st.l[r], st.O[r], m_b, l_b, O_b);
    }
  }
  // Each warp's merged state: (kWarps, ROWS) for m and l, (kWarps, ROWS, HEAD_DIM) for O: 16 KB at 8 rows
  // and head_dim 128, the static shared memory NOTES.md's register table lists for v1-v4 at that shape.
  __shared__ float sm_m[kWarps][ROWS], sm_l[kWarps][ROWS], sm_O[kWarps][ROWS][HEAD_DIM];
  if (lane < KG) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      if (lane == 0) sm_m[warp][r] = st.m[r], sm_l[warp][r] = st.l[r];
#pragma unroll
      for (int d = 0; d < 8; d++) sm_O[warp][r][8 * c + d] = st.O[r][d];
    }
  }
  __syncthreads();  // every warp's state is in shared memory before warp 0 reads them
  if (warp != 0) return false;
  for (int w = 1; w < kWarps; w++) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      float O_b[8];
#pragma unroll
      for (int d = 0; d < 8; d++) O_b[d] = sm_O[w][r][8 * c + d];
      online_softmax_merge(st.m[r], st.l[r], st.O[r], sm_m[w][r], sm_l[w][r], O_b);
    }
  }
  return lane < KG;
}

// Writes rows first_row .. first_row + num_rows - 1 of the tile, normalised (O / l; a row without keys,
// a decode padding row, writes zeros). Called by the lanes reduce_block returned true in.
template <int HEAD_DIM, int ROWS>
__device__ inline void store_rows(const AttentionParams& p, const SeqRange& seq, const RowStates<ROWS>& st,
                                  int kv_head, int first_row, int num_rows, int c) {
  const int G = p.num_heads / p.num_kv_heads;
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    if (r >= num_rows) break;
    const int row = first_row + r, token = row / G, head = kv_head * G + row % G;
    const float inv_l = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
    float o[8];
#pragma unroll
    for (int d = 0; d < 8; d++) o[d] = st.O[r][d] * inv_l;
    store_bf16x8(p.out + int64_t(seq.q_row0 + token) * p.out_stride + int64_t(head) * HEAD_DIM + 8 * c, o);
  }
}

// Split-K decode: writes the tile's G rows (one query's heads) as partition `partition`'s unnormalised
// partial results, which decode_combine_kernel (v2_split_k.cu) merges. Called by the lanes reduce_block
// returned true in (lane c holds dims 8 c .. 8 c + 7; c == 0 also writes m and l); ROWS >= G.
template <int HEAD_DIM, int ROWS>
__device__ inline void store_partials(const AttentionParams& p, int seq, const RowStates<ROWS>& st, int kv_head,
                                      int partition, int c) {
  const int G = p.num_heads / p.num_kv_heads;
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    if (r >= G) break;
    const int head = kv_head * G + r;
    const int64_t idx = (int64_t(seq) * p.num_heads + head) * p.max_partitions + partition;
    if (c == 0) p.part_m[idx] = st.m[r], p.part_l[idx] = st.l[r];
#pragma unroll
    for (int d = 0; d < 8; d++) p.part_O[idx * HEAD_DIM + 8 * c + d] = st.O[r][d];
  }
}

// Rows per decode block: the GQA group size rounded up to a power of two (1, 2, 4 or 8).
inline int decode_rows(int group) {
  int rows = 1;
  while (rows < group) rows *= 2;
  return rows;
}

// Calls f(std::integral_constant<int, HEAD_DIM>, std::integral_constant<int, ROWS>) for the runtime pair:
// the one place the CUDA-core versions turn head_dim (64, 128) and rows (1, 2, 4, 8) into template
// arguments.
template <class F>
void with_head_dim_and_rows(int head_dim, int rows, F&& f) {
  auto with_rows = [&](auto hd) {
    switch (rows) {
      case 1: f(hd, std::integral_constant<int, 1>()); break;
      case 2: f(hd, std::integral_constant<int, 2>()); break;
      case 4: f(hd, std::integral_constant<int, 4>()); break;
      case 8: f(hd, std::integral_constant<int, 8>()); break;
      default: fail("internal: unsupported rows ", rows);
    }
  };
  if (head_dim == 64) with_rows(std::integral_constant<int, 64>());
  else if (head_dim == 128) with_rows(std::integral_constant<int, 128>());
  else fail("internal: the CUDA-core attention kernels take head_dim 64 or 128, not ", head_dim);
}

}  // namespace nanovllm
