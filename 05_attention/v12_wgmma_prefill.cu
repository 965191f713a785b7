// v12_wgmma_prefill.cu: v5's prefill on Hopper's warpgroup tensor cores (wgmma, sm_90a).
//
// Idea:     v5 multiplies with mma.sync, a 16 x 8 x 16 product per warp instruction whose operands each
//           lane first reads from shared memory into registers (ldmatrix). wgmma is Hopper's larger
//           product: the 4 warps of a warpgroup issue one 64 x N x 16 product together, its B operand read
//           by the tensor cores straight from shared memory, and it runs asynchronously (issued, committed,
//           waited for). The algorithm is v5's, step for step: the same tiles, rows, causal mask, online
//           softmax and output; the two products change, and so does how a tile's keys are found.
// Adds:     over v5: the block's 4 warps are one warpgroup. S = Q K^T is 8 (head_dim 128) wgmma m64n64k16,
//           A = Q from registers (v5's fragments, which are wgmma's register layout too), B = K from shared
//           memory; O += P V is 4 wgmma m64n{head_dim}k16, A = P from S's registers as in v5, B = V from
//           shared memory read transposed (its rows are keys, the product's k). No ldmatrix. The K and V
//           tiles are stored in wgmma's 128-byte swizzle (01_sequence/base/ptx.cuh, wgmma_descriptor):
//           each tile as head_dim / 64 blocks of (64 keys x 64 dims), 128 bytes a row; cp.async still
//           copies them through the block table, and a proxy fence makes its writes visible to the tensor
//           cores, which read shared memory through another path than the threads' loads and stores. When
//           the cache's blocks hold whole tiles (block_size a multiple of 64: nano-vllm's 256), a tile's
//           keys are consecutive slots, found with one block-table read instead of one per key.
// Launch:   v5's grid and order, 128 threads (one warpgroup), dynamic shared memory 4 tiles (K x 2, V x 2:
//           64 KB at head_dim 128) + 1 KB to align them to 1,024 bytes; at most 168 registers a thread (3
//           blocks an SM). Head dims 64 and 128. On a GPU without wgmma (or code not built for sm_90a) the
//           launcher runs v5 instead (launch_v12_wgmma_prefill, below).
// Measured: `attention prefill` over bench.py's workload 92 ms (v5) -> 62 ms; 76 ms without the one
//           read per tile, 72 ms at two blocks an SM (NOTES.md, "v12: prefill on wgmma"); whole tiles
//           copied with one address a thread, 66.5 -> 52.8 ms in the eager profile, the last tile too,
//           51.1 -> 50.5 ms; the softmax's exponentials with denormals flushed (exp2_ftz), 49.7-50.1 ->
//           47.6-47.9 ms (NOTES.md).
//
// ---------------------------------------------------------------------------------------------------
// The products (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"). Thread t of the
// warpgroup is lane t % 32 of warp t / 32, and with g = lane / 4, t4 = lane % 4 as in v5:
//   D (64 x N, fp32): d[i] is row 16 warp + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 t4 + i % 2: per warp,
//     v5's C fragments of n-tiles 0, 1, ... one after another (d[4 n + e] is v5's S[n][e] or O[n][e]).
//   A (64 x 16, bf16) from registers: 4 registers, per warp v5's A fragment of its 16 rows.
//   B (N x 16) from shared memory through a descriptor:
//     K for S = Q K^T: n = key, k = dim; K's (key, dim) tile has dims contiguous, "K-major", read as it
//       is. Dims 16 kk .. of every key: block kk / 4 (64 dims each), 32 (kk % 4) bytes into its rows.
//     V for O = P V: k = key, n = dim; V's (key, dim) tile has the product's n contiguous, "MN-major",
//       read transposed (the instruction's imm-trans-b = 1). Keys 16 kk ..: 16 rows of 128 bytes on,
//       2,048 kk bytes; the leading byte offset steps to the next 64 dims (the next block, 8 KB on).
#include "05_attention/kernels.cuh"
#include "01_sequence/base/ptx.cuh"
#include "05_attention/softmax.cuh"

namespace nanovllm {
namespace {

constexpr int kBr = 64;          // rows per block: one warpgroup's 64, 16 per warp (v5's)
constexpr int kBc = 64;          // keys per KV tile
constexpr int kThreads = 128;    // 4 warps: one warpgroup
constexpr int kBlocksPerSm = 3;  // at most 168 registers a thread (no spill since the whole-tile copies), as v5

// The device code below exists in the sm_90a pass only (and in the host pass, which never calls it): the
// passes for other GPUs compile the kernel empty, and wgmma_prefill_available keeps the dispatch from it.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kTileBlockBytes = kBc * 128;  // one (64 keys x 64 dims) block of a tile: 8 KB

// Byte offset of chunk `chunk` (16 bytes, dims 8 chunk ..) of key `row` in a tile stored as wgmma's
// 128-byte swizzle: block chunk / 8 (64 dims), row `row` of it, chunk chunk % 8 swizzled by row % 8.
__device__ inline uint32_t tile_offset(int row, int chunk) {
  return uint32_t((chunk / 8) * kTileBlockBytes + row * 128 + (((chunk % 8) ^ (row % 8)) * 16));
}

// K/V tile t (keys 64 t .. 64 t + 63) of KV head kv_head into the K and V tiles at shared addresses sK and
// sV (HEAD_DIM / 64 blocks each), by all 128 threads with 16-byte cp.async (v5's copies, into wgmma's
// layout). Keys past key_end are zeros. When the cache's blocks hold whole tiles (block_size a multiple of
// 64, as nano-vllm's 256), a tile's keys are consecutive slots of one block: one block-table read, and one
// address a thread. Otherwise element i = threadIdx.x + 128 k is key i / CHUNKS, chunk i % CHUNKS, each
// key's slot read from the block table.
template <int HEAD_DIM>
__device__ inline void load_kv_tile(const AttentionParams& p, const int32_t* block_table, int kv_head, int key_end,
                                    int t, uint32_t sK, uint32_t sV) {
  constexpr int CHUNKS = HEAD_DIM / 8;
  const int64_t kv_dim = int64_t(p.num_kv_heads) * HEAD_DIM;
  if (p.block_size % kBc == 0) {
    // The tile's keys are slots first_slot .. first_slot + 63 of one cache block. A thread's elements are one
    // chunk of keys row0, row0 + kRowsPerPass, ...: one address worked out, then fixed steps in the cache and
    // in the tile (the swizzle depends on the row only through row % 8, which the steps keep). A short
    // prompt's blocks spend most of their issue slots on integer work, and this was most of it (NOTES.md,
    // "v12's copies of whole tiles with one address a thread"). In the tile that holds key_end - 1 the keys
    // from key_end on are zero-filled: their slots are in the same cache block, so the addresses stay
    // inside the cache, and a copy of size 0 reads nothing from them.
    constexpr int kRowsPerPass = kThreads / CHUNKS;
    static_assert(kRowsPerPass % 8 == 0, "a thread's keys must share their swizzle");
    const int row0 = threadIdx.x / CHUNKS, chunk = threadIdx.x % CHUNKS;
    const int64_t first_slot = key_slot(block_table, t * kBc, p.block_size);  // t * kBc < key_end
    const int valid_rows = key_end - t * kBc;  // kBc or more in every tile but the last
    const int64_t offset = (first_slot + row0) * kv_dim + int64_t(kv_head) * HEAD_DIM + 8 * chunk;
    const uint32_t dst = tile_offset(row0, chunk);
#pragma unroll
    for (int k = 0; k < kBc / kRowsPerPass; k++) {
      const bool valid = row0 + k * kRowsPerPass < valid_rows;
      cp_async_16(sK + dst + uint32_t(k * kRowsPerPass * 128), p.k_cache + offset + k * kRowsPerPass * kv_dim, valid);
      cp_async_16(sV + dst + uint32_t(k * kRowsPerPass * 128), p.v_cache + offset + k * kRowsPerPass * kv_dim, valid);
    }
    return;
  }
  // Tiles whose keys may straddle the cache's blocks: key by key.
#pragma unroll 4
  for (int i = threadIdx.x; i < kBc * CHUNKS; i += kThreads) {
    const int row = i / CHUNKS, chunk = i % CHUNKS, j = t * kBc + row;
    const bool valid = j < key_end;
    int64_t offset = 0;  // a key past key_end reads nothing (zero-filled)
    if (valid) {
      const int64_t slot = key_slot(block_table, j, p.block_size);
      offset = slot * kv_dim + int64_t(kv_head) * HEAD_DIM + 8 * chunk;
    }
    const uint32_t dst = tile_offset(row, chunk);
    cp_async_16(sK + dst, p.k_cache + offset, valid);
    cp_async_16(sV + dst, p.v_cache + offset, valid);
  }
}

// What a block (x, kv_head, seq) works on: row tile gridDim.x - 1 - x (v5's order, the
// heaviest first) of sequence seq's (token, head) rows that read KV head kv_head.
struct RowTile {
  SeqRange r;
  int G, kv_head, num_rows, first_row;
  int key_end;    // keys any row of the tile sees: 0 .. key_end - 1
  int full_keys;  // keys every row of the tile sees
  int num_kv_tiles;
  const int32_t* block_table;
};

// Whether the block has rows (a block past its sequence's rows returns whole: every thread, so no wgmma
// is left waiting for part of the warpgroup).
__device__ inline bool row_tile_of_block(const AttentionParams& p, RowTile& b) {
  b.r = seq_range(p, blockIdx.z);
  b.G = p.num_heads / p.num_kv_heads, b.kv_head = blockIdx.y;
  b.num_rows = b.r.seqlen_q * b.G;
  b.first_row = (gridDim.x - 1 - blockIdx.x) * kBr;
  if (b.first_row >= b.num_rows) return false;
  const int causal_offset = b.r.seqlen_k - b.r.seqlen_q, last_row = min(b.first_row + kBr, b.num_rows) - 1;
  b.key_end = causal_offset + last_row / b.G + 1;
  b.full_keys = causal_offset + b.first_row / b.G + 1;
  b.num_kv_tiles = (b.key_end + kBc - 1) / kBc;
  b.block_table = p.block_tables + int64_t(blockIdx.z) * p.block_table_width;
  return true;
}

// This lane's state for its two rows of its warp's 16 (the fragments' g and g + 8): block rows
// 16 warp + g + 8 h.
struct LaneRows {
  int g, t4;
  int limit[2];   // each row's last visible key; rows past num_rows copy the last real row's
  float m[2];     // running max of the scores (base 2)
  float l[2];     // this lane's part of the row sums (the quad adds up at the end)
};

__device__ inline LaneRows lane_rows(const RowTile& b) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LaneRows rows;
  rows.g = lane / 4, rows.t4 = lane % 4;
  const int causal_offset = b.r.seqlen_k - b.r.seqlen_q;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    rows.limit[h] = causal_offset + min(b.first_row + warp * 16 + rows.g + 8 * h, b.num_rows - 1) / b.G;
    rows.m[h] = -INFINITY, rows.l[h] = 0.0f;
  }
  return rows;
}

// Q's A fragments from memory (v5's "Q"), one per 16 dims: wgmma's A-from-registers layout is mma.sync's,
// per warp of 16 rows. Rows past the sequence's rows are zeros.
template <int HEAD_DIM>
__device__ inline void load_q_fragments(const AttentionParams& p, const RowTile& b, const LaneRows& rows,
                                        uint32_t (&q_frag)[HEAD_DIM / 16][4]) {
  const int warp = threadIdx.x / 32;
  const uint32_t* q_rows[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int q_row = b.first_row + warp * 16 + rows.g + 8 * h;
    q_rows[h] = q_row < b.num_rows ? reinterpret_cast<const uint32_t*>(
                                         p.q + int64_t(b.r.q_row0 + q_row / b.G) * p.q_stride +
                                         int64_t(b.kv_head * b.G + q_row % b.G) * HEAD_DIM + 2 * rows.t4)
                                   : nullptr;
  }
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; kk++)
#pragma unroll
    for (int e = 0; e < 4; e++)  // a0: row g, dims 16 kk + 2 t4; a1: row g + 8; a2, a3: dims + 8
      q_frag[kk][e] = q_rows[e % 2] ? q_rows[e % 2][(16 * kk + 8 * (e / 2)) / 2] : 0u;
}

// The causal mask and the online softmax of KV tile t on S (64 rows x 64 keys, S[4 n + e] is row g + 8
// (e / 2), key 64 t + 8 n + 2 t4 + e % 2), as v5: S becomes P = exp2(S scale log2(e) - m) in place, the
// rows' m and l move on, and alpha[h] is what row h's O must be multiplied by before P V is added.
__device__ inline void softmax_tile(const AttentionParams& p, const RowTile& b, LaneRows& rows, int t,
                                    float (&S)[kBc / 2], float (&alpha)[2]) {
  const int key0 = t * kBc;
  if (key0 + kBc > b.full_keys) {  // only tiles that cross the diagonal (keys past key_end are past every limit)
#pragma unroll
    for (int n = 0; n < kBc / 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (key0 + 8 * n + 2 * rows.t4 + e % 2 > rows.limit[e / 2]) S[4 * n + e] = -INFINITY;
  }
  float m_use[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {  // a row's 64 scores are spread over the 4 lanes of a quad
    float row_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kBc / 8; n++) row_max = fmaxf(row_max, fmaxf(S[4 * n + 2 * h], S[4 * n + 2 * h + 1]));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
    const float m_new = fmaxf(rows.m[h], row_max * p.scale_log2);
    alpha[h] = online_softmax_rescale(rows.m[h], m_new);
    rows.m[h] = m_new;
    m_use[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: exp2(-inf - 0) = 0, not NaN
    rows.l[h] *= alpha[h];
  }
#pragma unroll
  for (int i = 0; i < kBc / 2; i++) {
    S[i] = exp2_ftz(fmaf(S[i], p.scale_log2, -m_use[(i / 2) % 2]));  // 1 instruction, where exp2f is 4
    rows.l[(i / 2) % 2] += S[i];
  }
}

// O (64 rows x HEAD_DIM, O[4 n + e] of row g + 8 (e / 2)) *= alpha of its row.
template <int HEAD_DIM>
__device__ inline void rescale(float (&O)[HEAD_DIM / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; i++) O[i] *= alpha[(i / 2) % 2];
}

// P's A fragment for keys 16 kk .. 16 kk + 15 (v5's "P"): S's n-tiles 2 kk and 2 kk + 1, packed to bf16.
__device__ inline void p_fragment(const float (&S)[kBc / 2], int kk, uint32_t (&a)[4]) {
  a[0] = pack_bf16x2(S[8 * kk], S[8 * kk + 1]), a[1] = pack_bf16x2(S[8 * kk + 2], S[8 * kk + 3]);
  a[2] = pack_bf16x2(S[8 * kk + 4], S[8 * kk + 5]), a[3] = pack_bf16x2(S[8 * kk + 6], S[8 * kk + 7]);
}

// out = O / l, the row sums first added over the quad. Every real row saw key 0, so l > 0.
template <int HEAD_DIM>
__device__ inline void store_out(const AttentionParams& p, const RowTile& b, LaneRows& rows,
                                 const float (&O)[HEAD_DIM / 2]) {
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    rows.l[h] += __shfl_xor_sync(0xffffffffu, rows.l[h], 1);
    rows.l[h] += __shfl_xor_sync(0xffffffffu, rows.l[h], 2);
    const int row = b.first_row + warp * 16 + rows.g + 8 * h;
    if (row >= b.num_rows) continue;
    const float inv_l = 1.0f / rows.l[h];
    bf16* out = p.out + int64_t(b.r.q_row0 + row / b.G) * p.out_stride + int64_t(b.kv_head * b.G + row % b.G) * HEAD_DIM;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; n++)  // dims 8 n + 2 t4 + {0, 1}
      *reinterpret_cast<uint32_t*>(out + 8 * n + 2 * rows.t4) =
          pack_bf16x2(O[4 * n + 2 * h] * inv_l, O[4 * n + 2 * h + 1] * inv_l);
  }
}

// The threads' cp.async writes to shared memory reach the tensor cores, which read it through the
// asynchronous path, only after this fence by each writing thread (PTX ISA, "Proxies") and a barrier after it.
__device__ inline void fence_copies_for_wgmma() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define NANOVLLM_D8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

// d (64 x N, fp32) (+)= a (64 x 16, bf16, registers) b (from shared memory through descriptor `b`), where
// B is K-major (trans_b 0: B's k contiguous) or MN-major (trans_b 1). accumulate = false: d = a b. All
// 128 threads of the warpgroup issue it together; it only starts the product (commit_group / wait_group).
template <int N, int TRANS_B>
__device__ inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, bool accumulate);

template <>
__device__ inline void wgmma_rs<64, 0>(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : NANOVLLM_D8(0), NANOVLLM_D8(8), NANOVLLM_D8(16), NANOVLLM_D8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}

template <>
__device__ inline void wgmma_rs<64, 1>(float (&d)[32], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : NANOVLLM_D8(0), NANOVLLM_D8(8), NANOVLLM_D8(16), NANOVLLM_D8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}

template <>
__device__ inline void wgmma_rs<128, 1>(float (&d)[64], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : NANOVLLM_D8(0), NANOVLLM_D8(8), NANOVLLM_D8(16), NANOVLLM_D8(24), NANOVLLM_D8(32), NANOVLLM_D8(40),
        NANOVLLM_D8(48), NANOVLLM_D8(56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(int(accumulate)));
}
#undef NANOVLLM_D8

// Before a wgmma reads registers this thread wrote (its A fragments, or accumulators it rescaled).
__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the group of wgmma this warpgroup issued since the last commit.
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N of the warpgroup's committed groups are still running.
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Issues S = Q K^T for one KV tile (64 rows x 64 keys; sK: the tile's K in shared memory): HEAD_DIM / 16
// products of 16 dims, block kk / 4 of the tile, 32 (kk % 4) bytes into its rows. Not committed.
template <int HEAD_DIM>
__device__ inline void issue_scores(float (&S)[kBc / 2], const uint32_t (&q_frag)[HEAD_DIM / 16][4], uint32_t sK) {
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; kk++)
    wgmma_rs<kBc, 0>(S, q_frag[kk], wgmma_descriptor(sK + uint32_t((kk / 4) * kTileBlockBytes + 32 * (kk % 4))),
                     kk > 0);
}

// Issues O += P V for one KV tile (sV: its V in shared memory, read transposed): kBc / 16 products of 16
// keys, 2,048 kk bytes on; the leading byte offset steps from one 64-dim block to the next. Not committed.
template <int HEAD_DIM>
__device__ inline void issue_pv(float (&O)[HEAD_DIM / 2], const float (&P)[kBc / 2], uint32_t sV) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; kk++) {
    uint32_t a[4];
    p_fragment(P, kk, a);
    wgmma_rs<HEAD_DIM, 1>(O, a, wgmma_descriptor(sV + uint32_t(kk * 16 * 128), kTileBlockBytes), true);
  }
}

#endif  // the host pass or sm_90a
// ---------------------------------------------------------------------------------------------------
// The kernel

// Block (x, kv_head, seq) takes row tile t = gridDim.x - 1 - x: rows 64 t .. 64 t + 63 of sequence seq
// that read KV head kv_head (row -> token row / G, head kv_head * G + row % G) -> their out rows. v5's
// kernel with the products on wgmma; what is the same is said once, there.
template <int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) attention_v12_wgmma_prefill_kernel(AttentionParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kTileBytes = kBc * HEAD_DIM * 2;  // one K or V tile: HEAD_DIM / 64 blocks of 8 KB
  extern __shared__ unsigned char smem_raw[];
  // The swizzle's 8-row groups must start on 1,024-byte boundaries: the hardware swizzles by address.
  const uint32_t sK = (smem_address(smem_raw) + 1023u) & ~1023u;  // (2, tile) K: double buffer
  const uint32_t sV = sK + 2 * kTileBytes;                         // (2, tile) V: double buffer
  RowTile b;
  if (!row_tile_of_block(p, b)) return;
  auto load_kv = [&](int t) {
    const uint32_t buf = uint32_t((t % 2) * kTileBytes);
    load_kv_tile<HEAD_DIM>(p, b.block_table, b.kv_head, b.key_end, t, sK + buf, sV + buf);
  };
  load_kv(0);
  cp_async_commit();  // group 0: K/V tile 0

  LaneRows rows = lane_rows(b);
  uint32_t q_frag[HEAD_DIM / 16][4];  // while tile 0 flies
  load_q_fragments<HEAD_DIM>(p, b, rows, q_frag);
  float O[HEAD_DIM / 2];  // D of O = P V: O[4 n + e] is v5's O[n][e]
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; i++) O[i] = 0.0f;

  for (int t = 0; t < b.num_kv_tiles; t++) {
    if (t + 1 < b.num_kv_tiles) load_kv(t + 1);  // the next tile flies while this one computes
    cp_async_commit();
    cp_async_wait<1>();  // tile t is in, for this thread...
    fence_copies_for_wgmma();
    __syncthreads();     // ...and for the tensor cores, from every thread
    const uint32_t buf = uint32_t((t % 2) * kTileBytes);

    float S[kBc / 2];  // S = Q K^T (64 rows x 64 keys): S[4 n + e] is v5's S[n][e]
    wgmma_fence();     // q_frag, and O (rescaled below in the previous tile), were written by this thread
    issue_scores<HEAD_DIM>(S, q_frag, sK + buf);
    wgmma_commit();
    wgmma_wait<0>();  // the softmax needs every score of the tile: nothing to overlap with (a v13 that overlapped
                      // the next tile's scores was tried and taken out: NOTES.md, "v12: prefill on wgmma")
    fence_accumulators(S);

    float alpha[2];
    softmax_tile(p, b, rows, t, S, alpha);  // S is P now
    rescale<HEAD_DIM>(O, alpha);

    // O was just rescaled. P's A fragments are packed inside issue_pv, after this fence, so ptxas adds a
    // warpgroup.arrive of its own before each product after the first (warning C7519, 3 a tile).
    wgmma_fence();
    issue_pv<HEAD_DIM>(O, S, sV + buf);
    wgmma_commit();
    wgmma_wait<0>();  // the products have read buffer t % 2 and written O
    fence_accumulators(O);
    __syncthreads();  // every warp is done with buffer t % 2 before the next iteration refills it
  }
  store_out<HEAD_DIM>(p, b, rows, O);
#endif
}

// Whether the code loaded for this GPU has the kernel: 1 where it was compiled for sm_90a (the Makefile
// builds compute capability 9.0 as sm_90a), 0 elsewhere, where it is empty.
__device__ const int kWgmmaPrefillCompiled =
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    1;
#else
    0;
#endif

// ---------------------------------------------------------------------------------------------------
// Launch

// Grid (ceil(max_seqlen_q G / 64), num_kv_heads, num_seqs): a block a 64-row tile, kThreads threads, two K and
// two V tiles of dynamic shared memory and 1 KB to align them (65 KB at head_dim 128, 33 KB at 64). Plain launch.
template <int HEAD_DIM>
void launch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const int G = p.num_heads / p.num_kv_heads;
  const dim3 grid(unsigned((dims.max_seqlen_q * G + kBr - 1) / kBr), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  const int smem_bytes = 4 * kBc * HEAD_DIM * 2 + 1024;  // K x 2, V x 2, and the alignment
  static PerDeviceOnce once;  // more than 48 KB: opted in once per device (cuda_utils.h)
  allow_dynamic_shared_memory(once, reinterpret_cast<const void*>(attention_v12_wgmma_prefill_kernel<HEAD_DIM>),
                              smem_bytes);
  attention_v12_wgmma_prefill_kernel<HEAD_DIM><<<grid, kThreads, smem_bytes, stream>>>(p);
}

}  // namespace

bool wgmma_prefill_available() {
  static const bool available = [] {
    int compiled = 0;
    if (!gpu_is_sm90()) return false;
    CUDA_CHECK(cudaMemcpyFromSymbol(&compiled, kWgmmaPrefillCompiled, sizeof(int)));
    return compiled == 1;
  }();
  return available;
}

void launch_v12_wgmma_prefill(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  if (!wgmma_prefill_available()) return launch_v5_tensor_core_prefill(p, dims, stream);
  if (p.head_dim == 64) launch<64>(p, dims, stream);
  else launch<128>(p, dims, stream);
}

}  // namespace nanovllm
