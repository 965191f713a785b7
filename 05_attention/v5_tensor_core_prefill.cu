// v5_tensor_core_prefill.cu: prefill on tensor cores, FlashAttention-2 style (Dao 2023), with K/V read
// through the block table.
//
// Idea:     prefill multiplies matrices: S = Q K^T and O = P V for a tile of query rows against a tile of
//           keys. v1 does it on CUDA cores, one fp32 FMA per multiply-add; the tensor cores do a 16x8x16
//           bf16 product per warp instruction (mma.sync m16n8k16), an order of magnitude more per clock.
// Adds:     over v1: tiles of kBr = 64 rows x kBc = 64 keys; each of 4 warps owns 16 rows and the whole
//           key tile, so a row's softmax statistics live in the 4 lanes of one quad. K/V tiles are copied
//           from the paged cache into shared memory with 16-byte cp.async, double-buffered (the next tile
//           flies while this one computes), XOR-swizzled so that ldmatrix reads are free of bank
//           conflicts. Q, read once, goes from memory straight into its A fragments (no shared tile), so
//           that three blocks fit on an SM. S stays in registers; the online softmax runs on it in fp32
//           with exp2; P is converted to bf16 in registers and used directly as the A operand of P V.
//           Rows are (token, head-in-group) pairs, as in v1 (row -> token row / G, head kv_head * G +
//           row % G), so the G heads of a group share every K/V tile. Causal, bottom-right: KV tiles
//           past the block's last row are never loaded; the mask is applied only in tiles that cross
//           the diagonal.
// Launch:   grid (ceil(max_seqlen_q * G / 64), num_kv_heads, num_seqs), 128 threads, dynamic shared
//           memory 4 tiles of 64 x head_dim bf16 (K x 2, V x 2): 64 KB for head_dim 128, 32 KB for 64;
//           at most 168 registers a thread, so that 3 blocks (12 warps) share an SM.
//           blockIdx.x runs the row tiles backwards, so the heaviest (last rows, most keys) start first.
//           Head dims 64 and 128 (others run v0), any GQA group, any block_size (the engine's
//           are multiples of 16).
// Measured: see NOTES.md.
//
// ---------------------------------------------------------------------------------------------------
// The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). In a warp,
// lane = 4 g + t4: g = lane / 4 is the ISA's groupID (0..7), t4 = lane % 4 its threadID_in_group (0..3).
// Each 32-bit register holds two bf16, the lower column (or k) index in the lower 16 bits.
//
//   A (16 x 16, row-major; rows x k), 4 registers:    B (16 x 8, "col"; k x n), 2 registers:
//     a0: row g,     k 2 t4 + {0, 1}                    b0: k 2 t4 + {0, 1},     n g
//     a1: row g + 8, k 2 t4 + {0, 1}                    b1: k 2 t4 + 8 + {0, 1}, n g
//     a2: row g,     k 2 t4 + 8 + {0, 1}
//     a3: row g + 8, k 2 t4 + 8 + {0, 1}              C, D (16 x 8, fp32), 4 registers:
//                                                       c0, c1: row g,     n 2 t4 + {0, 1}
//                                                       c2, c3: row g + 8, n 2 t4 + {0, 1}
//
// ldmatrix.x4 reads four 8 x 8 bf16 matrices from shared memory: lanes 8i .. 8i + 7 give the addresses of
// the 8 rows (16 bytes each) of matrix i, and register i of lane l receives matrix i's row l / 4, columns
// 2 (l % 4) + {0, 1}: exactly the a0 / b0 / c0 pattern above. With .trans, register i of lane l receives
// matrix i's column l / 4, rows 2 (l % 4) + {0, 1}.
//
// Q (A of S = Q K^T; rows x dims), k-step kk (dims 16 kk ..), is read from memory by each lane as the A
// table says: a0 = two bf16 of row g at dims 16 kk + 2 t4 (one 32-bit load, the lower dim in the lower
// half, as memory holds them), a1 the same of row g + 8, a2 and a3 at dims 16 kk + 8 + 2 t4.
//
// So, with M(r0, c0) meaning "the 8 x 8 block at row r0, column c0 of the shared tile":
//   K (B of S = Q K^T; k = dim, n = key): K's row-major (key, dim) tile is B column-major already, so no
//     .trans; for keys 16 nn .. 16 nn + 15 (two n-tiles of 8) and dims 16 kk ..:
//     matrices M(0, 0), M(0, 8), M(8, 0), M(8, 8) of those keys -> b0, b1 of n-tile 2 nn, b0, b1 of 2 nn + 1;
//     lane l gives key 16 nn + (l % 8) + 8 (l / 16), dims 16 kk + 8 ((l / 8) % 2).
//   V (B of O = P V; k = key, n = dim): b0 needs two keys of one dim in one register, a column of the
//     (key, dim) tile: .trans; for keys 16 kk .. 16 kk + 15 and dims 16 dd .. 16 dd + 15 (two n-tiles):
//     matrices M(0, 0), M(8, 0), M(0, 8), M(8, 8) -> b0, b1 of n-tile 2 dd, b0, b1 of n-tile 2 dd + 1;
//     lane l gives key 16 kk + (l % 16), dims 16 dd + 8 (l / 16).
//   P (A of O = P V; rows x keys) comes from S's accumulators without moving: S n-tile n holds keys
//     8 n + 2 t4 + {0, 1} of rows g (c0, c1) and g + 8 (c2, c3); k-step kk of P V (keys 16 kk ..) needs
//     a0 = S[2 kk] c0 c1, a1 = S[2 kk] c2 c3, a2 = S[2 kk + 1] c0 c1, a3 = S[2 kk + 1] c2 c3.
//
// Worked example, lane 13 (g = 3, t4 = 1):
//   Q: a1 is row g + 8 = 11, dims 16 kk + 2 t4 = 16 kk + 2, 3: the 32-bit word at dim 16 kk + 2 of row 11.
//   K: it gives matrix 1's row 5: key 16 nn + 5 + 8 (13 / 16) = 16 nn + 5, dims 16 kk + 8 ((13 / 8) % 2)
//     = 16 kk + 8; matrix 1 is keys 16 nn + 0..7, dims 16 kk + 8..15. It receives in register 1 matrix
//     1's row 3, columns 2, 3: key 16 nn + 3, dims 16 kk + 10, 11 = B(k 10, 11; n 3) = b1 of n-tile 2 nn
//     (k 2 t4 + 8 = 10, n g = 3). Correct.
//   V: it gives matrix 1's row 5: key 16 kk + 13 % 16 = 16 kk + 13, dims 16 dd + 8 (13 / 16) = 16 dd;
//     matrix 1 is keys 16 kk + 8..15, dims 16 dd + 0..7, row 5 = key 16 kk + 13. Correct. It receives
//     (.trans) matrix 1's column 3, rows 2, 3: keys 16 kk + 10, 11 at dim 16 dd + 3 = B(k 10, 11; n 3) =
//     b1 of n-tile 2 dd. Correct.
//   P: a2 of k-step kk must be (row g = 3, keys 16 kk + 8 + 2 t4 = 16 kk + 10, 11); S n-tile 2 kk + 1
//     covers keys 16 kk + 8 .. 15 and its c0, c1 are (row 3, keys 16 kk + 8 + 2, 3). Correct.
//
// Shared memory: a tile row is head_dim bf16 = CHUNKS = head_dim / 8 chunks of 16 bytes, and rows are
// 128 or 256 bytes apart, so the 8 rows one ldmatrix matrix reads, at the same chunk, would all sit in
// the same 4 banks (8-way conflict). Chunk c of row r is stored at chunk c ^ (r % 8) of that row instead:
// the 8 rows of any matrix (8 consecutive rows) land on 8 different 16-byte bank groups. Rows of 16
// chunks keep the XOR inside each half (it only flips the 3 low bits).
#include "05_attention/kernels.cuh"
#include "01_sequence/base/ptx.cuh"
#include "05_attention/softmax.cuh"

namespace nanovllm {
namespace {

constexpr int kBr = 64;        // rows per block (the paper's B_r): (token, head) pairs, 16 per warp
constexpr int kBc = 64;        // keys per KV tile (the paper's B_c)
constexpr int kThreads = 128;  // 4 warps
constexpr int kBlocksPerSm = 3;  // 168 registers a thread at most: 3 x 128 x 168 of the SM's 65,536

// Byte offset of chunk `chunk` (16 bytes, dims 8 chunk ..) of row `row` in a swizzled (64, HEAD_DIM) tile.
template <int HEAD_DIM>
__device__ inline uint32_t tile_offset(int row, int chunk) {
  return uint32_t(row * (HEAD_DIM / 8) + (chunk ^ (row % 8))) * 16;
}

// ---------------------------------------------------------------------------------------------------
// The kernel

// Block (x, kv_head, seq) takes row tile t = gridDim.x - 1 - x: rows 64 t .. 64 t + 63 of sequence seq
// that read KV head kv_head (row -> token row / G, head kv_head * G + row % G) -> their out rows.
template <int HEAD_DIM>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) attention_v5_tensor_core_prefill_kernel(AttentionParams p) {
  constexpr int CHUNKS = HEAD_DIM / 8;               // 16-byte chunks per tile row
  constexpr int kTileBytes = kBc * HEAD_DIM * 2;     // one K or V tile
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smem_address(smem);     // (2, kBc, HEAD_DIM) swizzled: double buffer
  const uint32_t sV = sK + 2 * kTileBytes;    // (2, kBc, HEAD_DIM) swizzled: double buffer

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);
  const int num_rows = r.seqlen_q * G;                          // (token, head) rows of this sequence
  const int first_row = (gridDim.x - 1 - blockIdx.x) * kBr;     // heaviest tiles first
  if (first_row >= num_rows) return;                            // past this sequence's rows
  // Causal, bottom-right: row -> token i sees keys 0 .. causal_offset + i.
  const int causal_offset = r.seqlen_k - r.seqlen_q;
  const int last_row = min(first_row + kBr, num_rows) - 1;
  const int key_end = causal_offset + last_row / G + 1;         // keys this block reads: 0 .. key_end - 1
  const int full_keys = causal_offset + first_row / G + 1;      // keys every row of the block sees
  const int num_kv_tiles = (key_end + kBc - 1) / kBc;
  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  const int64_t kv_dim = int64_t(p.num_kv_heads) * HEAD_DIM;    // one token's K (or V) in the cache

  // Copies (all 128 threads): element i = threadIdx.x + 128 k of a tile is row i / CHUNKS, chunk
  // i % CHUNKS (for head_dim 128: rows tid / 16 + 8 k, chunk tid % 16, k = 0..7).
  // K/V tile t (keys 64 t .. 64 t + 63) into buffer `buf`, through the block table. When the cache's blocks
  // hold whole tiles (block_size a multiple of 64) a tile's keys are consecutive slots of one block: one
  // table read a tile (NOTES.md, "v5 with one block-table read a tile") and one address a thread (NOTES.md,
  // "v5 with v12's whole-tile copies"); otherwise a tile may span several blocks, and each key is looked up.
  // Keys past key_end are zeros: masked to weight 0, and 0 * (uninitialised shared memory) could be NaN.
  const bool whole_tiles = p.block_size % kBc == 0;
  auto load_kv_tile = [&](int t, int buf) {
    if (whole_tiles) {
      // A tile is 64 consecutive slots of one block: a thread's chunks are keys row0, row0 + kRowsPerPass,
      // ..., one address and fixed steps (the swizzle reads the row only through row % 8), keys from key_end
      // on zero-filled, as v12 (NOTES.md, "v12's copies of whole tiles with one address a thread").
      constexpr int kRowsPerPass = kThreads / CHUNKS;
      static_assert(kRowsPerPass % 8 == 0, "a thread's keys must share their swizzle");
      const int row0 = threadIdx.x / CHUNKS, chunk = threadIdx.x % CHUNKS;
      const int64_t first_slot = key_slot(block_table, t * kBc, p.block_size);  // t * kBc < key_end
      const int valid_rows = key_end - t * kBc;
      const int64_t offset = (first_slot + row0) * kv_dim + int64_t(kv_head) * HEAD_DIM + 8 * chunk;
      const uint32_t dst = uint32_t(buf * kTileBytes) + tile_offset<HEAD_DIM>(row0, chunk);
#pragma unroll
      for (int k = 0; k < kBc / kRowsPerPass; k++) {
        const bool valid = row0 + k * kRowsPerPass < valid_rows;
        const uint32_t step = uint32_t(k * kRowsPerPass * HEAD_DIM * 2);
        cp_async_16(sK + dst + step, p.k_cache + offset + k * kRowsPerPass * kv_dim, valid);
        cp_async_16(sV + dst + step, p.v_cache + offset + k * kRowsPerPass * kv_dim, valid);
      }
      return;
    }
    for (int i = threadIdx.x; i < kBc * CHUNKS; i += kThreads) {
      const int row = i / CHUNKS, chunk = i % CHUNKS, j = t * kBc + row;
      const bool valid = j < key_end;
      int64_t offset = 0;  // a key past key_end reads nothing (zero-filled)
      if (valid) {
        const int64_t slot = key_slot(block_table, j, p.block_size);
        offset = slot * kv_dim + int64_t(kv_head) * HEAD_DIM + 8 * chunk;
      }
      const uint32_t dst = uint32_t(buf * kTileBytes) + tile_offset<HEAD_DIM>(row, chunk);
      cp_async_16(sK + dst, p.k_cache + offset, valid);
      cp_async_16(sV + dst, p.v_cache + offset, valid);
    }
  };
  load_kv_tile(0, 0);
  cp_async_commit();  // group 0: K/V tile 0

  // This lane's two rows of its warp's 16 (the fragments' g and g + 8): block rows warp * 16 + g + 8 h.
  const int g = lane / 4, t4 = lane % 4;
  // Q's A fragments from memory (header: "Q"), one per 16 dims, while tile 0 flies. Rows past the
  // sequence's rows are zeros (their S rows are finite, and never written).
  uint32_t q_frag[HEAD_DIM / 16][4];
  {
    const uint32_t* q_rows[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int q_row = first_row + warp * 16 + g + 8 * h;
      q_rows[h] = q_row < num_rows ? reinterpret_cast<const uint32_t*>(
                                         p.q + int64_t(r.q_row0 + q_row / G) * p.q_stride +
                                         int64_t(kv_head * G + q_row % G) * HEAD_DIM + 2 * t4)
                                   : nullptr;
    }
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++)
#pragma unroll
      for (int e = 0; e < 4; e++)  // a0: row g, dims 16 kk + 2 t4; a1: row g + 8; a2, a3: dims + 8
        q_frag[kk][e] = q_rows[e % 2] ? q_rows[e % 2][(16 * kk + 8 * (e / 2)) / 2] : 0u;
  }
  int limit[2];  // each row's last visible key; rows past num_rows copy the last real row's (never written)
#pragma unroll
  for (int h = 0; h < 2; h++) limit[h] = causal_offset + min(first_row + warp * 16 + g + 8 * h, num_rows - 1) / G;
  // Keys any row of this warp sees (0 when the warp has no real row): tiles from there on are skipped.
  const int warp_first_row = first_row + warp * 16;
  const int warp_key_end =
      warp_first_row < num_rows ? causal_offset + min(warp_first_row + 15, num_rows - 1) / G + 1 : 0;

  float O[HEAD_DIM / 8][4];           // C fragments of O (16 rows x head_dim), one per 8 dims
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; n++) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // rows g, g + 8: running max of the scores (base 2)
  float l[2] = {0.0f, 0.0f};            // this lane's part of the row sums (the quad adds up at the end)

  for (int t = 0; t < num_kv_tiles; t++) {
    const int buf = t % 2;
    if (t + 1 < num_kv_tiles) load_kv_tile(t + 1, buf ^ 1);  // the next tile flies while this one computes
    cp_async_commit();
    cp_async_wait<1>();  // all groups but the newest are complete: tile t is in, for this thread
    __syncthreads();     // ... and for every thread: tile t is visible to every warp
    if (t * kBc < warp_key_end) {  // the same for the whole warp (mma and shuffles need every lane)
      const uint32_t sKt = sK + uint32_t(buf * kTileBytes), sVt = sV + uint32_t(buf * kTileBytes);
      // S = Q K^T (16 rows x 64 keys per warp): S[n] is the C fragment of keys 8 n .. 8 n + 7.
      float S[kBc / 8][4];
#pragma unroll
      for (int n = 0; n < kBc / 8; n++) S[n][0] = S[n][1] = S[n][2] = S[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
#pragma unroll
        for (int nn = 0; nn < kBc / 16; nn++) {
          uint32_t b[4];
          ldmatrix_x4(b, sKt + tile_offset<HEAD_DIM>(16 * nn + lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
          mma_16816(S[2 * nn], q_frag[kk], b[0], b[1]);
          mma_16816(S[2 * nn + 1], q_frag[kk], b[2], b[3]);
        }
      }
      // The causal mask, only in tiles with a key past some row's limit (the diagonal; keys past
      // key_end are past every limit). Element e of S[n]: row g + 8 (e / 2), key 8 n + 2 t4 + e % 2.
      const int key0 = t * kBc;
      if (key0 + kBc > full_keys) {
#pragma unroll
        for (int n = 0; n < kBc / 8; n++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            if (key0 + 8 * n + 2 * t4 + e % 2 > limit[e / 2]) S[n][e] = -INFINITY;
      }
      // Online softmax (softmax.cuh) on rows g (h = 0) and g + 8 (h = 1). A row's 64 scores are spread
      // over the 4 lanes of a quad (t4 = 0..3, same g): its max is reduced with xor-shuffles 1 and 2.
      float m_use[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float row_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < kBc / 8; n++) row_max = fmaxf(row_max, fmaxf(S[n][2 * h], S[n][2 * h + 1]));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
        const float m_new = fmaxf(m[h], row_max * p.scale_log2);
        const float alpha = online_softmax_rescale(m[h], m_new);
        m[h] = m_new;
        m_use[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: exp2(-inf - 0) = 0, not NaN
        l[h] *= alpha;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; n++) O[n][2 * h] *= alpha, O[n][2 * h + 1] *= alpha;
      }
      // P = exp2(S * scale * log2(e) - m), in place (masked scores give 0).
#pragma unroll
      for (int n = 0; n < kBc / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          S[n][e] = exp2f(fmaf(S[n][e], p.scale_log2, -m_use[e / 2]));
          l[e / 2] += S[n][e];
        }
      }
      // O += P V: P's A fragments straight from S's registers (header: "P"), V's B fragments by
      // ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < kBc / 16; kk++) {
        const uint32_t p_frag[4] = {pack_bf16x2(S[2 * kk][0], S[2 * kk][1]), pack_bf16x2(S[2 * kk][2], S[2 * kk][3]),
                                    pack_bf16x2(S[2 * kk + 1][0], S[2 * kk + 1][1]),
                                    pack_bf16x2(S[2 * kk + 1][2], S[2 * kk + 1][3])};
#pragma unroll
        for (int dd = 0; dd < HEAD_DIM / 16; dd++) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, sVt + tile_offset<HEAD_DIM>(16 * kk + lane % 16, 2 * dd + lane / 16));
          mma_16816(O[2 * dd], p_frag, b[0], b[1]);
          mma_16816(O[2 * dd + 1], p_frag, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done reading buffer `buf` before the next iteration refills it
  }

  // out = O / l. The row sum is split over the quad's 4 lanes; every real row saw key 0, so l > 0.
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int row = first_row + warp * 16 + g + 8 * h;
    if (row >= num_rows) continue;
    const float inv_l = 1.0f / l[h];
    bf16* out = p.out + int64_t(r.q_row0 + row / G) * p.out_stride + int64_t(kv_head * G + row % G) * HEAD_DIM;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; n++)  // O[n] c0, c1 (h = 0) or c2, c3 (h = 1): dims 8 n + 2 t4 + {0, 1}
      *reinterpret_cast<uint32_t*>(out + 8 * n + 2 * t4) = pack_bf16x2(O[n][2 * h] * inv_l, O[n][2 * h + 1] * inv_l);
  }
}

// ---------------------------------------------------------------------------------------------------
// Launch

// One launch over (row tiles of the longest sequence, KV heads, sequences).
template <int HEAD_DIM>
void launch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const int G = p.num_heads / p.num_kv_heads;
  const dim3 grid(unsigned((dims.max_seqlen_q * G + kBr - 1) / kBr), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  const int smem_bytes = 4 * kBc * HEAD_DIM * 2;  // K x 2, V x 2
  static PerDeviceOnce once;  // more than 48 KB at head_dim 128: opted in once per device (cuda_utils.h)
  allow_dynamic_shared_memory(once, reinterpret_cast<const void*>(attention_v5_tensor_core_prefill_kernel<HEAD_DIM>),
                              smem_bytes);
  attention_v5_tensor_core_prefill_kernel<HEAD_DIM><<<grid, kThreads, smem_bytes, stream>>>(p);
}

}  // namespace

void launch_v5_tensor_core_prefill(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  if (p.head_dim == 64) launch<64>(p, dims, stream);
  else launch<128>(p, dims, stream);
}

}  // namespace nanovllm
