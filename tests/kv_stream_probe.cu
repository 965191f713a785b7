// kv_stream_probe.cu: how fast the memory system lets a decode kernel read a paged KV cache, and what of v9's
// own work (05_attention/v9_tensor_core_decode.cu) costs it bandwidth (05_attention/NOTES.md, "What the KV
// stream allows").
//
// One layer's cache as the engine lays it out: K and V each (slots, 8 KV heads, 128) bf16, slots in blocks of
// 256 whose order the block table shuffles. The grid is v9's at one split: a block of 4 warps per (sequence,
// KV head), warp w reading 16-key tiles w, w + 4, ... (4 KB of K and 4 KB of V each), 3 tiles a warp in shared
// memory (96 KB a block, 2 blocks an SM). Ten ways to read it, each timed over 20 launches:
//   cp.async          v9's copies: 16 bytes a lane and instruction into XOR-swizzled rows, one commit group a
//                     tile, then one shared-memory word a lane read (the "use")
//   bulk copy         the copy engine, one 256-byte row a lane (cp.async.bulk), counted on an mbarrier a stage
//   TMA box           the copy engine, one (16 keys x 128) box of K and one of V a tile from a tensor map
//   ld.global         16-byte loads into registers, no shared memory (the first probe of the notes)
//   + fixed costs     cp.async, plus what a v9 block does besides its tiles: its context length read from
//                     memory first, and at the end its 4 warps' (8 x 128) fp32 states merged through shared
//                     memory and 256 outputs written
//   persistent        the same work, but 2 blocks an SM walk the (sequence, KV head) items, each warp's copies
//                     running on into its next item's tiles while this item merges
//   + tensor work     cp.async, plus v9's arithmetic on every tile: 8 ldmatrix and 16 mma for S = Q K^T, a
//                     max, exponentials and 4 shuffles, 8 ldmatrix.trans and 8 mma for O^T += V^T P^T
//   bulk + tensor     the bulk copies into rows padded to 272 bytes (so that ldmatrix meets no bank conflict),
//                     plus the same arithmetic
//   head-major        cp.async as the first way, from a cache whose blocks are laid out head by head (each block
//                     of 256 slots (KV heads, 256, 128)): a head's 16-key tile is 4 KB in one piece, not 16 rows
//                     of 256 bytes 2 KB apart
//   head-major bulk   the same layout, each tile's K and V as two 4 KB bulk copies
// and then the engine's own decode attention on the same cache (05_attention/attention.h):
//   engine            decode_attention_cuda at the default version (v11: one split from 32 sequences on, v9's
//                     kernel; two at 16-31, merged in a cluster), q ready and every key in the cache
//   engine fused      decode_attention_fused_cuda: the same, with the q and k norms, RoPE and the new key's
//                     write inside (as a decode step runs it)
//   fused, no key     the same with every slot -1: the q work without the new key's write
// Each way reads a cache of one repeated value first (cudaMemset), then cp.async, + tensor work and the two
// engine ways run again on a cache of random values, whose reads toggle the memory's lines as a real cache's do.
// Last, the fused engine way once more, timed alone after part of the cache was asked of the L2 (warm_l2): the
// L2 emptied, the first 64, 128 or 256 keys of every cache block asked for in one of four ways (the copy
// engine's bulk prefetch, prefetch.global.L2 a line, the same evict-last, or real loads), then 0, 8 or 30 MB of
// other data streamed, as a layer's projections would between (04_model_runner/NOTES.md section 19;
// 05_attention/kv_warm.cu, which the engine runs, took the loads).
// Prints the copy bandwidth (cudaMemcpy, read + write) and each way's GB/s of K and V read.
// With a spread S (third argument), each sequence's context is drawn from context - S .. context + S (a fixed
// seed) and the rows come longest first, as a step of `bench` gives them (04_model_runner/NOTES.md section 12):
// then only the engine's ways run, since the probe's own kernels assume one context.
// Build and run on a GPU of compute capability 9.0, linked with the engine's objects (tests/gpu_check.sh OUT
// probe builds them with the engine and does both):
//   nvcc -O3 -arch=sm_90a -std=c++17 -I. -DNANOVLLM_CUDA tests/kv_stream_probe.cu <the engine's objects> \
//     -o build/kv_stream_probe -lcublasLt -lcublas
//   build/kv_stream_probe [sequences (256)] [context (1000)] [spread (0)]
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "01_sequence/base/ptx.cuh"
#include "04_model_runner/layers.h"
#include "05_attention/attention.h"
using namespace nanovllm;
using bf16 = __nv_bfloat16;
#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e = (x);                                                                      \
    if (e != cudaSuccess) {                                                                   \
      std::printf("error: %s at kv_stream_probe.cu:%d\n", cudaGetErrorString(e), __LINE__);  \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr int kHeadDim = 128, kKvHeads = 8, kBlockSize = 256, kTileKeys = 16, kWarps = 4, kStages = 3;
constexpr int kKvDim = kKvHeads * kHeadDim;            // elements from one slot's row to the next
constexpr int kRowBytes = kHeadDim * 2;                // one key's K (or V) of one head: 256 bytes
constexpr int kPaddedRow = kRowBytes + 16;             // rows of the bulk + tensor way
enum Way { kCpAsync, kBulk, kTmaBox, kLdGlobal, kFixedCosts, kPersistent, kTensorWork, kBulkTensorWork, kHeadMajor,
           kHeadMajorBulk };

struct Cache {
  const bf16* k;
  const bf16* v;
  const int* block_table;  // (sequences, table_width)
  const int* context_lens; // (sequences)
  int table_width, context, sequences;
  bf16* out;               // (sequences x KV heads, 2, kHeadDim): the merged outputs of the fixed-costs ways
  unsigned* sink;          // written only if the words read XOR to a value they never do: keeps the reads alive
};

// Byte offset of 16-byte chunk c of row r in a tile: v9's XOR swizzle, or the padded rows.
template <bool PADDED>
__device__ inline uint32_t tile_offset(int r, int c) {
  return PADDED ? uint32_t(r * kPaddedRow + c * 16) : uint32_t(r * kRowBytes + ((c ^ (r % 8)) * 16));
}

// v9's arithmetic on one staged tile (K at k_tile, V at v_tile), its operands from real ldmatrix reads: the
// same instructions and dependencies, with a query of ones. o and m carry from tile to tile as v9's state.
template <bool PADDED>
__device__ inline void tensor_work(uint32_t k_tile, uint32_t v_tile, float (&o)[8][4], float& m) {
  const int lane = threadIdx.x % 32, ld_row = 8 * (lane / 16) + lane % 8, ld_half = (lane / 8) % 2;
  const uint32_t q[4] = {0x3f803f80u, 0u, 0x3f803f80u, 0u};  // bf16 ones in rows 0..7, zeros below
  float s[2][2][4] = {};
#pragma unroll
  for (int kk = 0; kk < 8; kk++) {
    uint32_t b[4];
    ldmatrix_x4(b, k_tile + tile_offset<PADDED>(ld_row, 2 * kk + ld_half));
    mma_16816(s[kk % 2][0], q, b[0], b[1]);
    mma_16816(s[kk % 2][1], q, b[2], b[3]);
  }
  float x = -INFINITY;
#pragma unroll
  for (int n = 0; n < 2; n++)
#pragma unroll
    for (int j = 0; j < 4; j++) x = fmaxf(x, s[0][n][j] + s[1][n][j]);
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  const float m_new = fmaxf(m, x), alpha = exp2f(m - m_new), p = exp2f(x - m_new);
  m = m_new;
  const float alpha_lo = __shfl_sync(0xffffffffu, alpha, 0), alpha_hi = __shfl_sync(0xffffffffu, alpha, 4);
  const uint32_t pp = pack_bf16x2(p, p);
#pragma unroll
  for (int mt = 0; mt < 8; mt++) {
    o[mt][0] *= alpha_lo, o[mt][1] *= alpha_hi, o[mt][2] *= alpha_lo, o[mt][3] *= alpha_hi;
    uint32_t a[4];
    ldmatrix_x4_trans(a, v_tile + tile_offset<PADDED>(ld_row, 2 * mt + ld_half));
    mma_16816(o[mt], a, pp, pp);
  }
}

__device__ inline unsigned shared_word(uint32_t address) {
  unsigned word;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(word) : "r"(address));
  return word;
}

// Tile t of (sequence, head) for this warp: keys (warp + 4 t) * 16 .., whose first slot the block table gives.
__device__ inline int64_t first_slot(const int* table, int t) {
  const int key = (threadIdx.x / 32 + t * kWarps) * kTileKeys;
  return int64_t(table[key / kBlockSize]) * kBlockSize + key % kBlockSize;
}

// Where (slot, head)'s 128 elements start: the engine's layout, (slots, KV heads, 128), or the head-major
// one the last two ways try, each block of 256 slots as (KV heads, 256, 128), so that a head's tile of 16
// keys is 4 KB in one piece.
template <bool HEAD_MAJOR>
__device__ inline int64_t row_start(int64_t slot, int head) {
  return HEAD_MAJOR ? ((slot / kBlockSize) * kKvHeads + head) * kBlockSize * kHeadDim + (slot % kBlockSize) * kHeadDim
                    : slot * kKvDim + head * kHeadDim;
}

// cp.async of one tile's K and V into a stage (v9's copies: 16 rows x 16 chunks each, 2 rows an instruction).
template <bool PADDED, bool HEAD_MAJOR = false>
__device__ inline void copy_tile(const Cache& c, int64_t slot0, int head, uint32_t stage, uint32_t v_offset) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kTileKeys / 2; i++) {
    const int row = 2 * i + lane / 16, chunk = lane % 16;
    const int64_t at = row_start<HEAD_MAJOR>(slot0 + row, head) + chunk * 8;
    cp_async_16(stage + tile_offset<PADDED>(row, chunk), c.k + at, true);
    cp_async_16(stage + v_offset + tile_offset<PADDED>(row, chunk), c.v + at, true);
  }
}

template <Way WAY>
__global__ void __launch_bounds__(kWarps * 32) probe_kernel(Cache c, const __grid_constant__ CUtensorMap k_map,
                                                          const __grid_constant__ CUtensorMap v_map) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) uint64_t landed[kWarps][kStages];  // the copy engine's ways: a barrier a stage
  constexpr bool kPadded = WAY == kBulkTensorWork;
  constexpr uint32_t kHalf = kTileKeys * (kPadded ? kPaddedRow : kRowBytes), kStage = 2 * kHalf;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t stages = smem_address(smem) + warp * kStages * kStage;
  unsigned used = 0;

  if (WAY == kFixedCosts || WAY == kPersistent) {
    __shared__ float states[kWarps][8][kHeadDim];
    // The warp's tiles, item after item (items: (sequence, head), first, first + step, ...), walked by a
    // copier that runs kStages - 1 tiles ahead and a reader.
    const int items = c.sequences * kKvHeads;
    const int first = WAY == kFixedCosts ? int(blockIdx.z) * kKvHeads + int(blockIdx.y) : int(blockIdx.x);
    const int step = WAY == kFixedCosts ? items : int(gridDim.x);
    struct Walk { int item, t, tiles; const int* table; };
    auto begin = [&](Walk& w, int item) {
      w.item = item, w.t = 0, w.tiles = 0;
      if (item >= items) return;
      const int context = __ldcg(c.context_lens + item / kKvHeads);  // a round trip, as v9's first load
      w.tiles = ((context + kTileKeys - 1) / kTileKeys - warp + kWarps - 1) / kWarps;
      w.table = c.block_table + (item / kKvHeads) * c.table_width;
    };
    Walk copier, reader;
    begin(copier, first), begin(reader, first);
    int filled = 0, read = 0;
    auto copy_next = [&] {
      while (copier.item < items && copier.t >= copier.tiles) begin(copier, copier.item + step);
      if (copier.item < items)
        copy_tile<false>(c, first_slot(copier.table, copier.t++), copier.item % kKvHeads,
                         stages + (filled % kStages) * kStage, kHalf);
      filled++;
      cp_async_commit();
    };
    for (int i = 0; i < kStages - 1; i++) copy_next();
    while (reader.item < items) {
      for (; reader.t < reader.tiles; reader.t++, read++) {
        __syncwarp();  // every lane is done with the stage copy_next refills
        copy_next();
        cp_async_wait<kStages - 1>();
        __syncwarp();
        used ^= shared_word(stages + (read % kStages) * kStage + lane * 16);
      }
      // The merge: each warp's state through shared memory, 256 outputs a block.
      for (int r = 0; r < 8; r++)
        for (int d = lane; d < kHeadDim; d += 32) states[warp][r][d] = float(used & 0xff) + float(r);
      __syncthreads();  // every warp's state is written before any thread adds them
      for (int i = threadIdx.x; i < 2 * kHeadDim; i += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < kWarps; w++) sum += states[w][i / kHeadDim][i % kHeadDim];
        c.out[int64_t(reader.item) * 2 * kHeadDim + i] = __float2bfloat16(sum);
      }
      __syncthreads();  // the states are read before the next item writes them
      if (WAY == kFixedCosts) break;
      begin(reader, reader.item + step);
    }
    cp_async_wait<0>();
  } else {
    const int seq = blockIdx.z, head = blockIdx.y;
    const int tiles = ((c.context + kTileKeys - 1) / kTileKeys - warp + kWarps - 1) / kWarps;
    const int* table = c.block_table + seq * c.table_width;
    const uint32_t barriers = smem_address(&landed[warp][0]);
    if (WAY == kLdGlobal) {
      for (int t = 0; t < tiles; t++) {
        const int64_t slot0 = first_slot(table, t);
        uint4 k[8], v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const int64_t at = (slot0 + 2 * i + lane / 16) * kKvDim + head * kHeadDim + (lane % 16) * 8;
          k[i] = __ldcg(reinterpret_cast<const uint4*>(c.k + at));
          v[i] = __ldcg(reinterpret_cast<const uint4*>(c.v + at));
        }
#pragma unroll
        for (int i = 0; i < 8; i++) used ^= k[i].x ^ k[i].w ^ v[i].y ^ v[i].z;
      }
    } else {
      constexpr bool kEngine = WAY == kBulk || WAY == kTmaBox || WAY == kBulkTensorWork || WAY == kHeadMajorBulk;
      if (kEngine) {
        if (lane == 0)
          for (int s = 0; s < kStages; s++) mbarrier_init(barriers + 8 * s);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        __syncwarp();
      }
      auto copy = [&](int t) {
        const uint32_t stage = stages + (t % kStages) * kStage, barrier = barriers + 8 * (t % kStages);
        if (t < tiles) {
          const int64_t slot0 = first_slot(table, t);
          if (WAY == kBulk || WAY == kBulkTensorWork) {
            if (lane == 0) mbarrier_arrive_expecting(barrier, 2 * kTileKeys * kRowBytes);
            __syncwarp();  // the bytes are announced before any lands
            const int row = lane % 16;
            const bf16* src = (lane < 16 ? c.k : c.v) + (slot0 + row) * kKvDim + head * kHeadDim;
            bulk_copy_to_shared(stage + (lane < 16 ? 0 : kHalf) + row * (kPadded ? kPaddedRow : kRowBytes), src,
                                kRowBytes, barrier);
          } else if (WAY == kHeadMajorBulk) {  // the tile's K and V, 4 KB each in one piece: two copies
            if (lane == 0) {
              mbarrier_arrive_expecting(barrier, 2 * kTileKeys * kRowBytes);
              bulk_copy_to_shared(stage, c.k + row_start<true>(slot0, head), kTileKeys * kRowBytes, barrier);
              bulk_copy_to_shared(stage + kHalf, c.v + row_start<true>(slot0, head), kTileKeys * kRowBytes, barrier);
            }
          } else if (WAY == kTmaBox) {
            if (lane == 0) {
              mbarrier_arrive_expecting(barrier, 2 * kTileKeys * kRowBytes);
              for (int kv = 0; kv < 2; kv++)
                asm volatile(
                    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                    "%3}], [%4];\n" ::"r"(stage + kv * kHalf),
                    "l"(reinterpret_cast<uint64_t>(kv == 0 ? &k_map : &v_map)), "r"(head * kHeadDim), "r"(int(slot0)),
                    "r"(barrier)
                    : "memory");
            }
          } else {
            copy_tile<kPadded, WAY == kHeadMajor>(c, slot0, head, stage, kHalf);
          }
        }
        if (!kEngine) cp_async_commit();
      };
      float o[8][4] = {}, m = -INFINITY;
      for (int t = 0; t < kStages - 1; t++) copy(t);
      for (int t = 0; t < tiles; t++) {
        __syncwarp();  // every lane is done with the stage copy refills
        copy(t + kStages - 1);
        if (kEngine) mbarrier_wait(barriers + 8 * (t % kStages), (t / kStages) % 2);
        else cp_async_wait<kStages - 1>();
        __syncwarp();
        const uint32_t stage = stages + (t % kStages) * kStage;
        if (WAY == kTensorWork || WAY == kBulkTensorWork) {
          tensor_work<kPadded>(stage, stage + kHalf, o, m);
        } else {
          used ^= shared_word(stage + lane * 16);
        }
      }
      if (!kEngine) cp_async_wait<0>();
      for (int mt = 0; mt < 8; mt++) used ^= __float_as_uint(o[mt][0] + o[mt][3]);
    }
  }
  if (used == 0x9e3779b9u) c.sink[0] = used;
}

// Asks the L2 for the first `keys` slots of every block of the cache each sequence's table names (K and V), so
// that each split of the engine's grid finds about the same share of its keys there. One block per (table
// entry, sequence); `how` is the way it asks:
//   0 bulk      one cp.async.bulk.prefetch.L2 of the whole run from thread 0 (the copy engine; no data returns)
//   1 lines     prefetch.global.L2 on every 128-byte line, the block's threads in turn
//   2 last      the same, marked evict-last, so that a stream read between the asking and attention evicts
//               other lines first
//   3 loads     real 16-byte loads into registers, XORed into the sink: lines that surely were read
__global__ void warm_l2(Cache c, int keys, int how) {
  const int entry = blockIdx.x, s = blockIdx.y;
  const int valid = min(keys, c.context_lens[s] - entry * kBlockSize);
  if (valid <= 0) return;
  const size_t first = size_t(c.block_table[s * c.table_width + entry]) * kBlockSize * kKvDim;
  const uint32_t bytes = uint32_t(valid) * kKvDim * sizeof(bf16);
  for (const bf16* base : {c.k + first, c.v + first}) {
    const char* run = reinterpret_cast<const char*>(base);
    if (how == 0) {
      if (threadIdx.x == 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(run), "r"(bytes) : "memory");
    } else if (how == 1 || how == 2) {
      for (uint32_t at = threadIdx.x * 128; at < bytes; at += blockDim.x * 128) {
        if (how == 1)
          asm volatile("prefetch.global.L2 [%0];\n" ::"l"(run + at));
        else
          asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(run + at));
      }
    } else {
      uint4 x = {0, 0, 0, 0};
      for (uint32_t at = threadIdx.x * 16; at < bytes; at += blockDim.x * 16) {
        const uint4 y = *reinterpret_cast<const uint4*>(run + at);
        x.x ^= y.x, x.y ^= y.y, x.z ^= y.z, x.w ^= y.w;
      }
      if ((x.x ^ x.y ^ x.z ^ x.w) == 0x9e3779b9u) *c.sink = x.x;
    }
  }
}

// Reads n 16-byte words once, as a projection reads its weights (or, four times the L2, to empty it).
__global__ void stream_through(const uint4* data, size_t n, unsigned* sink) {
  uint4 x = {0, 0, 0, 0};
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 y = data[i];
    x.x ^= y.x, x.y ^= y.y, x.z ^= y.z, x.w ^= y.w;
  }
  if ((x.x ^ x.y ^ x.z ^ x.w) == 0x9e3779b9u) *sink = x.x;
}

// Element i of a bf16 array: a random value in (-2, 2) from a hash of i and seed (xorshift-multiply).
__global__ void fill_random(bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9e3779b1u ^ uint32_t(i >> 32) ^ seed;
    h ^= h >> 15, h *= 0x2c1b3c6du, h ^= h >> 12, h *= 0x297a2d39u, h ^= h >> 15;
    x[i] = __float2bfloat16(float(int32_t(h)) * (2.0f / 2147483648.0f));
  }
}

int main(int argc, char** argv) {
  const int sequences = argc > 1 ? std::atoi(argv[1]) : 256, context = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int spread = argc > 3 ? std::atoi(argv[3]) : 0;
  if (sequences < 1 || context < 1 || spread < 0 || spread >= context) {
    std::fprintf(stderr, "error: sequences %d, context %d, spread %d: want sequences >= 1, context >= 1 and 0 <= spread < context\n",
                 sequences, context, spread);
    return 1;
  }
  const int max_context = context + spread;  // the longest context; every row's table is this wide
  std::vector<int> lens(sequences, context);
  if (spread > 0) {
    std::mt19937 draw(11);
    std::uniform_int_distribution<int> length(context - spread, context + spread);
    for (int& len : lens) len = length(draw);
    std::sort(lens.begin(), lens.end(), [](int a, int b) { return a > b; });
  }
  const int table_width = (max_context + kBlockSize - 1) / kBlockSize, blocks = sequences * table_width;
  const size_t slots = size_t(blocks) * kBlockSize, bytes = slots * kKvDim * sizeof(bf16);
  bf16 *k, *v, *out;
  int *block_table, *context_lens;
  unsigned* sink;
  CK(cudaMalloc(&k, bytes));
  CK(cudaMalloc(&v, bytes));
  CK(cudaMemset(k, 0x3c, bytes));
  CK(cudaMemset(v, 0x3c, bytes));
  CK(cudaMalloc(&out, size_t(sequences) * kKvHeads * 2 * kHeadDim * sizeof(bf16)));
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  std::vector<int> table(blocks);
  for (int i = 0; i < blocks; i++) table[i] = i;
  std::shuffle(table.begin(), table.end(), std::mt19937(7));  // a cache's blocks come in any order
  CK(cudaMalloc(&block_table, blocks * sizeof(int)));
  CK(cudaMalloc(&context_lens, sequences * sizeof(int)));
  CK(cudaMemcpy(block_table, table.data(), blocks * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(context_lens, lens.data(), sequences * sizeof(int), cudaMemcpyHostToDevice));
  const Cache cache{k, v, block_table, context_lens, table_width, context, sequences, out, sink};

  // The TMA way's tensor maps: (slots, kKvDim) bf16 matrices, boxes of (16 keys, 128).
  void* encode_fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode_fn, 12000, cudaEnableDefault, &found));
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_fn);
  CUtensorMap k_map, v_map;
  const cuuint64_t size[2] = {cuuint64_t(kKvDim), cuuint64_t(slots)}, row_bytes[1] = {cuuint64_t(kKvDim) * 2};
  const cuuint32_t box[2] = {kHeadDim, kTileKeys}, element_strides[2] = {1, 1};
  for (auto [map, base] : {std::pair{&k_map, k}, std::pair{&v_map, v}})
    if (encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, size, row_bytes, box, element_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      std::printf("error: cuTensorMapEncodeTiled failed\n");
      return 1;
    }

  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  {
    void* copy;
    CK(cudaMalloc(&copy, bytes));
    CK(cudaMemcpy(copy, k, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(start));
    for (int i = 0; i < 5; i++) CK(cudaMemcpy(copy, k, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    if (spread > 0)
      std::printf("%d sequences, contexts %d-%d (longest first): ", sequences, context - spread, context + spread);
    else
      std::printf("%d sequences, context %d: ", sequences, context);
    std::printf("copy bandwidth %.0f GB/s (read + write)\n", 2.0 * double(bytes) * 5 / ms / 1e6);
    CK(cudaFree(copy));
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double keys = 0;
  for (int len : lens) keys += len;
  const double read = keys * kKvHeads * kRowBytes * 2;  // K and V
  auto run = [&](auto kernel, const char* name, bool persistent, bool padded) {
    const int smem = kWarps * kStages * 2 * kTileKeys * (padded ? kPaddedRow : kRowBytes);
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid = persistent ? dim3(unsigned(std::min(2 * sms, sequences * kKvHeads)))
                                 : dim3(1, unsigned(kKvHeads), unsigned(sequences));
    kernel<<<grid, kWarps * 32, smem>>>(cache, k_map, v_map);
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(start));
    for (int i = 0; i < 20; i++) kernel<<<grid, kWarps * 32, smem>>>(cache, k_map, v_map);
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("  %-16s %8.1f us a pass %6.0f GB/s\n", name, ms * 1000 / 20, read * 20 / ms / 1e6);
  };
  if (spread == 0) {
    run(probe_kernel<kCpAsync>, "cp.async", false, false);
    run(probe_kernel<kBulk>, "bulk copy", false, false);
    run(probe_kernel<kTmaBox>, "TMA box", false, false);
    run(probe_kernel<kLdGlobal>, "ld.global", false, false);
    run(probe_kernel<kFixedCosts>, "+ fixed costs", false, false);
    run(probe_kernel<kPersistent>, "persistent", true, false);
    run(probe_kernel<kTensorWork>, "+ tensor work", false, false);
    run(probe_kernel<kBulkTensorWork>, "bulk + tensor", false, true);
    run(probe_kernel<kHeadMajor>, "head-major", false, false);
    run(probe_kernel<kHeadMajorBulk>, "head-major bulk", false, false);
  }

  // The engine's decode attention on the same cache: qkv rows and the norms' weights of random values, RoPE's
  // tables for every position, each sequence's newest key (its context - 1) at its slot of the shuffled table.
  const AttentionShape shape{2 * kKvHeads, kKvHeads, kHeadDim, kBlockSize, 0.08838834764f};
  const int q_dim = shape.num_heads * kHeadDim, qkv_dim = q_dim + 2 * kKvDim;
  bf16 *qkv, *attn_out, *norms;
  float *tables, *scratch;
  int *positions, *new_slots, *no_slots;
  CK(cudaMalloc(&qkv, size_t(sequences) * qkv_dim * sizeof(bf16)));
  CK(cudaMalloc(&attn_out, size_t(sequences) * q_dim * sizeof(bf16)));
  CK(cudaMalloc(&norms, 2 * kHeadDim * sizeof(bf16)));
  CK(cudaMalloc(&tables, size_t(max_context) * kHeadDim * sizeof(float)));  // cos then sin, (max_context, 64) each
  CK(cudaMalloc(&scratch, decode_attention_scratch_bytes(sequences, max_context, shape)));
  CK(cudaMalloc(&positions, sequences * sizeof(int)));
  CK(cudaMalloc(&new_slots, sequences * sizeof(int)));
  CK(cudaMalloc(&no_slots, sequences * sizeof(int)));
  CK(cudaMemset(no_slots, 0xff, sequences * sizeof(int)));  // -1: no new key to write
  fill_random<<<256, 256>>>(qkv, size_t(sequences) * qkv_dim, 1);
  fill_random<<<1, 256>>>(norms, 2 * kHeadDim, 2);
  {
    std::vector<float> cos_table, sin_table;
    build_rope_table(cos_table, sin_table, max_context, kHeadDim, 1e6);  // Qwen3's theta
    const size_t half = cos_table.size() * sizeof(float);
    CK(cudaMemcpy(tables, cos_table.data(), half, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tables + cos_table.size(), sin_table.data(), half, cudaMemcpyHostToDevice));
    std::vector<int> pos(sequences), slot(sequences);
    for (int s = 0; s < sequences; s++) {
      pos[s] = lens[s] - 1;
      slot[s] = table[size_t(s) * table_width + pos[s] / kBlockSize] * kBlockSize + pos[s] % kBlockSize;
    }
    CK(cudaMemcpy(positions, pos.data(), sequences * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(new_slots, slot.data(), sequences * sizeof(int), cudaMemcpyHostToDevice));
  }
  const QkNormRopeInputs qk{norms, norms + kHeadDim, tables, tables + size_t(max_context) * kHeadDim / 2, positions,
                            new_slots, 1e-6f};
  QkNormRopeInputs qk_no_key = qk;
  qk_no_key.slot_mapping = no_slots;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto run_engine = [&](bool fused, const char* name, bool new_key = true) {
    auto once = [&] {
      if (fused)
        decode_attention_fused_cuda(attn_out, q_dim, qkv, qkv_dim, k, v, context_lens, block_table, table_width,
                                    sequences, max_context, shape, scratch, kAttentionVersionDefault,
                                    new_key ? qk : qk_no_key, stream);
      else
        decode_attention_cuda(attn_out, q_dim, qkv, qkv_dim, k, v, context_lens, block_table, table_width, sequences,
                              max_context, shape, scratch, kAttentionVersionDefault, stream);
    };
    once();
    CK(cudaStreamSynchronize(stream));
    CK(cudaEventRecord(start, stream));
    for (int i = 0; i < 20; i++) once();
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("  %-16s %8.1f us a pass %6.0f GB/s\n", name, ms * 1000 / 20, read * 20 / ms / 1e6);
  };
  // The splits as the engine's decode_params sets them: v11 takes cluster_decode_splits up to the largest
  // cluster, v10 (and v11 without clusters) decode_splits.
  const int version = attention_version_for(AttentionPhase::Decode, kAttentionVersionDefault, shape);
  const int most = tensor_core_decode_max_cluster();
  const int splits = version == 11 && most > 1 ? std::min(cluster_decode_splits(sequences, shape), most)
                                               : decode_splits(sequences, shape);
  std::printf("  (engine: decode version %d, %d split(s))\n", version, splits);
  run_engine(false, "engine");
  run_engine(true, "engine fused");
  run_engine(true, "fused, no key", false);

  std::printf("  a cache of random values:\n");
  fill_random<<<1024, 256>>>(k, slots * kKvDim, 3);
  fill_random<<<1024, 256>>>(v, slots * kKvDim, 4);
  CK(cudaDeviceSynchronize());
  if (spread == 0) {
    run(probe_kernel<kCpAsync>, "cp.async", false, false);
    run(probe_kernel<kTensorWork>, "+ tensor work", false, false);
  }
  run_engine(false, "engine");
  run_engine(true, "engine fused");

  // Does part of the cache asked of the L2 beforehand reach attention? Between two attentions a step's
  // projections leave the memory mostly idle (04_model_runner/NOTES.md, section 13), time in which some of the
  // next layer's K/V could come into the L2. Each pass: the L2 emptied (four times its size streamed through),
  // the first `keys` slots of every cache block asked for (a way of warm_l2), `between` MB of other data streamed
  // (a layer's projections read 8 MB for qkv alone, 30 MB for all four), then the engine's fused attention,
  // timed alone; the median of 9 passes. The warm kernel's own time is given after an emptied L2 as well.
  int l2_bytes = 0;
  CK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
  const size_t empty_words = 4 * size_t(l2_bytes) / 16, between_words_max = (size_t(30) << 20) / 16;
  uint4 *emptier, *weights;
  CK(cudaMalloc(&emptier, empty_words * 16));
  CK(cudaMalloc(&weights, between_words_max * 16));
  CK(cudaMemset(emptier, 1, empty_words * 16));
  CK(cudaMemset(weights, 2, between_words_max * 16));
  cudaEvent_t warm_start, warm_stop;
  CK(cudaEventCreate(&warm_start));
  CK(cudaEventCreate(&warm_stop));
  std::printf("  part of the cache asked of the L2 first (L2 %d MB; attention alone, median of 9 passes, us):\n",
              l2_bytes >> 20);
  std::printf("  %-8s %6s %8s | %9s %9s %9s | %s\n", "way", "keys", "MB", "0 MB", "8 MB", "30 MB",
              "the warm kernel alone, us");
  const char* way_names[] = {"bulk", "lines", "last", "loads"};
  const int grid_blocks = 4 * sms;
  for (int how = -1; how < 4; how++)
    for (int keys : {64, 128, 256}) {
      if (how < 0 && keys != 64) continue;  // the baseline: nothing asked for
      double warmed = 0;
      for (int len : lens)
        for (int e = 0; e * kBlockSize < len; e++) warmed += std::min(keys, len - e * kBlockSize);
      warmed *= kKvDim * sizeof(bf16) * 2;
      std::printf("  %-8s %6d %8.1f |", how < 0 ? "none" : way_names[how], how < 0 ? 0 : keys, how < 0 ? 0.0 : warmed / 1e6);
      float warm_us = 0;
      for (size_t between_mb : {0, 8, 30}) {
        std::vector<float> times;
        for (int pass = 0; pass < 9; pass++) {
          stream_through<<<grid_blocks, 256, 0, stream>>>(emptier, empty_words, sink);
          CK(cudaEventRecord(warm_start, stream));
          if (how >= 0)
            warm_l2<<<dim3(unsigned(table_width), unsigned(sequences)), 256, 0, stream>>>(cache, keys, how);
          CK(cudaEventRecord(warm_stop, stream));
          if (between_mb > 0)
            stream_through<<<grid_blocks, 256, 0, stream>>>(weights, (between_mb << 20) / 16, sink);
          CK(cudaEventRecord(start, stream));
          decode_attention_fused_cuda(attn_out, q_dim, qkv, qkv_dim, k, v, context_lens, block_table, table_width,
                                      sequences, max_context, shape, scratch, kAttentionVersionDefault, qk, stream);
          CK(cudaEventRecord(stop, stream));
          CK(cudaEventSynchronize(stop));
          float ms = 0, warm_ms = 0;
          CK(cudaEventElapsedTime(&ms, start, stop));
          CK(cudaEventElapsedTime(&warm_ms, warm_start, warm_stop));
          times.push_back(ms * 1000);
          if (between_mb == 0 && pass == 4) warm_us = warm_ms * 1000;
        }
        std::sort(times.begin(), times.end());
        std::printf(" %9.1f", times[4]);
      }
      std::printf(" | %.1f\n", warm_us);
    }
  CK(cudaGetLastError());
  return 0;
}
