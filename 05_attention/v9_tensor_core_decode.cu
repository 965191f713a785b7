// v9_tensor_core_decode.cu: split-K decode on tensor cores: K/V stream through shared memory by cp.async,
// and the few query rows of a GQA group ride in one mma.
//
// Idea:     v2-v8 show that decode is not limited by how many bytes are in flight (v8's L2 prefetch, v6's
//           pipeline) but by the instructions spent per byte: on CUDA cores every bf16 of K and V costs a
//           conversion, one FMA per query row, and for K a 16-lane shuffle reduction; at batch 256 that is
//           about 100 warp instructions per KB, 40% of the GPU's issue rate at full bandwidth, with 5 warps
//           per scheduler to hide the latencies. A tensor core multiplies a 16 x 16 by a 16 x 8 tile in one
//           instruction. A decode block has only G = 2..8 query rows (the heads of one KV head), so most
//           of the tile is padding, but the padding is free: what matters is that a 16-key tile of K and V
//           (8 KB at head_dim 128) now costs about 340 warp instructions instead of ~800 (ncu: 213 of
//           arithmetic, 126 around its 16 copies; NOTES.md).
// Adds:     over v2 (partitions, combine kernel) and v5 (mma.sync, ldmatrix, cp.async, XOR swizzle):
//           - each warp owns every 4th 16-key tile of the block's partition and streams it through its own
//             kStages-deep cp.async pipeline in shared memory (warp-private: __syncwarp, no block barrier);
//           - S = Q K^T with the G rows as the mma's M (rows G..15 are zeros);
//           - O^T = V^T P^T: transposed, so that the G rows are the mma's N (8 columns, G <= 8) and the
//             output takes 4 registers per 16 dims instead of 8. P^T's B fragment is exactly S's
//             accumulator registers of rows 0..7 (see "P" below), so P never leaves registers.
//           - the K/V copies marked first to evict from the L2 (TileCopier: the stream is read once a step).
// Launch:   overlapped (cuda_utils.h: launch_overlapped): the previous kernel's tail and this kernel's
//           start-up run together, and so do this kernel's tail and the next kernel's start. Before its
//           wait a block already reads its context length (fused, with the new key's slot and position, all
//           three loaded before any is used) and block table and has its first tiles' copies in flight (all
//           but the newest key's, which the previous kernel writes, or, fused, this one after its wait), and,
//           fused, its norm and RoPE factors.
//           It lets the next kernel (o_proj, or v9's combine) launch only after its tile loop, not after
//           its wait: o_proj's blocks load their weights as they start (04_model_runner/NOTES.md, section 4,
//           "When the next kernel may start"). The exception is p.next_at_wait (o_proj's merge at one
//           sequence, decode_attention_o_proj_cuda): let in right after the wait.
//           Grid (max_partitions, num_kv_heads, num_seqs), 128 threads, dynamic shared memory kStages x 4
//           warps x (K, V) x 16 keys x head_dim bf16 (96 KB at head_dim 128: 2 blocks per SM; v11 adds
//           its merge's slots, kSliceSlotFloats, 5.25 KB); then v2's combine kernel. Head dims 64 and 128,
//           G <= 8, block_size a multiple of 16 (the engine's rule: a 16-key tile never crosses a KV block).
// Fused:    given chapter 04's qk-norm inputs (AttentionParams::q_norm != nullptr: decode_attention_fused_cuda),
//           the kernel also does qk_norm_rope_store's work for its block: q heads normed and rotated into
//           shared memory, and the new key's K and V written to the cache before the copies that read it.
// Measured: see NOTES.md.
//
// ---------------------------------------------------------------------------------------------------
// Fragments (lane = 4 g + t4; the ISA tables are in v5_tensor_core_prefill.cu's header):
//   S = Q K^T, per 16-key tile: M = query rows (row g valid when g < G), N = keys, K = dims.
//     A (Q): a0 = Q[g][16 kk + 2 t4 + {0,1}], a2 = Q[g][16 kk + 8 + 2 t4 + {0,1}]; a1 = a3 = 0 (rows 8..15).
//     B (K): keys 0..7 (n-tile 0) and 8..15 (n-tile 1); K's (key, dim) rows in shared memory are B
//       column-major already: ldmatrix without .trans, matrices (keys 0-7, dims 16 kk..), (keys 0-7,
//       dims 16 kk + 8..), (keys 8-15, dims 16 kk..), (keys 8-15, dims 16 kk + 8..) -> b0, b1 of n-tile 0,
//       b0, b1 of n-tile 1.
//     C: lane (g, t4) holds S[g][2 t4 + {0,1}] (n-tile 0, c0 c1) and S[g][8 + 2 t4 + {0,1}] (n-tile 1).
//   O^T = V^T P^T, per 16-key tile: M = dims (16 per m-tile), N = query rows, K = keys.
//     A (V^T): a0 = V[keys 2 t4 + {0,1}][dim 16 mt + g], a1 = dim + 8, a2 = keys + 8, a3 = both: the
//       (key, dim) tile read with ldmatrix.trans, matrices (keys 0-7, dims 16 mt..), (keys 0-7, dims
//       16 mt + 8..), (keys 8-15, dims 16 mt..), (keys 8-15, dims 16 mt + 8..): the same four as K's.
//     B (P^T): b0 = P[row g][keys 2 t4 + {0,1}], b1 = P[row g][keys 8 + 2 t4 + {0,1}]: S's n-tile 0 and
//       n-tile 1 c0 c1 of this very lane, after the softmax. Nothing moves.
//     C: lane (g, t4) holds O^T[dim 16 mt + g (+ 8 for c2, c3)][rows 2 t4 + {0,1}].
//   So the softmax statistics of row r live in the quad of lanes 4r..4r+3 (S's layout), while the output
//   of row r lives in lanes with t4 = r / 2: rescaling O fetches alpha of rows 2 t4 and 2 t4 + 1 from
//   lanes 8 t4 and 8 t4 + 4 (two shuffles per tile).
#include <algorithm>

#include "05_attention/kernels.cuh"
#include "01_sequence/base/ptx.cuh"
#include "05_attention/softmax.cuh"
#include "05_attention/qk_norm_rope.cuh"

namespace nanovllm {
namespace {

constexpr int kTileKeys = 16;  // keys per tile: the mma's K for P V, two n-tiles for Q K^T
// warps per block; warp w takes tiles w, w + 4, w + 8, ... of the partition. 8 left attention's own time at 16
// rows where it was and made the step 2% slower at 64 (NOTES.md, "A deeper pipeline for one-wave grids",
// "Eight warps a block").
constexpr int kWarpsV9 = 4;
// tiles of each warp in shared memory at once (2 in flight while 1 computes). 6 left attention's own time
// at 16 rows where it was (the step 2% faster), and made the step slower at 8 and 32 (NOTES.md, "A deeper
// pipeline for one-wave grids", measured before 16 rows took two splits).
constexpr int kStages = 3;

// Shared-memory byte offset of 16-byte chunk `chunk` of row `row` in a (kTileKeys, HEAD_DIM) bf16 tile: the
// chunk index XOR row % 8, so that the 8 rows of one ldmatrix matrix (same chunk, rows r..r+7) fall in 8
// different bank groups.
template <int HEAD_DIM>
__device__ inline uint32_t tile_offset(int row, int chunk) {
  return uint32_t(row * HEAD_DIM * 2 + ((chunk ^ (row % 8)) * 16));
}

// A warp's copies of its tiles, in order: tile t of the warp holds keys first_key + t * kStride ..
// + kTileKeys - 1 of (seq, kv_head). Each copy_next() puts the next tile's K and V rows into the stage
// buffers it is given, one 16-byte cp.async per lane per instruction, consecutive lanes on consecutive
// chunks of a row. Keys at or past key_end are zero-filled: their weight will be 0, and 0 * (garbage that
// happens to be NaN) would not be.
//
// Why a walker and not a function of the tile's first key: a tile's copies are 16 instructions, and
// ncu counted 221 a tile around them (2026-12-01, 16 rows at context 1,000), half the warp's work: an
// integer division by block_size for the tile's KV block, and a 64-bit multiply per row. Here what does
// not change from tile to tile is worked out once (the lane's row, chunk and offset within a slot's row),
// a row's address is the tile's first slot plus a 32-bit offset, and the walker steps through the block
// table by kStride keys instead of dividing (a tile never crosses a KV block: block_size is a multiple of
// 16 and tiles start at multiples of 16).
template <int HEAD_DIM>
struct TileCopier {
  static constexpr int kChunks = HEAD_DIM / 8;       // 16-byte chunks per row: 16 at head_dim 128
  static constexpr int kRowsPerCopy = 32 / kChunks;  // rows one warp instruction covers: 2 at head_dim 128
  static constexpr int kStride = kWarpsV9 * kTileKeys;  // keys from one of the warp's tiles to its next

  const bf16* k_cache;
  const bf16* v_cache;
  const int32_t* block_table;  // the sequence's
  int block_size, kv_dim;      // kv_dim: elements from one slot's row to the next
  int logical, offset;         // the next tile: its KV block's index in the block table, its first key there
  int rows_left;               // keys from the next tile's first to key_end (a full tile: kTileKeys or more)
  int lane_row, lane_chunk;    // this lane copies chunk lane_chunk of rows lane_row, + kRowsPerCopy, ...
  int lane_offset;             // elements from a slot's row to this lane's first chunk of row lane_row
  // A step reads each K/V row once; before it reads the row again (the next step, same layer) every
  // layer's cache has streamed through the L2. So the tiles are marked first to evict: the kernel reads
  // 0.4-2% faster, more than the lines this spares explain (NOTES.md, "The KV stream marked evict-first in
  // the L2").
  uint64_t policy = l2_evict_first_policy();

  __device__ TileCopier(const AttentionParams& p, const int32_t* table, int first_key, int key_end, int kv_head,
                        int lane)
      : k_cache(p.k_cache), v_cache(p.v_cache), block_table(table), block_size(p.block_size),
        kv_dim(p.num_kv_heads * HEAD_DIM), logical(first_key / p.block_size),
        offset(first_key - logical * p.block_size), rows_left(key_end - first_key) {
    lane_row = lane / kChunks, lane_chunk = lane % kChunks;
    lane_offset = lane_row * kv_dim + kv_head * HEAD_DIM + lane_chunk * 8;
  }

  // Copies the next tile into (k_tile, v_tile) (shared addresses) and moves on. before_wait: the
  // block-table entry is read through L2 (ld.global.cg, as cuda_utils.h asks before the wait); after it,
  // through L1, where the warp's next tiles find it.
  __device__ void copy_next(uint32_t k_tile, uint32_t v_tile, bool before_wait = false) {
    const int32_t block = before_wait ? __ldcg(block_table + logical) : block_table[logical];
    const int64_t slot0 = int64_t(block) * block_size + offset;
    const bf16* k_src = k_cache + slot0 * kv_dim + lane_offset;
    const bf16* v_src = v_cache + slot0 * kv_dim + lane_offset;
#pragma unroll
    for (int i = 0; i < kTileKeys / kRowsPerCopy; i++) {
      const int row = i * kRowsPerCopy + lane_row;
      const uint32_t dst = tile_offset<HEAD_DIM>(row, lane_chunk);
      // A row past key_end is still inside the tile's KV block (allocated whole), so its address is valid.
      const bool valid = row < rows_left;
      cp_async_16(k_tile + dst, k_src + i * kRowsPerCopy * kv_dim, valid, policy);
      cp_async_16(v_tile + dst, v_src + i * kRowsPerCopy * kv_dim, valid, policy);
    }
    rows_left -= kStride;
    offset += kStride;
    while (offset >= block_size) offset -= block_size, logical++;
  }
};

// A block's 4 warps' states of rows 0..G-1 in shared memory: m and l (warps, 8), O (warps, 8, HEAD_DIM).
// The warps merge as the combine merges partitions: each weighed by exp2(m_w - M) against the row's max M.
// One home for that formula: the block's own merge (v9, v10) and send_to_owners (v11) both use it.
template <int HEAD_DIM>
struct WarpStates {
  const float *m, *l, *O;
  __device__ float row_max(int r) const {
    float M = -INFINITY;
    for (int w = 0; w < kWarpsV9; w++) M = fmaxf(M, m[w * 8 + r]);
    return M;
  }
  __device__ float weight(int w, int r, float M) const {  // a warp without tiles has m = -inf and weighs nothing
    return m[w * 8 + r] == -INFINITY ? 0.0f : exp2f(m[w * 8 + r] - M);
  }
  __device__ float o(int w, int r, int d) const { return O[(w * 8 + r) * HEAD_DIM + d]; }
};

// v11 (v11_cluster_combine.cu): the `splits` blocks of a (sequence, KV head) are one thread-block cluster,
// and each block's merged state of its partition goes straight into the shared memory of the blocks that
// merge it, by remote stores. The G x HEAD_DIM outputs, flattened as r * HEAD_DIM + d, are dealt to the
// cluster's blocks in slices of `slice` consecutive outputs (a multiple of 4): block k owns outputs
// [k slice, k slice + owned). Every block whose partition is not empty stores into each owner's shared
// memory, in its partition's slot, its m and l of the G rows and its O over the owner's slice
// (send_to_owners); the owner's mbarrier counts the bytes, and once they are all in, the owner merges its
// slice from its own shared memory (merge_owned_slice) with the combine kernel's formula in the combine's
// partition order (v2_split_k.cu, decode_combine_kernel): the same bits, without the partials' round trip
// through memory or a second launch. Stores rather than reads: a block waits only for the bytes it merges,
// not at a barrier of the whole cluster, and none of its reads crosses to another SM (NOTES.md, "v11's
// merge by remote stores").
template <int HEAD_DIM>
struct SliceMerge {
  int G, slice, owned, parts;
  __device__ SliceMerge(const AttentionParams& p, int context, int G_, int rank) : G(G_) {
    slice = ((G * HEAD_DIM + p.splits - 1) / p.splits + 3) / 4 * 4;
    owned = min(slice, max(0, G * HEAD_DIM - rank * slice));
    const int partition_size = context == 0 ? 1 : partition_size_for(p, context);
    parts = (context + partition_size - 1) / partition_size;  // the non-empty partitions; 0: padding
  }
  __device__ int slot_floats() const { return 16 + slice; }  // a partition's slot: m[8], l[8], O[slice]
  __device__ int expected_bytes() const { return owned == 0 ? 0 : parts * (2 * G + owned) * 4; }
};
// The most floats an owner's slots take: splits (16 + slice) <= 20 splits + G HEAD_DIM, G <= 8.
template <int HEAD_DIM>
constexpr int kSliceSlotFloats = 20 * kMaxClusterSplits + 8 * HEAD_DIM;

// A block's dynamic shared memory: the pipeline's buffers, (warps, kStages, K/V, kTileKeys, HEAD_DIM) bf16
// (96 KB at head_dim 128), then, in a cluster (v11), its merge's slots.
template <int HEAD_DIM>
constexpr int kPipelineBytes = kWarpsV9 * kStages * 2 * kTileKeys * HEAD_DIM * 2;
template <int HEAD_DIM, bool CLUSTER>
constexpr int kSmemBytes = kPipelineBytes<HEAD_DIM> + (CLUSTER ? kSliceSlotFloats<HEAD_DIM> * 4 : 0);
static_assert(kPipelineBytes<64> >= (2 * kWarpsV9 * 8 + kWarpsV9 * 8 * 64) * 4 &&
                  kPipelineBytes<128> >= (2 * kWarpsV9 * 8 + kWarpsV9 * 8 * 128) * 4,
              "the warps' merge reuses the pipeline buffers");

// This block's merged state of its partition (its warps' states, merged by WarpStates's formula) -> every
// owner's slot `partition`. Waits first at the cluster's barrier that every block arrived at once its
// mbarrier was set.
template <int HEAD_DIM>
__device__ void send_to_owners(const SliceMerge<HEAD_DIM>& merge, const WarpStates<HEAD_DIM>& warps,
                               const float* slots, uint64_t* landed, int partition) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Every owner's mbarrier is initialised and expects its bytes before any store below lands on it.
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  const uint32_t slot = smem_address(slots) + uint32_t(partition * merge.slot_floats() * 4);
  const uint32_t bar = smem_address(landed);
  const int G = merge.G;
  // m and l of the G rows: thread k to owner k.
  for (int k = threadIdx.x; k < int(gridDim.x); k += blockDim.x) {
    if (k * merge.slice >= G * HEAD_DIM) continue;  // owns nothing
    const uint32_t to = cluster_address(slot, k), to_bar = cluster_address(bar, k);
    for (int r = 0; r < G; r++) {
      const float M = warps.row_max(r);
      float L = 0.0f;
      for (int w = 0; w < kWarpsV9; w++) L += warps.l[w * 8 + r] * warps.weight(w, r, M);
      store_to_cluster(to + uint32_t(r * 4), M, to_bar);
      store_to_cluster(to + uint32_t((8 + r) * 4), L, to_bar);
    }
  }
  // O, four neighbouring outputs a thread, to their owner's slot (slice and HEAD_DIM are multiples of 4, so
  // the four share one owner and one row, and go as one 16-byte store).
  for (int q = threadIdx.x; q < G * HEAD_DIM / 4; q += blockDim.x) {
    const int idx = 4 * q, r = idx / HEAD_DIM, d = idx % HEAD_DIM, k = idx / merge.slice;
    const float M = warps.row_max(r);
    float O[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int w = 0; w < kWarpsV9; w++) {
      const float wt = warps.weight(w, r, M);
#pragma unroll
      for (int j = 0; j < 4; j++) O[j] += warps.o(w, r, d + j) * wt;
    }
    store_to_cluster(cluster_address(slot, k) + uint32_t((16 + idx - k * merge.slice) * 4), O,
                     cluster_address(bar, k));
  }
#endif
}

// Once every non-empty partition's bytes are in this block's slots: its slice of `out` (G, HEAD_DIM), by
// the combine's formula in partition order; zeros for a padding row (no partitions).
template <int HEAD_DIM>
__device__ void merge_owned_slice(const SliceMerge<HEAD_DIM>& merge, const float* slots, uint64_t* landed, int rank,
                                  bf16* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (merge.owned == 0) return;
  // Every non-empty partition's bytes have landed in this block's slots. Cluster scope: other SMs stored
  // them. Phase 0: the mbarrier is used once.
  mbarrier_wait</*CLUSTER_SCOPE=*/true>(smem_address(landed), 0);
  const int stride = merge.slot_floats();
  for (int j = threadIdx.x; j < merge.owned; j += blockDim.x) {
    const int idx = rank * merge.slice + j, r = idx / HEAD_DIM;
    float M = -INFINITY;
    for (int i = 0; i < merge.parts; i++) M = fmaxf(M, slots[i * stride + r]);
    float l = 0.0f, O = 0.0f;
    for (int i = 0; i < merge.parts; i++) {
      const float* s = slots + i * stride;
      const float w = exp2f(s[r] - M);
      l += s[8 + r] * w;
      O += s[16 + j] * w;
    }
    out[idx] = __float2bfloat16(merge.parts == 0 ? 0.0f : O / l);
  }
#endif
}

// Block (partition, kv_head, seq): the G query heads of kv_head over one partition of the context ->
// their partial (m, l, O), as v2's store_partials writes them; with p.splits == 1 (v10), their output;
// CLUSTER (v11, p.splits > 1), the output, merged across the cluster (SliceMerge).
template <int HEAD_DIM, bool CLUSTER>
__global__ void __launch_bounds__(kWarpsV9 * 32) attention_v9_tensor_core_decode_kernel(AttentionParams p) {
  constexpr int kSteps = HEAD_DIM / 16;  // k-steps of Q K^T, m-tiles of O^T
  constexpr int kTileBytes = kTileKeys * HEAD_DIM * 2;
  extern __shared__ __align__(128) unsigned char smem[];  // (warps, kStages, K/V, kTileKeys, HEAD_DIM) bf16
  // Launched overlapped. Until wait_for_previous_kernel below, the block reads only what the previous
  // kernel does not write (cuda_utils.h): the step's inputs (context lengths, block tables, positions,
  // slots), the weights, and the K/V of every key but the newest, which the previous kernel (or, fused,
  // this one) writes this step. So the first tiles' copies are in flight while the previous kernel ends.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int seq = blockIdx.z, kv_head = blockIdx.y, partition = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  // The step's inputs this block reads, all loaded before any of them is used: each load issued after the
  // first use of another (the branch on the context length below) would add its round trip to the chain
  // before the block's first copy (NOTES.md, "The step's inputs loaded together"). Fused: the new key's
  // slot and its position.
  const bool fused = p.q_norm != nullptr;
  const int seqlen_k = __ldcg(p.context_lens + seq);
  const int32_t new_slot = fused ? __ldcg(p.slot_mapping + seq) : -1;
  const int64_t position = fused ? __ldcg(p.positions + seq) : 0;
  const int partition_size = partition_size_for(p, seqlen_k);
  const int key_begin = partition * partition_size;
  const int key_end = min(seqlen_k, key_begin + partition_size);
  bf16* out = p.out + int64_t(seq) * p.out_stride + int64_t(kv_head * G) * HEAD_DIM;  // (G, HEAD_DIM) of this block
  // v11 (SliceMerge): this block's slots, after the pipeline buffers (remote stores may land while the
  // tile loop still uses those), and the mbarrier that counts their bytes. It is set before the block
  // arrives at the cluster's barrier, and no block sends before it has waited there, so no byte lands
  // before the mbarrier expects it. All of it before the wait: it depends on the context length alone.
  float* slots = reinterpret_cast<float*>(smem + kPipelineBytes<HEAD_DIM>);  // (splits, 16 + slice) fp32: per
                                                                             // partition m[8], l[8], O[slice]
  __shared__ __align__(8) uint64_t slots_landed;  // one mbarrier: counts the bytes of this block's slots
                                                  // (used only when merge_in_cluster; 8 idle bytes otherwise)
  const SliceMerge<HEAD_DIM> slice_merge(p, seqlen_k, G, partition);
  const bool merge_in_cluster = CLUSTER && p.splits > 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (merge_in_cluster) {
    if (threadIdx.x == 0) {
      mbarrier_init(smem_address(&slots_landed));
      mbarrier_arrive_expecting(smem_address(&slots_landed), slice_merge.expected_bytes());
      // The mbarrier's init and expected bytes visible to the other blocks' remote stores, which wait for
      // the arrive below.
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // Arrive now, wait only just before the first remote store (send_to_owners): the tile loop runs in
    // between, so the barrier costs nothing unless a block is late.
    asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory");
  }
#endif
  if (key_begin >= key_end) {  // past this sequence's context (or a padding row, context 0)
    wait_for_previous_kernel();  // before the writes below
    allow_next_kernel();
    // With one split (v10) there is no combine to write a padding row's zeros: this block does. In a
    // cluster (v11) the block sends nothing, but it still owns a slice of the outputs and merges it.
    if (p.splits == 1)
      for (int idx = threadIdx.x; idx < G * HEAD_DIM; idx += blockDim.x) out[idx] = __float2bfloat16(0.0f);
    if (merge_in_cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // Pairs this thread's arrive above, as send_to_owners does on the other path, so that every block
      // arrives and waits alike; this block sends nothing.
      asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
      merge_owned_slice<HEAD_DIM>(slice_merge, slots, &slots_landed, partition, out);
    }
    return;
  }

  const bf16* q_row = p.q + int64_t(seq) * p.q_stride;  // this sequence's q (and, fused, raw k and v)
  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  const int num_tiles = (key_end - key_begin + kTileKeys - 1) / kTileKeys;
  const int my_tiles = (num_tiles - warp + kWarpsV9 - 1) / kWarpsV9;  // tiles warp, warp + 4, ...
  const uint32_t stage0 = smem_address(smem) + uint32_t(warp * kStages * 2 * kTileBytes);
  auto k_stage = [&](int i) { return stage0 + uint32_t((i % kStages) * 2 * kTileBytes); };
  auto tile_key = [&](int i) { return key_begin + (warp + i * kWarpsV9) * kTileKeys; };
  TileCopier<HEAD_DIM> copier(p, block_table, tile_key(0), key_end, kv_head, lane);  // copies tiles 0, 1, ...

  // Fused (decode_attention_fused_cuda): chapter 04's qk_norm_rope_store for this block, with its helpers
  // (05_attention/qk_norm_rope.cuh), so the bits are those of the separate kernel. Warp w norms and rotates
  // query heads w, w + 4 of the group into q_ready; warps 2 and 3 write the new key's K and V to its slot
  // if this block's partition holds that key (the sequence's last). The new key is in the partition's last
  // tile: when the prologue below loads that tile, the write goes first; otherwise the prologue's copies
  // are issued first and the q work runs while they fly.
  __shared__ __align__(16) bf16 q_ready[8][HEAD_DIM];
  const bool new_key_here = new_slot >= 0 && key_end == seqlen_k;
  const bool write_first = new_key_here && num_tiles - 1 < kWarpsV9 * (kStages - 1);
  constexpr int HALF = HEAD_DIM / 2;
  const float* cos_row = fused ? p.cos_table + position * HALF : nullptr;
  const float* sin_row = fused ? p.sin_table + position * HALF : nullptr;
  // The factors of the norms and rotations this warp will do (q heads warp, warp + 4; warp 2 the new key).
  NormRopeFactors<HEAD_DIM> q_factors = {}, k_factors = {};
  if (fused && warp < G) q_factors = load_norm_rope_factors<HEAD_DIM>(p.q_norm, cos_row, sin_row, lane);
  if (new_key_here && warp == 2) k_factors = load_norm_rope_factors<HEAD_DIM>(p.k_norm, cos_row, sin_row, lane);
  auto write_new_key = [&] {
    const int64_t at = new_slot * int64_t(p.num_kv_heads) * HEAD_DIM + int64_t(kv_head) * HEAD_DIM;
    if (warp == 2) {
      float x1[HEAD_DIM / 64], x2[HEAD_DIM / 64];
      load_head<HEAD_DIM>(q_row + int64_t(p.num_heads + kv_head) * HEAD_DIM, x1, x2, lane);
      norm_rope_head<HEAD_DIM>(x1, x2, k_factors, p.eps);
      store_head<HEAD_DIM>(p.k_cache_out + at, x1, x2, lane);
    } else if (warp == 3) {
      copy_head<HEAD_DIM>(p.v_cache_out + at, q_row + int64_t(p.num_heads + p.num_kv_heads + kv_head) * HEAD_DIM, lane);
    }
  };

  // Prologue: the first kStages - 1 tiles in flight (one commit group each, empty past the last tile, so
  // that the wait below always counts the same number of groups). Before the wait, the tiles that end
  // before the newest key (a warp's tiles go up in keys, so those are its first ones).
  int early = 0;  // tiles issued before the wait
#pragma unroll
  for (; early < kStages - 1; early++) {
    if (early >= my_tiles || tile_key(early) + kTileKeys >= seqlen_k) break;
    copier.copy_next(k_stage(early), k_stage(early) + kTileBytes, /*before_wait=*/true);
    cp_async_commit();
  }
  wait_for_previous_kernel();
  // o_proj's merge at one sequence (next_at_wait): its blocks bring only their weights before their own wait, and
  // this grid's tile loop is one tile a warp, so let them in now (1 µs a layer on an H100; NOTES.md, "The merge
  // in o_proj lets in at attention's wait"). Otherwise after the tile loop, below.
  if (p.next_at_wait) allow_next_kernel();
  if (write_first) {
    write_new_key();
    __syncthreads();  // this step's K and V are in the cache before any warp copies a tile
  }
#pragma unroll
  for (int i = 0; i < kStages - 1; i++) {
    if (i < early) continue;  // issued above
    if (i < my_tiles) copier.copy_next(k_stage(i), k_stage(i) + kTileBytes);
    cp_async_commit();
  }

  if (fused) {
    float x1[HEAD_DIM / 64], x2[HEAD_DIM / 64];
    for (int r = warp; r < G; r += kWarpsV9) {
      load_head<HEAD_DIM>(q_row + int64_t(kv_head * G + r) * HEAD_DIM, x1, x2, lane);
      norm_rope_head<HEAD_DIM>(x1, x2, q_factors, p.eps);
      store_head<HEAD_DIM>(q_ready[r], x1, x2, lane);
    }
    if (new_key_here && !write_first) write_new_key();
    __syncthreads();  // q_ready is complete; this step's K and V are in the cache before the main loop's copies
  }

  // Q's A fragments, rows g < G (head kv_head * G + g of query row seq); rows G..15 are zeros.
  uint32_t q_frag[kSteps][2];  // a0, a2 of each k-step (a1 = a3 = 0)
  {
    const bf16* q = p.q_norm != nullptr ? q_ready[min(g, G - 1)]
                                        : q_row + int64_t(kv_head * G + min(g, G - 1)) * HEAD_DIM;
#pragma unroll
    for (int kk = 0; kk < kSteps; kk++) {
      q_frag[kk][0] = g < G ? *reinterpret_cast<const uint32_t*>(q + 16 * kk + 2 * t4) : 0u;
      q_frag[kk][1] = g < G ? *reinterpret_cast<const uint32_t*>(q + 16 * kk + 8 + 2 * t4) : 0u;
    }
  }
  // The online softmax of row g (replicated in the 4 lanes of its quad; l is this lane's part of the sum,
  // added across the quad at the end), and this lane's O^T accumulators.
  float m = -INFINITY, l = 0.0f;
  float o[kSteps][4];
#pragma unroll
  for (int mt = 0; mt < kSteps; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;

  // ldmatrix addresses: lane gives row (lane % 8) of matrix lane / 8; matrices 2, 3 are keys 8..15, and
  // matrices 1, 3 are the upper 8 dims of the 16 (K: of the k-step; V: of the m-tile).
  const int ld_row = 8 * (lane / 16) + lane % 8, ld_half = (lane / 8) % 2;

  for (int i = 0; i < my_tiles; i++) {
    // Refill the stage that tile i - 1 used: every lane has finished reading it (ldmatrix) first.
    __syncwarp();
    const int ahead = i + kStages - 1;
    if (ahead < my_tiles) copier.copy_next(k_stage(ahead), k_stage(ahead) + kTileBytes);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this lane's copies of tile i have landed
    __syncwarp();                  // ... and every other lane's, visible to the whole warp
    const uint32_t k_tile = k_stage(i), v_tile = k_tile + kTileBytes;

    // S = Q K^T for the 16 keys (n-tile 0: keys 0..7, n-tile 1: keys 8..15).
    // Two chains per n-tile, the even and the odd k-steps, added at the end: one chain of kSteps dependent
    // mma would wait kSteps mma latencies, and a warp alone on its scheduler (16 rows) has nothing else to do.
    float s2[2][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kSteps; kk++) {
      uint32_t b[4];
      ldmatrix_x4(b, k_tile + tile_offset<HEAD_DIM>(ld_row, 2 * kk + ld_half));
      const uint32_t a[4] = {q_frag[kk][0], 0u, q_frag[kk][1], 0u};
      mma_16816(s2[kk % 2][0], a, b[0], b[1]);
      mma_16816(s2[kk % 2][1], a, b[2], b[3]);
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
      for (int j = 0; j < 4; j++) s[n][j] = s2[0][n][j] + s2[1][n][j];
    // Online softmax of row g over this lane's 4 keys of the tile, then across the quad. Base 2.
    const int key0 = tile_key(i) + 2 * t4;
    float x[4] = {s[0][0], s[0][1], s[1][0], s[1][1]};  // keys key0, key0 + 1, key0 + 8, key0 + 9
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int key = key0 + (j / 2) * 8 + j % 2;
      x[j] = key < key_end ? x[j] * p.scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, x[j]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = online_softmax_rescale(m, m_new);
    float pr[4];
#pragma unroll
    for (int j = 0; j < 4; j++) pr[j] = m_new == -INFINITY ? 0.0f : exp2f(x[j] - m_new);
    l = l * alpha + (pr[0] + pr[1]) + (pr[2] + pr[3]);
    m = m_new;
    // O^T's columns are rows 2 t4 and 2 t4 + 1, whose alpha lives in the quads of lanes 8 t4 and 8 t4 + 4.
    const float alpha_lo = __shfl_sync(0xffffffffu, alpha, 8 * t4);
    const float alpha_hi = __shfl_sync(0xffffffffu, alpha, 8 * t4 + 4);
    const uint32_t b0 = pack_bf16x2(pr[0], pr[1]), b1 = pack_bf16x2(pr[2], pr[3]);  // P^T, rows g
#pragma unroll
    for (int mt = 0; mt < kSteps; mt++) {
      o[mt][0] *= alpha_lo, o[mt][1] *= alpha_hi, o[mt][2] *= alpha_lo, o[mt][3] *= alpha_hi;
      uint32_t a[4];
      ldmatrix_x4_trans(a, v_tile + tile_offset<HEAD_DIM>(ld_row, 2 * mt + ld_half));
      // ldmatrix gives (keys 0-7, dims lo), (keys 0-7, dims hi), (keys 8-15, dims lo), (keys 8-15, dims hi);
      // the A fragment wants a0 (dims lo, keys 0-7), a1 (dims hi, keys 0-7), a2 (dims lo, keys 8-15), a3.
      mma_16816(o[mt], a, b0, b1);
    }
  }
  cp_async_wait<0>();  // only empty groups remain, but leave none behind before the buffers are reused
  // Only now may the next kernel's blocks start, unless next_at_wait let them in above (o_proj: v2, v5 and v6
  // ask for all their weights as they start). Let in after the wait, they took SM slots and memory bandwidth
  // from the tile loop of the blocks still streaming K/V: at 8 sequences the step took 1.08 ms that way, 1.04
  // this way (04_model_runner/NOTES.md, section 4, "When the next kernel may start").
  allow_next_kernel();

  // Merge the 4 warps' states of rows 0..G-1 through shared memory (reusing the pipeline buffers):
  // (warps, 8) for m and l, (warps, 8, HEAD_DIM) for O.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* sm_m = reinterpret_cast<float*>(smem);
  float* sm_l = sm_m + kWarpsV9 * 8;
  float* sm_O = sm_l + kWarpsV9 * 8;
  __syncthreads();  // every warp is done with its pipeline buffers before they are overwritten
  if (t4 == 0) sm_m[warp * 8 + g] = m, sm_l[warp * 8 + g] = l;
#pragma unroll
  for (int mt = 0; mt < kSteps; mt++) {
    const int d = 16 * mt + g, r = 2 * t4;
    float* O_w = sm_O + warp * 8 * HEAD_DIM;
    O_w[r * HEAD_DIM + d] = o[mt][0], O_w[(r + 1) * HEAD_DIM + d] = o[mt][1];
    O_w[r * HEAD_DIM + d + 8] = o[mt][2], O_w[(r + 1) * HEAD_DIM + d + 8] = o[mt][3];
  }
  __syncthreads();  // every warp's state is in shared memory before any thread merges
  const WarpStates<HEAD_DIM> warps{sm_m, sm_l, sm_O};
  if (merge_in_cluster) {
    send_to_owners<HEAD_DIM>(slice_merge, warps, slots, &slots_landed, partition);
    merge_owned_slice<HEAD_DIM>(slice_merge, slots, &slots_landed, partition, out);
    return;
  }
  for (int idx = threadIdx.x; idx < G * HEAD_DIM; idx += blockDim.x) {
    const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    const float M = warps.row_max(r);
    float L = 0.0f, O = 0.0f;
    for (int w = 0; w < kWarpsV9; w++) {
      const float weight = warps.weight(w, r, M);
      L += warps.l[w * 8 + r] * weight;
      O += warps.o(w, r, d) * weight;
    }
    if (p.splits == 1) {  // v10 with one split: this block saw the whole context, so O / L is the answer
      out[r * HEAD_DIM + d] = __float2bfloat16(O / L);
      continue;
    }
    const int64_t part = (int64_t(seq) * p.num_heads + kv_head * G + r) * p.max_partitions + partition;
    if (d == 0) p.part_m[part] = M, p.part_l[part] = L;
    p.part_O[part * HEAD_DIM + d] = O;
  }
}

// Grid (max_partitions, num_kv_heads, num_seqs) of kWarpsV9 warps, kSmemBytes<HEAD_DIM, CLUSTER> of dynamic
// shared memory; CLUSTER: clusters of (max_partitions, 1, 1), one a (sequence, KV head). Without clusters, a
// grid no larger than the GPU's SM count (one sequence: 16 splits x 8 KV heads = 128 blocks) asks for more,
// which it never uses, so that its blocks land one an SM (cuda_utils.h, one_block_per_sm_launch_bytes).
// Measured (H100, batch 1): packed two to an SM on 65-72 SMs, the step took ~0.03 ms longer
// (04_model_runner/NOTES.md, section 9, "One block an SM, and the MLP's weights sooner").
template <int HEAD_DIM, bool CLUSTER>
void launch_for_head_dim(const AttentionParams& p, int num_seqs, cudaStream_t stream) {
  const dim3 grid(unsigned(p.max_partitions), unsigned(p.num_kv_heads), unsigned(num_seqs));
  constexpr int used_bytes = kSmemBytes<HEAD_DIM, CLUSTER>;
  const int blocks = int(grid.x * grid.y * grid.z);
  const int smem_bytes = CLUSTER ? used_bytes : one_block_per_sm_launch_bytes(blocks, used_bytes);
  const auto kernel = attention_v9_tensor_core_decode_kernel<HEAD_DIM, CLUSTER>;
  // Opted in once per device (cuda_utils.h): without clusters to the larger of the two sizes, since a graph
  // captured later may ask for the other.
  static PerDeviceOnce smem_once, cluster_once;
  if (CLUSTER) allow_dynamic_shared_memory(smem_once, reinterpret_cast<const void*>(kernel), used_bytes);
  else allow_one_block_per_sm(smem_once, reinterpret_cast<const void*>(kernel), used_bytes);
  // A cluster of more than 8 blocks must be asked for, once per device as the shared memory.
  if (CLUSTER && p.max_partitions > kPortableClusterSplits)
    once_per_device(cluster_once,
                    [&] { CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)); });
  // v11: the splits of a (sequence, KV head) are one cluster (grid.x == p.splits <= kMaxClusterSplits).
  launch_overlapped_in_clusters(kernel, grid, CLUSTER ? unsigned(p.max_partitions) : 1u, kWarpsV9 * 32, smem_bytes,
                                stream, p);
}

}  // namespace

void launch_tensor_core_decode_kernel(const AttentionParams& p, int num_seqs, cudaStream_t stream, bool cluster) {
  if (p.head_dim == 64) cluster ? launch_for_head_dim<64, true>(p, num_seqs, stream) : launch_for_head_dim<64, false>(p, num_seqs, stream);
  else cluster ? launch_for_head_dim<128, true>(p, num_seqs, stream) : launch_for_head_dim<128, false>(p, num_seqs, stream);
}

bool tensor_core_decode_clusters_available() { return tensor_core_decode_max_cluster() > 1; }

int tensor_core_decode_max_cluster() {
  static const int most = [] {
    cudaFuncAttributes attributes = {};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_v9_tensor_core_decode_kernel<128, true>));
    if (attributes.binaryVersion < 90) return 1;  // clusters and distributed shared memory need sm_90 code
    // 16 blocks a cluster is beyond the portable 8: the kernels must ask for it, and the GPU say it fits.
    const auto k64 = attention_v9_tensor_core_decode_kernel<64, true>;
    const auto k128 = attention_v9_tensor_core_decode_kernel<128, true>;
    const int smem_bytes = kSmemBytes<128, true>;
    CUDA_CHECK(cudaFuncSetAttribute(k128, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    if (cudaFuncSetAttribute(k64, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaFuncSetAttribute(k128, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();  // not an error: 8 it is
      return kPortableClusterSplits;
    }
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = unsigned(kMaxClusterSplits), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(kMaxClusterSplits)), config.blockDim = kWarpsV9 * 32;
    config.dynamicSmemBytes = smem_bytes, config.attrs = &cluster, config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, k128, &config) != cudaSuccess || clusters < 1) {
      (void)cudaGetLastError();
      return kPortableClusterSplits;
    }
    return kMaxClusterSplits;
  }();
  return most;
}

void launch_v9_tensor_core_decode(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  launch_tensor_core_decode_kernel(p, dims.num_seqs, stream);
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
