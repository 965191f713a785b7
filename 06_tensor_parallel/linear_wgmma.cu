// linear_wgmma.cu: v6 of the projection, y (n, out) = x (n, in) @ W (out, in)^T on Hopper's warpgroup
// tensor cores (wgmma, sm_90a) fed by its copy engine (TMA): written for the decode batches of 9 to 512
// rows, where cuBLAS streams the weights at a third of the copy bandwidth. Measured on the H200 a decode
// step is 4-9% faster with it from 9 to 16 rows, as fast at 24-32, 3% faster at 48 and slower from 64 on
// (04_model_runner/NOTES.md, section 2), so CudaLinear uses it for 9 to 48 rows (kWgmmaFasterRows), up
// to 192 for the projections with few outputs (kWgmmaNarrowRows) and up to 128 for gate_up with its SiLU
// (kWgmmaSiluRows), and for the LM head at 9-128 rows with the sampler in its ending (linear_sample_cuda:
// no logits written; kWgmmaSampleMinRows): the book's Hopper GEMM, and the starting point of a faster one.
//
// Why another GEMM. At 16-256 rows cuBLAS took 27-32 µs a layer for Qwen3-0.6B's four projections, whose
// 31 MB of weights take 7.5 µs at the copy bandwidth (04_model_runner/NOTES.md, section 6). v4 (64 x 64
// tiles, mma.sync) lost to it because small tiles reread x and W from L2 once per neighbouring tile: at
// n = 256 its qkv call pulled ~56 MB from L2 for 8 MB of weights. So here a block's tile is as tall as the
// batch up to 128 rows (2 warpgroups of 64; the kernel takes up to 4, which only a plan of one's own asks
// for) against 64 or 128 rows of W: every weight is read from memory once; x, the small operand, is what
// the output tiles share (reread from L2 once per tile). Above 128 rows linear_wgmma_plan takes row tiles
// of one warpgroup, two small blocks an SM, and W is reread from L2 once per row tile.
//
// Few, tall tiles are too few blocks (o_proj has 1,024 outputs: 16 tiles of 64), so the in_features are
// split too: the `splits` blocks of one output tile are one thread-block cluster, each adds up a range of
// in_features, leaves its fp32 tile in its own shared memory, and the cluster adds the tiles through
// distributed shared memory (each block a share of the rows, in split order: the same bits whatever
// block finishes first). No partials in memory, no second kernel. (Except PARTIALS below, linear version
// 8, the default for o_proj and down_proj at 17-192 rows: each split writes its fp32 tile to memory and
// the norm after the projection adds them.)
//
// Inside a block. Stages of 64 in_features (one 128-byte row per operand row), up to 4, all requested at
// the start: thread 0 asks the copy engine for each stage's two boxes (W's rows, x's rows), which it writes
// into shared memory laid out as wgmma's 128-byte swizzle wants it (16-byte chunk c of row r at chunk
// c ^ (r % 8) of its row, in 1,024-byte groups of 8 rows) and counts on the stage's mbarrier. Warpgroup w
// (128 threads) waits for the barrier, then issues 4 wgmma.m64nBNk16: its 64 rows of x (A, 64 x 16)
// times the block's BN rows of W (B, BN x 16), both read by the tensor cores straight from shared memory
// through a 64-bit descriptor (address, stride between 8-row groups, swizzle mode), accumulating 64 x BN
// fp32 in registers (BN / 2 per thread). It waits for those products to finish (wgmma.wait_group) only
// before the stage is refilled and at the end: the next stage's products queue behind them on the same
// accumulators. W is (out, in) with in contiguous, as is x: both operands are "K-major", the layout wgmma
// reads without a transpose. (The first version loaded with cp.async, each thread its 16-byte chunks:
// commit 282a2cd; the copy engine made it 6-10% faster at 256 rows.)
//
// This is v6 of the projection's versions (linear.h lists them all; version 8 is v6 with its split-K sum left to
// the norm after it, the PARTIALS kind below). CPU reference: linear_cpu. Prediction and measurement:
// 04_model_runner/NOTES.md, section 2.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include "01_sequence/base/ptx.cuh"
#include "06_tensor_parallel/linear.h"
#include "07_sampler/sample_tile.cuh"

namespace nanovllm {
namespace {

constexpr int kStageIn = 64;       // in_features per pipeline stage: 128 bytes of bf16, one swizzle row
constexpr int kPipelineMax = 196608;  // bytes of stages a block may hold (of the SM's 227 KB)
constexpr int kSweptSms = 132;        // the SMs of the H200 on which the plans above 48 rows were swept
constexpr int kMaxSplits = kWgmmaMaxSplits;  // blocks per cluster: the largest portable cluster

// The shape of a block: WG warpgroups, each 64 rows of x; BN rows of W (outputs); at most MAX_STAGES
// stages (for the sampling ending 2 at one warpgroup, 50 KB: four blocks an SM, and 3 at two; 04_model_runner/
// NOTES.md, section 5, "Two stages for the sampled LM head").
template <int WG>
constexpr int kSampleStages = WG == 1 ? 2 : 3;  // the sampling ending's
template <int BN, int WG, int MAX_STAGES = 4>
struct Block {
  static constexpr int kThreads = 128 * WG;
  static constexpr int kRows = 64 * WG;
  static constexpr int kWBytes = BN * 128;    // one stage of W: (BN, 64) bf16
  static constexpr int kXBytes = kRows * 128;  // one stage of x: (kRows, 64) bf16
  static constexpr int kStageBytes = kWBytes + kXBytes;
  // As many stages as fit, up to 4: a split is rarely deeper (qkv at 16 rows: 4 stages of 64), so most
  // blocks issue every copy they will make at once, and then only wait. (Up to 8 was slower at 16 rows:
  // a block of 192 KB leaves room for fewer clusters, so the plan split less.)
  static constexpr int kStages = kPipelineMax / kStageBytes < MAX_STAGES ? kPipelineMax / kStageBytes : MAX_STAGES;
  static constexpr int kSumStride = BN + 8;  // floats per row of the fp32 tile the cluster adds up (+8: no
                                             // bank conflicts when a warp stores its float2 pairs)
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kSumBytes = kRows * kSumStride * 4;
  // + 1 KB: the dynamic shared memory is aligned up to 1,024 bytes, which the swizzle's 8-row groups need.
  static constexpr int kSmemBytes = (kPipelineBytes > kSumBytes ? kPipelineBytes : kSumBytes) + 1024;
};

// The device code below exists in the sm_90a pass only (and in the host pass, which never calls it): the
// passes for other GPUs compile the kernel empty, and linear_wgmma_available keeps CudaLinear from it.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The copy engine (TMA). A tensor map (built on the host, tensor_map below) describes a (rows, in) bf16
// matrix in global memory and a box of (box rows, 64 in_features); one instruction from one thread copies
// a box at (k0, row0) into shared memory, 128-byte swizzled as wgmma reads it, filling with zeros what
// lies past the matrix, and counts the bytes it delivered on an mbarrier in shared memory. The block's
// threads wait on that barrier's phase: no thread issues or tracks individual 16-byte copies.
__device__ inline void tma_load(uint32_t dst, const CUtensorMap* map, int k0, int row0, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(barrier)
      : "memory");
}
// tma_load under an L2 cache policy (l2_evict_first_policy, 01_sequence/base/ptx.cuh), the same bytes.
__device__ inline void tma_load(uint32_t dst, const CUtensorMap* map, int k0, int row0, uint32_t barrier,
                                uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(barrier), "l"(policy)
      : "memory");
}
// wgmma's shared-memory descriptor for a K-major operand in the 128-byte swizzle (01_sequence/base/ptx.cuh,
// wgmma_descriptor): the k-th 16-wide slice of a stage starts 32 k bytes into its rows.
__device__ inline uint64_t swizzled_operand(uint32_t address) { return wgmma_descriptor(address); }

// d (64 x BN, fp32, the warpgroup's accumulators) += A (64 x 16, bf16) B (BN x 16, bf16)^T, both from
// shared memory. d[i] of thread t of the warpgroup is row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 (t % 4) + i % 2: the mma.sync C fragment, once per 8 columns, per warp of 16 rows.
// The operands after the descriptors: scale-d, a predicate, true (add to d: the accumulators start at
// zero), the scales of A and B (1, not negated), their transposes (0: both K-major). All 128 threads of
// the warpgroup issue it together; it only starts the product (see wgmma.commit_group / wait_group).
template <int BN>
__device__ inline void wgmma_bf16(float (&d)[BN / 2], uint64_t a, uint64_t b);

#define NANOVLLM_D8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])

template <>
__device__ inline void wgmma_bf16<64>(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : NANOVLLM_D8(0), NANOVLLM_D8(8), NANOVLLM_D8(16), NANOVLLM_D8(24)
      : "l"(a), "l"(b), "r"(1));
}

template <>
__device__ inline void wgmma_bf16<128>(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
      "%63}, %64, %65, accumulate, 1, 1, 0, 0;\n}\n"
      : NANOVLLM_D8(0), NANOVLLM_D8(8), NANOVLLM_D8(16), NANOVLLM_D8(24), NANOVLLM_D8(32), NANOVLLM_D8(40),
        NANOVLLM_D8(48), NANOVLLM_D8(56)
      : "l"(a), "l"(b), "r"(1));
}
#undef NANOVLLM_D8

#endif  // the host pass or sm_90a

// y (n, out) OutT = x (n, in) bf16 @ W (out, in)^T bf16, read through x_map (boxes of (64 WG, 64)) and w_map
// (boxes of (BN, 64); SILU (BN / 2, 64)); in % 8 == 0, no split empty, Block's kSmemBytes of dynamic shared
// memory. Grid (splits, out tiles of BN, row tiles of 64 WG), clusters of (splits, 1, 1) (SAMPLE and PARTIALS:
// no clusters). Block (split, o, r):
// rows [r 64 WG, ...) x outputs [o BN, ...) of y over in_features [split * k_tiles_per_split * 64, ...).
// The stages are refilled after their wgmma, not before: every stage is in flight from the start.
//
// SILU: the MLP's gate_up projection followed by its activation, y (n, out / 2) = silu(gate) * up, where
// W = [gate; up] (out / 2 rows each). Block o then takes gate rows [o BN / 2, ...) and the up rows at the
// same place in the second half, one box of BN / 2 rows each, side by side in the stage: its tile's columns
// j and j + BN / 2 are one output feature's gate and up, held by the same thread (acc[i] and acc[i + BN / 4]).
// Each is rounded to bf16, as the projection would store it, before silu_times: the same bits as the
// projection followed by silu_and_mul_kernel.
//
// SAMPLE (one split, BN = 128, OutT float): the LM head with the sampler in its ending (linear_sample_cuda).
// W is the head's (vocab, in) weight; the block's fp32 tile goes to shared memory and 07_sampler's
// sample_tile scores it into `sampling`'s per-row keys. y (n, vocab) receives only the rows sample_tile
// writes (top-k / top-p rows, or all with sampling.all_logits). Blocks of 2 stages at one warpgroup (up to
// 64 rows; four blocks an SM) and 3 at two (two an SM): a block's ending then overlaps the other blocks'
// copies (04_model_runner/NOTES.md, section 5).
//
// PARTIALS (OutT float, not SILU; linear version 8): no sum in the cluster, and no cluster. Each split's fp32
// tile goes to its own slice of y, (splits, n, out), and the norm after the projection adds the slices
// (add_rmsnorm_partials_cuda, 04_model_runner/layers.h).
template <int BN, int WG, class OutT, bool SILU, bool SAMPLE = false, bool PARTIALS = false>
__global__ void __launch_bounds__(128 * WG, SAMPLE ? 2 : 1)
    linear_wgmma_kernel(OutT* y, const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                        int n, int in, int out, int k_tiles_per_split, TileSampling sampling) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using B = Block<BN, WG, SAMPLE ? kSampleStages<WG> : 4>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw), base = (raw + 1023u) & ~1023u;
  const int split = int(blockIdx.x), splits = int(gridDim.x), out0 = int(blockIdx.y) * BN,
            row0 = int(blockIdx.z) * B::kRows;
  const int half = out / 2, gate0 = int(blockIdx.y) * (BN / 2);  // SILU: W's up rows start at `half`
  constexpr int kStages = B::kStages;
  const int t_begin = split * k_tiles_per_split;
  const int k_tiles = min((in + kStageIn - 1) / kStageIn, t_begin + k_tiles_per_split) - t_begin;  // >= 1
  auto w_stage = [&](int s) { return base + uint32_t(s * B::kStageBytes); };
  auto x_stage = [&](int s) { return base + uint32_t(s * B::kStageBytes + B::kWBytes); };
  __shared__ uint64_t landed[kStages];  // landed[s]: all of stage s (W's box, or SILU's gate and up boxes,
                                        // and x's box) is in shared memory; one phase per fill
  auto barrier = [&](int t) { return smem_address(&landed[t % kStages]); };
  // Thread 0 issues the copies. load_w announces the whole stage's bytes (W's and x's) on its barrier and
  // copies W; load_x, issued after the wait, completes the same phase.
  // W's lines are the first the L2 evicts: a step reads each weight once (a row tile each above 128 rows), and
  // what the L2 should keep instead is the next attention's keys that kv_warm_cuda loads beside these kernels
  // (05_attention/kv_warm.cu). Measured on an H100 with it (04_model_runner/NOTES.md, section 19): the graph
  // step 1.410 against 1.447 ms at 16 rows with the warm's budget doubled, 3.279 against 3.293 at 64, and 0.2%
  // slower at 128 rows. The mark kept to 64 rows and left off above measured no different at 128 and 192 rows,
  // where the row tiles reread W (the same section, "A faster warm").
  const uint64_t w_policy = l2_evict_first_policy();
  auto load_w = [&](int t) {
    mbarrier_arrive_expecting(barrier(t), B::kStageBytes);
    if (SILU) {  // boxes of BN / 2 rows: the gate rows, then the up rows (8-row swizzle groups: no seam)
      tma_load(w_stage(t % kStages), &w_map, (t_begin + t) * kStageIn, gate0, barrier(t), w_policy);
      tma_load(w_stage(t % kStages) + uint32_t(BN / 2 * 128), &w_map, (t_begin + t) * kStageIn, half + gate0,
               barrier(t), w_policy);
    } else {
      tma_load(w_stage(t % kStages), &w_map, (t_begin + t) * kStageIn, out0, barrier(t), w_policy);
    }
  };
  auto load_x = [&](int t) { tma_load(x_stage(t % kStages), &x_map, (t_begin + t) * kStageIn, row0, barrier(t)); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) mbarrier_init(smem_address(&landed[s]));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
  }
  __syncthreads();  // no thread waits on a barrier before it is initialised

  // Launched overlapped: W is nobody's output, so the weight boxes start before the wait; x is the
  // previous kernel's output. Every stage is in flight from the start; a stage is refilled once every
  // warpgroup is done with it.
  if (threadIdx.x == 0)
    for (int t = 0; t < kStages && t < k_tiles; t++) load_w(t);
  wait_for_previous_kernel();
  allow_next_kernel();
  if (threadIdx.x == 0)
    for (int t = 0; t < kStages && t < k_tiles; t++) load_x(t);
  // SAMPLE: the rows' settings, and their keys as other blocks have left them so far (read from L2, not
  // L1: fresher), staged while the copies land; read after the barrier before the ending.
  __shared__ SamplingRow tile_rows[SAMPLE ? B::kRows : 1];
  __shared__ unsigned long long tile_keys[SAMPLE ? B::kRows : 1];
  if (SAMPLE && int(threadIdx.x) < B::kRows) {
    const int r = row0 + int(threadIdx.x);
    tile_rows[threadIdx.x] = r < n ? sampling.rows[r] : SamplingRow{};
    tile_keys[threadIdx.x] = r < n ? __ldcg(sampling.best_keys + r) : 0ull;
  }

  const int warpgroup = int(threadIdx.x) / 128;
  float acc[BN / 2];  // this thread's BN / 2 of its warpgroup's (64, BN) fp32 tile: acc[i] at (row_of(i), col_of(i))
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
  for (int t = 0; t < k_tiles; t++) {
    mbarrier_wait(barrier(t), (t / kStages) % 2);  // stage t has landed (the barrier's (t / kStages)-th phase)
    const uint32_t a = x_stage(t % kStages) + uint32_t(warpgroup * 64 * 128), b = w_stage(t % kStages);
    fence_accumulators(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");  // the accumulators are ready to be read
#pragma unroll
    for (int k = 0; k < kStageIn / 16; k++)
      wgmma_bf16<BN>(acc, swizzled_operand(a + uint32_t(32 * k)), swizzled_operand(b + uint32_t(32 * k)));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    // No wait here: the next stage's products queue behind these on the same accumulators, so the tensor
    // cores never drain between stages. Only a stage about to be refilled must be read completely first.
    if (t + kStages < k_tiles) {
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      __syncthreads();  // every warpgroup is done reading stage t, which the copies below refill
      if (threadIdx.x == 0) load_w(t + kStages), load_x(t + kStages);
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // every product is in acc
  fence_accumulators(acc);

  const int lane = int(threadIdx.x) % 32, warp_row = warpgroup * 64 + (int(threadIdx.x) % 128) / 32 * 16;
  auto row_of = [&](int i) { return warp_row + lane / 4 + 8 * ((i / 2) % 2); };  // within the block's tile
  auto col_of = [&](int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; };
  float* const tile = reinterpret_cast<float*>(smem_raw + (base - raw));  // (kRows, kSumStride), over the stages
  // The tile to shared memory, once every warpgroup is done with the stages (its wgmma waited for above).
  const auto tile_to_shared_memory = [&] {
    __syncthreads();  // every warpgroup's products are done reading the stages the tile overwrites
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2)
      *reinterpret_cast<float2*>(tile + row_of(i) * B::kSumStride + col_of(i)) = make_float2(acc[i], acc[i + 1]);
  };
  if constexpr (SAMPLE) {
    static_assert(BN == 128 && !SILU, "sample_tile scores tiles of 128 vocabulary entries");
    tile_to_shared_memory();
    __syncthreads();  // the whole tile (and tile_rows, tile_keys) written
    sample_tile<B::kRows, B::kSumStride>(tile, tile_rows, tile_keys, row0, n, out0, sampling);
    return;
  }
  // SILU's ending for one output feature: gate and up as the projection would store them, then the activation.
  const auto silu_of = [](float gate, float up) {
    return silu_times(__bfloat162float(__float2bfloat16(gate)), __bfloat162float(__float2bfloat16(up)));
  };
  // y's row length: out, or half of it with SILU. Neighbouring outputs go out in one store (acc[i] and
  // acc[i + 1] are neighbours in a row; so are the 4 columns of a group below) where every row of y starts
  // on a boundary of that store's size: one 4- or 8-byte store instead of single 2-byte ones (these cost
  // 1.4-9 µs a call where one block writes its whole tile: 04_model_runner/NOTES.md, section 2, "v6's
  // results stored two and four at a time").
  const int y_cols = SILU ? half : out;
  const bool pairs = y_cols % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (2 * sizeof(OutT)) == 0,
             fours = y_cols % 4 == 0 && reinterpret_cast<uintptr_t>(y) % (4 * sizeof(OutT)) == 0;
  if (splits == 1) {
    // SILU: columns [0, BN / 2) are gates, and acc[i + BN / 4] is the up of acc[i]'s feature.
    constexpr int kOutputs = SILU ? BN / 4 : BN / 2;
    const auto value = [&](int i) {
      if constexpr (SILU) return silu_of(acc[i], acc[i + BN / 4]);
      else return acc[i];
    };
#pragma unroll
    for (int i = 0; i < kOutputs; i += 2) {
      const int row = row0 + row_of(i), col = (SILU ? gate0 : out0) + col_of(i);
      if (row >= n) continue;
      OutT* dst = y + int64_t(row) * y_cols + col;
      if (pairs && col + 1 < y_cols) {
        store_float2(dst, value(i), value(i + 1));
      } else {
        if (col < y_cols) store_float(dst, value(i));
        if (col + 1 < y_cols) store_float(dst + 1, value(i + 1));
      }
    }
    return;
  }
  if constexpr (PARTIALS) {
    static_assert(!SILU && !SAMPLE, "the partial sums are a plain projection's");
    // This split's slice of y: rows [0, n) x outputs [0, out), written where the sum would have been.
    float* const slice = y + int64_t(split) * n * out;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
      const int row = row0 + row_of(i), col = out0 + col_of(i);
      if (row >= n) continue;
      float* dst = slice + int64_t(row) * out + col;
      if (pairs && col + 1 < out) {
        store_float2(dst, acc[i], acc[i + 1]);
      } else {
        if (col < out) store_float(dst, acc[i]);
        if (col + 1 < out) store_float(dst + 1, acc[i + 1]);
      }
    }
    return;
  }

  // Split: the block's fp32 tile goes to its shared memory (over the pipeline's buffers: every copy has
  // landed and every warpgroup waited for its wgmma, but wait for the other warpgroups too)...
  tile_to_shared_memory();
  float* const sum_tile = tile;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();  // every block's tile is written and visible to the cluster
  // ...and block `split` adds up rows split, split + splits, ... of every block's tile, 4 columns at a
  // time (SILU: 4 gate columns and the 4 up columns BN / 2 further), in split order.
  const int rows = min(B::kRows, n - row0), my_rows = (rows - split + splits - 1) / splits;
  constexpr int kGroups = (SILU ? BN / 2 : BN) / 4;  // groups of 4 columns written per row
  const auto sum_over_splits = [&](int r, int c) {
    // Every block's 4 values first (their loads in flight together), then the sum in split order.
    float4 v[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; s++)
      if (s < splits) v[s] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sum_tile + r * B::kSumStride + c, s));
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < kMaxSplits; s++)
      if (s < splits) sum.x += v[s].x, sum.y += v[s].y, sum.z += v[s].z, sum.w += v[s].w;
    return sum;
  };
  for (int q = int(threadIdx.x); q < my_rows * kGroups; q += B::kThreads) {
    const int r = split + q / kGroups * splits, c = q % kGroups * 4;
    const float4 sum = sum_over_splits(r, c);
    float4 values = sum;
    if (SILU) {
      const float4 up = sum_over_splits(r, c + BN / 2);
      values = make_float4(silu_of(sum.x, up.x), silu_of(sum.y, up.y), silu_of(sum.z, up.z), silu_of(sum.w, up.w));
    }
    const int col = (SILU ? gate0 : out0) + c;
    OutT* dst = y + int64_t(row0 + r) * y_cols + col;
    if (fours && col + 3 < y_cols) {
      store_float4(dst, values);
    } else {
      const float each[4] = {values.x, values.y, values.z, values.w};
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (col + j < y_cols) store_float(dst + j, each[j]);
    }
  }
  // No block exits (freeing its shared memory) while another still reads it. The reads have returned
  // (their values are summed above), so the arrival needs no release fence: cluster.sync() would add one
  // for the whole GPU (MEMBAR.ALL.GPU in the machine code), which stalled blocks under ncu.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

// Calls f(BN, WG) with the plan's block shape as std::integral_constant values: the kernel templates'
// arguments.
template <class F>
void with_block_shape(const LinearWgmmaPlan& plan, F&& f) {
  using std::integral_constant;
  switch (plan.block_out * 10 + plan.warpgroups) {
    case 641: return f(integral_constant<int, 64>(), integral_constant<int, 1>());
    case 642: return f(integral_constant<int, 64>(), integral_constant<int, 2>());
    case 644: return f(integral_constant<int, 64>(), integral_constant<int, 4>());
    case 1281: return f(integral_constant<int, 128>(), integral_constant<int, 1>());
    case 1282: return f(integral_constant<int, 128>(), integral_constant<int, 2>());
    case 1284: return f(integral_constant<int, 128>(), integral_constant<int, 4>());
    default: fail("linear_wgmma_cuda: no kernel for ", plan.block_out, " outputs x ", plan.warpgroups, " warpgroups");
  }
}

// Above 48 KB of shared memory a kernel must ask for it, once on each device, before its first launch there.
template <int BN, int WG, class OutT, bool SILU, bool PARTIALS = false>
void allow_shared_memory() {
  static PerDeviceOnce once;
  allow_dynamic_shared_memory(once, reinterpret_cast<const void*>(linear_wgmma_kernel<BN, WG, OutT, SILU, false, PARTIALS>),
                              Block<BN, WG>::kSmemBytes);
}

// How many clusters of plan.splits blocks of the plan's kernel the GPU runs at once, asked of the CUDA
// occupancy calculator once per (block shape, cluster size): it depends on shared memory, registers
// and how the SMs group into GPCs, which a cluster may not straddle. Asked of the plain bf16 kernel and
// taken for its fp32, SILU and partials forms too (the same shared memory; their registers are assumed not
// to lower the count).
int clusters_per_wave(const LinearWgmmaPlan& plan) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> known;  // (block_out, warpgroups, splits) -> clusters
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(plan.block_out, plan.warpgroups, plan.splits);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  int clusters = 0;
  with_block_shape(plan, [&](auto bn, auto wg) {
    constexpr int BN = decltype(bn)::value, WG = decltype(wg)::value;
    allow_shared_memory<BN, WG, bf16, false>();
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = unsigned(plan.splits), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(plan.splits)), config.blockDim = Block<BN, WG>::kThreads;
    config.dynamicSmemBytes = Block<BN, WG>::kSmemBytes, config.attrs = &cluster, config.numAttrs = 1;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, linear_wgmma_kernel<BN, WG, bf16, false>, &config));
  });
  return known[key] = clusters;
}

// The tensor map of a (rows, in) bf16 matrix at M for boxes of (box_rows, 64), 128-byte swizzled, zeros
// past the edges (in % 8 == 0 and M 16-byte aligned: the copy engine's row stride and base; box_rows <= 256). Encoding one is a driver call (cuTensorMapEncodeTiled, reached through the runtime: no
// link to the driver library); the maps are kept, by matrix and box, so that an eager decode step does not
// encode its 224 again (a CUDA graph holds the map it was captured with).
CUtensorMap tensor_map(const bf16* M, int rows, int in, int box_rows) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn) fail("linear_wgmma_cuda: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  static std::mutex mutex;
  static std::map<std::tuple<const bf16*, int, int, int>, CUtensorMap> known;  // (M, rows, in, box_rows) -> map
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(M, rows, in, box_rows);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  CUtensorMap map;
  const cuuint64_t size[2] = {cuuint64_t(in), cuuint64_t(rows)};  // innermost first
  const cuuint64_t row_bytes[1] = {cuuint64_t(in) * sizeof(bf16)};
  const cuuint32_t box[2] = {cuuint32_t(kStageIn), cuuint32_t(box_rows)}, element_strides[2] = {1, 1};
  const CUresult result =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(M), size, row_bytes, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    fail("linear_wgmma_cuda: cuTensorMapEncodeTiled failed (", int(result), ") for a (", rows, ", ", in,
         ") matrix, boxes of ", box_rows);
  return known[key] = map;
}

// y (n, out) OutT (SILU: (n, out / 2) bf16; PARTIALS: (plan.splits, n, out) fp32) = x (n, in) bf16 @ W (out,
// in)^T bf16 with the given plan. out: W's rows (SILU: 2 x y's columns, the gate rows then the up rows).
// PARTIALS: the blocks are not launched as clusters.
template <class OutT, bool SILU, bool PARTIALS = false>
void launch_wgmma(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, const LinearWgmmaPlan& plan,
                  cudaStream_t stream) {
  with_block_shape(plan, [&](auto bn, auto wg) {
    constexpr int BN = decltype(bn)::value, WG = decltype(wg)::value;
    allow_shared_memory<BN, WG, OutT, SILU, PARTIALS>();
    // SILU: ceil(out / 2 / (BN / 2)) tiles of BN / 2 features, the same count.
    const dim3 grid{unsigned(plan.splits), unsigned((out + BN - 1) / BN),
                    unsigned((n + Block<BN, WG>::kRows - 1) / Block<BN, WG>::kRows)};
    const CUtensorMap x_map = tensor_map(x, n, in, Block<BN, WG>::kRows),
                      w_map = tensor_map(W, out, in, SILU ? BN / 2 : BN);
    launch_overlapped_in_clusters(linear_wgmma_kernel<BN, WG, OutT, SILU, false, PARTIALS>, grid,
                                  PARTIALS ? 1u : unsigned(plan.splits), Block<BN, WG>::kThreads,
                                  Block<BN, WG>::kSmemBytes, stream, y, x_map, w_map, n, in, out,
                                  plan.k_tiles_per_split, TileSampling{});
  });
}

// The sampling ending's launch: one row tile of 64 WG rows (WG = 1 up to 64 rows, 2 up to 128), one block
// per 128 vocabulary entries, no split.
template <int WG>
void launch_sample(float* logits, const bf16* x, const bf16* W, int n, int in, int vocab, const TileSampling& sampling,
                   cudaStream_t stream) {
  using B = Block<128, WG, kSampleStages<WG>>;
  static PerDeviceOnce once;
  allow_dynamic_shared_memory(once, reinterpret_cast<const void*>(linear_wgmma_kernel<128, WG, float, false, true>),
                              B::kSmemBytes);
  const dim3 grid{1u, unsigned((vocab + 127) / 128), 1u};
  launch_overlapped(linear_wgmma_kernel<128, WG, float, false, true>, grid, dim3(B::kThreads), B::kSmemBytes, stream,
                    logits, tensor_map(x, n, in, B::kRows), tensor_map(W, vocab, in, 128), n, in, vocab,
                    (in + kStageIn - 1) / kStageIn, sampling);
}

// Whether the code loaded for this GPU has the wgmma kernels: 1 where it was compiled for sm_90a (the
// Makefile builds compute capability 9.0 as sm_90a), 0 elsewhere, where the kernels are empty.
__device__ const int kWgmmaCompiled =
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    1;
#else
    0;
#endif

}  // namespace

LinearWgmmaPlan linear_wgmma_plan(int n, int in_features, int out_features, int multiprocessors,
                                  const std::function<int(const LinearWgmmaPlan&)>& clusters_per_wave) {
  LinearWgmmaPlan plan;
  const bool many_rows = n > kWgmmaFasterRows;
  int target_blocks = multiprocessors, max_splits = kMaxSplits;  // a block per SM
  if (!many_rows) {
    plan.warpgroups = 1;
    // 128 outputs a block halve x's rereads (once per output tile) against 64, but give half the tiles:
    // taken when there are at least 16 of them (qkv and gate_up; o_proj and down_proj have 8).
    plan.block_out = (out_features + 127) / 128 >= 16 ? 128 : 64;
  } else {
    // What the sweeps found fastest for the narrow projections (linear.h, kWgmmaNarrowRows: the plan's
    // first version gave 4 warpgroups and splits of 8 here, and lost to cuBLAS by 10-25%) and for gate_up
    // (kWgmmaSiluRows: more blocks, about two an SM, for its 96 output tiles).
    plan.warpgroups = n <= 128 ? (n + 63) / 64 : 1;
    plan.block_out = n <= 128 ? 64 : 128;
    target_blocks = (out_features <= kWgmmaNarrowOut ? 96 : 288) * multiprocessors / kSweptSms, max_splits = 6;
  }
  const int row_tiles = (n + 64 * plan.warpgroups - 1) / (64 * plan.warpgroups);
  const int tiles = (out_features + plan.block_out - 1) / plan.block_out * row_tiles;
  const int k_tiles = (in_features + kStageIn - 1) / kStageIn;
  // The fewest splits that give the target blocks, each on average at least two stages deep (the last may
  // hold fewer: 16 stages over 7 splits -> 6 splits of 3, 3, 3, 3, 3, 1), and never so many that the
  // clusters no longer fit in one wave: a block is short, and a second wave costs about as long as the
  // first.
  max_splits = std::max(1, std::min(max_splits, k_tiles / 2));
  int splits = 1;
  for (int s = 2; s <= max_splits && tiles * splits < target_blocks; s++) {
    plan.splits = s;
    if (tiles > clusters_per_wave(plan)) break;
    splits = s;
  }
  // As few splits as that depth allows (no split left empty).
  plan.k_tiles_per_split = (k_tiles + splits - 1) / splits;
  plan.splits = (k_tiles + plan.k_tiles_per_split - 1) / plan.k_tiles_per_split;
  return plan;
}

bool linear_wgmma_available() {
  static const bool available = [] {
    int compiled = 0;
    if (!gpu_is_sm90()) return false;
    CUDA_CHECK(cudaMemcpyFromSymbol(&compiled, kWgmmaCompiled, sizeof(int)));
    return compiled == 1;
  }();
  return available;
}

namespace {

// Refuses (fail) the operands v6 cannot take on this GPU, naming the shape.
void check_operands(const bf16* x, const bf16* W, int n, int in_features) {
  if (!linear_split_k_fits(x, W, n, in_features) || !linear_wgmma_available())
    fail("linear_wgmma_cuda: needs a GPU of compute capability 9.0 with code built for sm_90a, in_features % 8 "
         "== 0 and 16-byte aligned x and W (n ", n, ", in ", in_features, ")");
}

// y (n, out_features) = x W^T by `plan`, stored as fp32 or bf16: no SiLU, and the splits summed in their cluster.
void launch_plain(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                  const LinearWgmmaPlan& plan, cudaStream_t stream) {
  if (y_is_fp32)
    launch_wgmma<float, false>(static_cast<float*>(y), x, W, n, in_features, out_features, plan, stream);
  else
    launch_wgmma<bf16, false>(static_cast<bf16*>(y), x, W, n, in_features, out_features, plan, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void linear_wgmma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                       int out_features, cudaStream_t stream) {
  check_operands(x, W, n, in_features);  // linear_wgmma_plan's plans need no check: they are built to fit
  launch_plain(y, y_is_fp32, x, W, n, in_features, out_features,
               linear_wgmma_plan(n, in_features, out_features, multiprocessor_count(), clusters_per_wave), stream);
}

void linear_wgmma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                       int out_features, const LinearWgmmaPlan& plan, cudaStream_t stream) {
  check_operands(x, W, n, in_features);
  const int k_tiles = (in_features + kStageIn - 1) / kStageIn;
  if (plan.splits < 1 || plan.splits > kMaxSplits || plan.k_tiles_per_split < 1 ||
      plan.splits * plan.k_tiles_per_split < k_tiles || (plan.splits - 1) * plan.k_tiles_per_split >= k_tiles ||
      linear_wgmma_clusters_per_wave(plan) < 1)
    fail("linear_wgmma_cuda: a plan of ", plan.splits, " splits of ", plan.k_tiles_per_split, " stages (",
         plan.warpgroups, " warpgroups, ", plan.block_out, " outputs a block) does not cover ", k_tiles,
         " stages of in_features with none empty, or its clusters do not fit the GPU");
  launch_plain(y, y_is_fp32, x, W, n, in_features, out_features, plan, stream);
}

int linear_wgmma_clusters_per_wave(const LinearWgmmaPlan& plan) { return clusters_per_wave(plan); }

void linear_wgmma_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                            cudaStream_t stream) {
  if (!linear_split_k_fits(x, W, n, in_features) || !linear_wgmma_available() || out_features % 2 != 0)
    fail("linear_wgmma_silu_cuda: needs a GPU of compute capability 9.0 with code built for sm_90a, in_features % "
         "8 == 0, 16-byte aligned x and W and an even out_features (n ", n, ", in ", in_features, ", out ",
         out_features, ")");
  launch_wgmma<bf16, true>(y, x, W, n, in_features, out_features,
                           linear_wgmma_plan(n, in_features, out_features, multiprocessor_count(), clusters_per_wave), stream);
  CUDA_CHECK_LAUNCH();
}

int linear_wgmma_partials_cuda(float* partials, const bf16* x, const bf16* W, int n, int in_features,
                               int out_features, cudaStream_t stream) {
  check_operands(x, W, n, in_features);
  const LinearWgmmaPlan plan = linear_wgmma_plan(n, in_features, out_features, multiprocessor_count(), clusters_per_wave);
  launch_wgmma<float, false, true>(partials, x, W, n, in_features, out_features, plan, stream);
  CUDA_CHECK_LAUNCH();
  return plan.splits;
}

bool linear_sample_fits(const bf16* x, const bf16* W, int n, int in_features) {
  return n >= 1 && n <= kWgmmaSampleMaxRows && linear_split_k_fits(x, W, n, in_features) && linear_wgmma_available();
}

void linear_sample_cuda(int32_t* tokens, float* logits, const bf16* x, const bf16* W, int n, int in_features,
                        int vocab, const SamplingRow* rows, unsigned long long* best_keys, int* broken,
                        bool all_logits, cudaStream_t stream) {
  if (!linear_sample_fits(x, W, n, in_features))
    fail("linear_sample_cuda: needs a GPU of compute capability 9.0 with code built for sm_90a, 1 to ",
         kWgmmaSampleMaxRows, " rows, in_features % 8 == 0 and 16-byte aligned x and W (n ", n, ", in ", in_features, ")");
  const TileSampling sampling{rows, best_keys, broken, logits, vocab, all_logits};
  if (n <= 64) launch_sample<1>(logits, x, W, n, in_features, vocab, sampling, stream);
  else launch_sample<2>(logits, x, W, n, in_features, vocab, sampling, stream);
  CUDA_CHECK_LAUNCH();
  sample_from_keys_cuda(tokens, best_keys, broken, logits, n, vocab, rows, stream);
}

}  // namespace nanovllm
