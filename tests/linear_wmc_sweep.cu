// linear_wmc_sweep.cu: tried GEMMs for 64-256 rows, not kept (04_model_runner/NOTES.md, section 2, "A
// producer and cuBLAS's shared W, phase by phase"). Four kernels beside cuBLAS on Qwen3-0.6B's projections:
//   ring_kernel  (from commit d3f43b0) warpgroup 0's thread 0 refills a ring of `stages` stages against
//                "empty" mbarriers; 1, 2 or 4 consumer warpgroups (64 rows of x each) release each stage after
//                its products (wgmma.wait_group 1); in_features split over a cluster summed in distributed
//                shared memory.
//   mc_kernel    (from d3f43b0) no split; the M blocks of a cluster, neighbouring output tiles, share x: each
//                loads 1/M of every stage's x box for all M (TMA multicast).
//   wmc_kernel   no split; the M blocks of a cluster, neighbouring row tiles, share W (what cuBLAS's
//                nvjet_sm90_tst_64x64_64x13_2x1 does at 128 rows): each loads 1/M of every stage's W box for
//                all M, and its own x. `flags` switch the variants measured: 8 the tile staged in shared
//                memory and stored 16 bytes a thread; 64 no cluster barrier at exit (the producer waits for
//                every block's release of the last stages instead); 128 a relaxed cluster arrival at the
//                start; 4 W's and x's boxes issued together after griddepcontrol.wait; 16 no products (the
//                stream alone: wrong results); 32 clock64 stamps of each block's phases into g_stamps.
//   alt_kernel   wmc_kernel's fastest form (relaxed start, no exit barrier, staged stores) with ALT consumer
//                warpgroups per 64 rows taking the stages in turn into accumulators of their own, added through
//                shared memory at the end, each keeping `lag & 0xff` stages of products in flight; `lag >> 8`
//                stages of W asked for before griddepcontrol.wait (0: all), the others with x's after it.
//                wmc_kernel's flag 1024 does the same with 4 stages. More bits of `lag`: 16 the tile stored by
//                TMA; 17 clock64 stamps; 18 every stage landed before the first product (the products timed
//                alone; needs stages >= in / 64); 19-20 the accumulator sets a consumer keeps (0: one, 1: two,
//                2: four; k slice k adds into set k % sets, the sets summed at the end). 256 outputs a block
//                (m64n256k16) exist for alt_kernel with one consumer only, for the probe (not swept, not
//                checked against cuBLAS).
// WMC_PROMO_W / WMC_PROMO_X set the L2 promotion of W's and x's boxes (0, 64, 128 or 256 bytes).
// For each row count and projection every plan is checked against cuBLAS's product and timed as 28 calls on 28
// distinct weights in a CUDA graph, as tests/linear_sweep.cpp does.
//   nvcc -O3 -std=c++17 -I. -DNANOVLLM_CUDA -gencode arch=compute_90a,code=sm_90a tests/linear_wmc_sweep.cu \
//     -o build/linear_wmc_sweep -lcublas && build/linear_wmc_sweep 96 128 192 256
//   build/linear_wmc_sweep probe N IN OUT C BN SPLITS STAGES M   one plan for ncu (M < 0: wmc_kernel with -M);
//     WMC_STAMPS=1 adds the stamps of wmc_kernel with flags 0, 8, 72, 200, 204 and 216 (WMC_FLAGS: the base);
//     WMC_ALT=A the stamps of alt_kernel with A consumers and one, two or four accumulator sets (W ahead for 4
//     stages), and with WMC_PRELOAD=1 also with every stage landed first.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include "01_sequence/base/cuda_utils.h"
#include "01_sequence/base/ptx.cuh"

using namespace nanovllm;

namespace {

constexpr int kMaxStages = 16;

__device__ inline void tma_load(uint32_t dst, const CUtensorMap* map, int k0, int row0, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(barrier)
      : "memory");
}
__device__ inline uint64_t swizzled_operand(uint32_t address) {
  return uint64_t((address & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}
__device__ inline void mbarrier_init_count(uint32_t barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(count) : "memory");
}
__device__ inline void mbarrier_arrive(uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}
template <int N>
__device__ inline void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int BN>
__device__ inline void wgmma_bf16(float (&d)[BN / 2], uint64_t a, uint64_t b);
#define D8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
template <>
__device__ inline void wgmma_bf16<64>(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, accumulate, 1, 1, 0, 0;\n}\n"
      : D8(0), D8(8), D8(16), D8(24)
      : "l"(a), "l"(b), "r"(1));
}
template <>
__device__ inline void wgmma_bf16<96>(float (&d)[48], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, accumulate, 1, 1, 0, 0;\n}\n"
      : D8(0), D8(8), D8(16), D8(24), D8(32), D8(40)
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
      : D8(0), D8(8), D8(16), D8(24), D8(32), D8(40), D8(48), D8(56)
      : "l"(a), "l"(b), "r"(1));
}
template <>
__device__ inline void wgmma_bf16<256>(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, accumulate, 1, 1, 0, 0;\n}\n"
      : D8(0), D8(8), D8(16), D8(24), D8(32), D8(40), D8(48), D8(56), D8(64), D8(72), D8(80), D8(88), D8(96), D8(104), D8(112), D8(120)
      : "l"(a), "l"(b), "r"(1));
}
#undef D8

template <int BN, int C>
struct Shape {
  static constexpr int kThreads = 128 * (C + 1), kRows = 64 * C, kWBytes = BN * 128, kXBytes = kRows * 128,
                       kStageBytes = kWBytes + kXBytes, kSumStride = BN + 8, kSumBytes = kRows * kSumStride * 4;
  static int smem(int stages) { return std::max(stages * kStageBytes, kSumBytes) + 1024; }
};

// Grid (splits, out tiles, row tiles), clusters of (splits, 1, 1). Warpgroup 0: thread 0 loads; 1..C: products.
template <int BN, int C>
__global__ void __launch_bounds__(128 * (C + 1), 1)
    ring_kernel(bf16* y, const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                int n, int in, int out, int k_tiles_per_split, int stages) {
  using S = Shape<BN, C>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw), base = (raw + 1023u) & ~1023u;
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int split = int(blockIdx.x), splits = int(gridDim.x), out0 = int(blockIdx.y) * BN,
            row0 = int(blockIdx.z) * S::kRows;
  const int t_begin = split * k_tiles_per_split;
  const int k_tiles = min((in + 63) / 64, t_begin + k_tiles_per_split) - t_begin;
  auto w_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes); };
  auto x_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes + S::kWBytes); };
  auto full_of = [&](int s) { return smem_address(&full[s]); };
  auto empty_of = [&](int s) { return smem_address(&empty[s]); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; s++) mbarrier_init_count(full_of(s), 1), mbarrier_init_count(empty_of(s), 4 * C);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int first = min(stages, k_tiles);
  if (threadIdx.x == 0)
    for (int t = 0; t < first; t++) {
      mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
      tma_load(w_stage(t), &w_map, (t_begin + t) * 64, out0, full_of(t));
    }
  wait_for_previous_kernel();
  allow_next_kernel();
  const int wg = int(threadIdx.x) / 128;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
  if (wg == 0) {
    if (threadIdx.x == 0) {
      for (int t = 0; t < first; t++) tma_load(x_stage(t), &x_map, (t_begin + t) * 64, row0, full_of(t));
      for (int t = stages; t < k_tiles; t++) {
        const int s = t % stages;
        mbarrier_wait(empty_of(s), (t / stages - 1) & 1);
        mbarrier_arrive_expecting(full_of(s), S::kStageBytes);
        tma_load(w_stage(s), &w_map, (t_begin + t) * 64, out0, full_of(s));
        tma_load(x_stage(s), &x_map, (t_begin + t) * 64, row0, full_of(s));
      }
    }
  } else {
    for (int t = 0; t < k_tiles; t++) {
      const int s = t % stages;
      mbarrier_wait(full_of(s), (t / stages) & 1);
      const uint32_t a = x_stage(s) + uint32_t((wg - 1) * 64 * 128), b = w_stage(s);
      fence_accumulators(acc);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int k = 0; k < 4; k++)
        wgmma_bf16<BN>(acc, swizzled_operand(a + uint32_t(32 * k)), swizzled_operand(b + uint32_t(32 * k)));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // stage t - 1's products are done
      if (t > 0 && threadIdx.x % 32 == 0) mbarrier_arrive(empty_of((t - 1) % stages));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_accumulators(acc);
  }
  const int lane = int(threadIdx.x) % 32, warp_row = (wg - 1) * 64 + (int(threadIdx.x) % 128) / 32 * 16;
  auto row_of = [&](int i) { return warp_row + lane / 4 + 8 * ((i / 2) % 2); };
  auto col_of = [&](int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; };
  if (splits == 1) {
    if (wg == 0) return;
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
      const int row = row0 + row_of(i), col = out0 + col_of(i);
      if (row < n && col + 1 < out)
        *reinterpret_cast<__nv_bfloat162*>(y + int64_t(row) * out + col) = __floats2bfloat162_rn(acc[i], acc[i + 1]);
      else if (row < n && col < out)
        y[int64_t(row) * out + col] = __float2bfloat16(acc[i]);
    }
    return;
  }
  __syncthreads();
  float* sum_tile = reinterpret_cast<float*>(smem_raw + (base - raw));
  if (wg > 0) {
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2)
      *reinterpret_cast<float2*>(sum_tile + row_of(i) * S::kSumStride + col_of(i)) = make_float2(acc[i], acc[i + 1]);
  }
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  const int rows = min(S::kRows, n - row0), my_rows = (rows - split + splits - 1) / splits;
  constexpr int kGroups = BN / 4;
  for (int q = int(threadIdx.x); q < my_rows * kGroups; q += S::kThreads) {
    const int r = split + q / kGroups * splits, c = q % kGroups * 4;
    float4 v[8];
#pragma unroll
    for (int s = 0; s < 8; s++)
      if (s < splits) v[s] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(sum_tile + r * S::kSumStride + c, s));
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < 8; s++)
      if (s < splits) sum.x += v[s].x, sum.y += v[s].y, sum.z += v[s].z, sum.w += v[s].w;
    bf16* dst = y + int64_t(row0 + r) * out + out0 + c;
    if (out0 + c + 3 < out) {
      *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(sum.x, sum.y);
      *reinterpret_cast<__nv_bfloat162*>(dst + 2) = __floats2bfloat162_rn(sum.z, sum.w);
    } else {
      const float values[4] = {sum.x, sum.y, sum.z, sum.w};
      for (int j = 0; j < 4; j++)
        if (out0 + c + j < out) dst[j] = __float2bfloat16(values[j]);
    }
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}


__device__ inline void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int k0, int row0, uint32_t barrier,
                                          uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(barrier), "h"(mask)
      : "memory");
}
__device__ inline void mbarrier_arrive_remote(uint32_t barrier, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(barrier), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];  // (CTA-scope release, as the NOTES found faster)\n" ::"r"(remote) : "memory");
}
__device__ inline void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ long long g_stamps[1024][8];
__device__ inline long long now_cycles() { long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }
// Grid (out tiles, row tiles), clusters of (M, 1): the M blocks of a cluster share their rows of x, each
// loading 1/M of every stage's x box for all M (multicast). No split.
template <int BN, int C, int M>
__global__ void __launch_bounds__(128 * (C + 1), 1)
    mc_kernel(bf16* y, const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
              int n, int in, int out, int stages) {
  constexpr bool stamp = false, no_math = false, smem_store = false;
  const int block_id = 0;
  const long long t_start = 0;
  using S = Shape<BN, C>;
  constexpr int kSliceRows = S::kRows / M;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw), base = (raw + 1023u) & ~1023u;
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int rank = int(blockIdx.x) % M, out0 = int(blockIdx.x) * BN, row0 = int(blockIdx.y) * S::kRows;
  const int k_tiles = (in + 63) / 64;
  auto w_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes); };
  auto x_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes + S::kWBytes); };
  auto full_of = [&](int s) { return smem_address(&full[s]); };
  auto empty_of = [&](int s) { return smem_address(&empty[s]); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; s++) mbarrier_init_count(full_of(s), 1), mbarrier_init_count(empty_of(s), 4 * C * M);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster_sync_all();  // every block's barriers are initialised before a peer's copy or arrival reaches them
  const int first = min(stages, k_tiles);
  const uint16_t all = uint16_t((1u << M) - 1u);
  auto load_x = [&](int t, int s) {
    tma_load_multicast(x_stage(s) + uint32_t(rank * kSliceRows * 128), &x_map, t * 64, row0 + rank * kSliceRows,
                       full_of(s), all);
  };
  if (threadIdx.x == 0)
    for (int t = 0; t < first; t++) {
      mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
      tma_load(w_stage(t), &w_map, t * 64, out0, full_of(t));
    }
  wait_for_previous_kernel();
  allow_next_kernel();
  const int wg = int(threadIdx.x) / 128;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
  if (wg == 0) {
    if (threadIdx.x == 0) {
      for (int t = 0; t < first; t++) load_x(t, t);
      for (int t = stages; t < k_tiles; t++) {
        const int s = t % stages;
        mbarrier_wait(empty_of(s), (t / stages - 1) & 1);  // every block of the cluster is done with stage s
        mbarrier_arrive_expecting(full_of(s), S::kStageBytes);
        tma_load(w_stage(s), &w_map, t * 64, out0, full_of(s));
        load_x(t, s);
      }
    }
  } else {
    for (int t = 0; t < k_tiles; t++) {
      const int s = t % stages;
      mbarrier_wait(full_of(s), (t / stages) & 1);
      if (stamp && threadIdx.x == 128 && t == 0) g_stamps[block_id][2] = now_cycles() - t_start;
      if (stamp && threadIdx.x == 128 && t == k_tiles - 1) g_stamps[block_id][3] = now_cycles() - t_start;
      const uint32_t a = x_stage(s) + uint32_t((wg - 1) * 64 * 128), b = w_stage(s);
      fence_accumulators(acc);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      if (!no_math) {
#pragma unroll
      for (int k = 0; k < 4; k++)
        wgmma_bf16<BN>(acc, swizzled_operand(a + uint32_t(32 * k)), swizzled_operand(b + uint32_t(32 * k)));
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      if (t > 0 && threadIdx.x % 32 < M) mbarrier_arrive_remote(empty_of((t - 1) % stages), int(threadIdx.x % 32));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_accumulators(acc);
    if (stamp && threadIdx.x == 128) g_stamps[block_id][4] = now_cycles() - t_start;
    const int lane = int(threadIdx.x) % 32, warp_row = (wg - 1) * 64 + (int(threadIdx.x) % 128) / 32 * 16;
    if (smem_store) {
      // The tile as bf16 in shared memory (the stages are all consumed), then 16-byte coalesced stores.
      constexpr int kStride = BN + 8;  // bf16 per row
      bf16* tile = reinterpret_cast<bf16*>(smem_raw + (base - raw));
#pragma unroll
      for (int i = 0; i < BN / 2; i += 2) {
        const int r = warp_row + lane / 4 + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<__nv_bfloat162*>(tile + r * kStride + c) = __floats2bfloat162_rn(acc[i], acc[i + 1]);
      }
      asm volatile("bar.sync 1, %0;\n" ::"r"(128 * C) : "memory");  // the consumers' tile is whole
      constexpr int kChunks = BN / 8;
      for (int q = int(threadIdx.x) - 128; q < 64 * C * kChunks; q += 128 * C) {
        const int r = q / kChunks, c = q % kChunks * 8;
        if (row0 + r < n)
          *reinterpret_cast<uint4*>(y + int64_t(row0 + r) * out + out0 + c) = *reinterpret_cast<const uint4*>(tile + r * kStride + c);
      }
    } else
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
      const int row = row0 + warp_row + lane / 4 + 8 * ((i / 2) % 2), col = out0 + 8 * (i / 4) + 2 * (lane % 4);
      if (row < n && col + 1 < out)
        *reinterpret_cast<__nv_bfloat162*>(y + int64_t(row) * out + col) = __floats2bfloat162_rn(acc[i], acc[i + 1]);
      else if (row < n && col < out)
        y[int64_t(row) * out + col] = __float2bfloat16(acc[i]);
    }
  }
  cluster_sync_all();  // no block exits while a peer may still arrive on its barriers
}

// Grid (row tiles rounded up to M, out tiles), clusters of (M, 1): the M blocks of a cluster share one output
// tile's W (cuBLAS's 2x1 at 128 rows), each loading 1/M of every stage's W box for all M (multicast) and its
// own rows of x. Producer thread 0 of warpgroup 0; C consumer warpgroups. No split.
template <int BN, int C, int M, bool kNoMath>
__global__ void __launch_bounds__(128 * (C + 1), 1)
    wmc_kernel(bf16* y, const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
               int n, int in, int out, int stages, int flags) {
  if ((flags & 1) && threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&w_map)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&x_map)) : "memory");
  }
  uint64_t first_policy = 0, last_policy = 0;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(first_policy));
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(last_policy));
  const bool hint = flags & 2, interleave = flags & 4, smem_store = flags & 8, stamp = flags & 32,
             tail_exit = flags & 64, relaxed_start = flags & 128;
  constexpr bool no_math = kNoMath;
  const int block_id = int(blockIdx.x + gridDim.x * blockIdx.y);
  long long t_start = stamp ? now_cycles() : 0;
  using S = Shape<BN, C>;
  constexpr int kSlice = BN / M;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw), base = (raw + 1023u) & ~1023u;
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int rank = int(blockIdx.x) % M, row0 = int(blockIdx.x) * S::kRows, out0 = int(blockIdx.y) * BN;
  const int k_tiles = (in + 63) / 64;
  auto w_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes); };
  auto x_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes + S::kWBytes); };
  auto full_of = [&](int s) { return smem_address(&full[s]); };
  auto empty_of = [&](int s) { return smem_address(&empty[s]); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; s++) mbarrier_init_count(full_of(s), 1), mbarrier_init_count(empty_of(s), 4 * C * M);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (relaxed_start)  // the barriers' init is released by its fence; nothing else needs ordering
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
  else
    cluster_sync_all();
  if (stamp && threadIdx.x == 0) g_stamps[block_id][0] = now_cycles() - t_start;
  const int first = min(stages, k_tiles);
  const uint16_t all = uint16_t((1u << M) - 1u);
  auto load_w = [&](int t, int s) {
    if (hint)
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5, %6;\n"
          ::"r"(w_stage(s) + uint32_t(rank * kSlice * 128)), "l"(reinterpret_cast<uint64_t>(&w_map)), "r"(t * 64),
            "r"(out0 + rank * kSlice), "r"(full_of(s)), "h"(all), "l"(first_policy)
          : "memory");
    else
      tma_load_multicast(w_stage(s) + uint32_t(rank * kSlice * 128), &w_map, t * 64, out0 + rank * kSlice, full_of(s), all);
  };
  auto load_x = [&](int t, int s) {
    if (hint)
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n"
          ::"r"(x_stage(s)), "l"(reinterpret_cast<uint64_t>(&x_map)), "r"(t * 64), "r"(row0), "r"(full_of(s)),
            "l"(last_policy)
          : "memory");
    else
      tma_load(x_stage(s), &x_map, t * 64, row0, full_of(s));
  };
  const int w_ahead = (flags & 1024) ? min(first, 4) : first;  // W's boxes asked for before the wait
  if (threadIdx.x == 0 && !interleave)
    for (int t = 0; t < w_ahead; t++) {
      mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
      load_w(t, t);
    }
  wait_for_previous_kernel();
  allow_next_kernel();
  const int wg = int(threadIdx.x) / 128;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
  if (wg == 0) {
    if (threadIdx.x == 0) {
      if (interleave)
        for (int t = 0; t < first; t++) {
          mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
          load_w(t, t);
          load_x(t, t);
        }
      else {
        for (int t = 0; t < w_ahead; t++) load_x(t, t);
        for (int t = w_ahead; t < first; t++) {
          mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
          load_w(t, t);
          load_x(t, t);
        }
      }
      if (stamp) g_stamps[block_id][1] = now_cycles() - t_start;
      for (int t = stages; t < k_tiles; t++) {
        const int s = t % stages;
        mbarrier_wait(empty_of(s), (t / stages - 1) & 1);  // every block of the cluster is done with stage s
        mbarrier_arrive_expecting(full_of(s), S::kStageBytes);
        load_w(t, s);
        load_x(t, s);
      }
      if (tail_exit)  // every block of the cluster has consumed the last stages (our multicasts into it landed)
        for (int t = max(0, k_tiles - stages); t < k_tiles; t++) mbarrier_wait(empty_of(t % stages), (t / stages) & 1);
    }
  } else {
    for (int t = 0; t < k_tiles; t++) {
      const int s = t % stages;
      mbarrier_wait(full_of(s), (t / stages) & 1);
      if (stamp && threadIdx.x == 128 && t == 0) g_stamps[block_id][2] = now_cycles() - t_start;
      if (stamp && threadIdx.x == 128 && t == k_tiles - 1) g_stamps[block_id][3] = now_cycles() - t_start;
      const uint32_t a = x_stage(s) + uint32_t((wg - 1) * 64 * 128), b = w_stage(s);
      fence_accumulators(acc);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      if constexpr (!no_math) {
#pragma unroll
      for (int k = 0; k < 4; k++)
        wgmma_bf16<BN>(acc, swizzled_operand(a + uint32_t(32 * k)), swizzled_operand(b + uint32_t(32 * k)));
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      if (t > 0 && threadIdx.x % 32 < M) mbarrier_arrive_remote(empty_of((t - 1) % stages), int(threadIdx.x % 32));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_accumulators(acc);
    if (stamp && threadIdx.x == 128) g_stamps[block_id][4] = now_cycles() - t_start;
    const int lane = int(threadIdx.x) % 32, warp_row = (wg - 1) * 64 + (int(threadIdx.x) % 128) / 32 * 16;
    if (smem_store) {
      // The tile as bf16 in shared memory (the stages are all consumed), then 16-byte coalesced stores.
      constexpr int kStride = BN + 8;  // bf16 per row
      bf16* tile = reinterpret_cast<bf16*>(smem_raw + (base - raw));
#pragma unroll
      for (int i = 0; i < BN / 2; i += 2) {
        const int r = warp_row + lane / 4 + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<__nv_bfloat162*>(tile + r * kStride + c) = __floats2bfloat162_rn(acc[i], acc[i + 1]);
      }
      asm volatile("bar.sync 1, %0;\n" ::"r"(128 * C) : "memory");  // the consumers' tile is whole
      constexpr int kChunks = BN / 8;
      for (int q = int(threadIdx.x) - 128; q < 64 * C * kChunks; q += 128 * C) {
        const int r = q / kChunks, c = q % kChunks * 8;
        if (row0 + r < n)
          *reinterpret_cast<uint4*>(y + int64_t(row0 + r) * out + out0 + c) = *reinterpret_cast<const uint4*>(tile + r * kStride + c);
      }
    } else
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
      const int row = row0 + warp_row + lane / 4 + 8 * ((i / 2) % 2), col = out0 + 8 * (i / 4) + 2 * (lane % 4);
      if (row < n && col + 1 < out)
        *reinterpret_cast<__nv_bfloat162*>(y + int64_t(row) * out + col) = __floats2bfloat162_rn(acc[i], acc[i + 1]);
      else if (row < n && col < out)
        y[int64_t(row) * out + col] = __float2bfloat16(acc[i]);
    }
  }
  if (stamp && threadIdx.x == 128) g_stamps[block_id][5] = now_cycles() - t_start;
  if (tail_exit && wg > 0 && threadIdx.x % 32 < M)  // the last stage is released after the stores
    mbarrier_arrive_remote(empty_of((k_tiles - 1) % stages), int(threadIdx.x % 32));
  if (!tail_exit) cluster_sync_all();  // no block exits while a peer may still write into it or arrive on its barriers
  if (stamp && threadIdx.x == 128) g_stamps[block_id][6] = now_cycles() - t_start;
}

// alt_kernel: wmc_kernel's best form (relaxed start, no exit barrier, tile staged for 16-byte stores) with
// ALT consumer warpgroups per 64 rows taking stages in turn (t % ALT), each into accumulators of its own, added
// through shared memory at the end; `lag` stages of products in flight a consumer before it releases one.
template <int BN, int C, int M, int ALT, int CH>
__global__ void __launch_bounds__(128 * (C * ALT + 1), 1)
    alt_kernel(bf16* y, const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
               const __grid_constant__ CUtensorMap y_map, int n, int in, int out, int stages, int lag) {
  // lag: bits 0-7 stages of products in flight, 8-15 W's stages before the wait (0: all), 16 the tile stored
  // by TMA, 17 clock64 stamps into g_stamps.
  const bool tma_store = lag & 0x10000, stamp = lag & 0x20000, preload = lag & 0x40000;  // bit 18: every stage
  // lands before the first product (valid without refills: stages >= k_tiles), to time the products alone
  const int block_id = int(blockIdx.x + gridDim.x * blockIdx.y);
  const long long t_start = stamp ? now_cycles() : 0;
  using S = Shape<BN, C>;
  constexpr int kSlice = BN / M, kConsumers = C * ALT;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_address(smem_raw), base = (raw + 1023u) & ~1023u;
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  const int rank = int(blockIdx.x) % M, row0 = int(blockIdx.x) * S::kRows, out0 = int(blockIdx.y) * BN;
  const int k_tiles = (in + 63) / 64;
  auto w_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes); };
  auto x_stage = [&](int s) { return base + uint32_t(s * S::kStageBytes + S::kWBytes); };
  auto full_of = [&](int s) { return smem_address(&full[s]); };
  auto empty_of = [&](int s) { return smem_address(&empty[s]); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; s++) mbarrier_init_count(full_of(s), 1), mbarrier_init_count(empty_of(s), 4 * C * M);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
  if (stamp && threadIdx.x == 128) g_stamps[block_id][0] = now_cycles() - t_start;
  const int first = min(stages, k_tiles);
  const uint16_t all = uint16_t((1u << M) - 1u);
  auto load_w = [&](int t, int s) {
    tma_load_multicast(w_stage(s) + uint32_t(rank * kSlice * 128), &w_map, t * 64, out0 + rank * kSlice, full_of(s), all);
  };
  const int w_ahead = ((lag >> 8) & 0xff) ? min(first, (lag >> 8) & 0xff) : first;  // W's boxes before the wait
  lag &= 0xff;
  if (threadIdx.x == 0)
    for (int t = 0; t < w_ahead; t++) {
      mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
      load_w(t, t);
    }
  wait_for_previous_kernel();
  allow_next_kernel();
  const int wg = int(threadIdx.x) / 128, cw = wg - 1, row_group = cw % C, turn = cw / C;
  float chain[CH][BN / 2];
#pragma unroll
  for (int c = 0; c < CH; c++)
#pragma unroll
    for (int i = 0; i < BN / 2; i++) chain[c][i] = 0.0f;
  float (&acc)[BN / 2] = chain[0];
  if (wg == 0) {
    if (threadIdx.x == 0) {
      for (int t = 0; t < w_ahead; t++) tma_load(x_stage(t), &x_map, t * 64, row0, full_of(t));
      for (int t = w_ahead; t < first; t++) {
        mbarrier_arrive_expecting(full_of(t), S::kStageBytes);
        load_w(t, t);
        tma_load(x_stage(t), &x_map, t * 64, row0, full_of(t));
      }
      if (stamp) g_stamps[block_id][1] = now_cycles() - t_start;
      for (int t = stages; t < k_tiles; t++) {
        const int s = t % stages;
        mbarrier_wait(empty_of(s), (t / stages - 1) & 1);
        mbarrier_arrive_expecting(full_of(s), S::kStageBytes);
        load_w(t, s);
        tma_load(x_stage(s), &x_map, t * 64, row0, full_of(s));
      }
      for (int t = max(0, k_tiles - stages); t < k_tiles; t++) mbarrier_wait(empty_of(t % stages), (t / stages) & 1);
    }
  } else {
    auto release = [&](int t) {
      if (threadIdx.x % 32 < M) mbarrier_arrive_remote(empty_of(t % stages), int(threadIdx.x % 32));
    };
    if (preload) {
      for (int t = turn; t < k_tiles; t += ALT) mbarrier_wait(full_of(t % stages), (t / stages) & 1);
      if (stamp && threadIdx.x == 128) g_stamps[block_id][2] = now_cycles() - t_start;
    }
    for (int t = turn; t < k_tiles; t += ALT) {
      const int s = t % stages;
      if (!preload) mbarrier_wait(full_of(s), (t / stages) & 1);
      if (stamp && threadIdx.x == 128 && t == 0 && !preload) g_stamps[block_id][2] = now_cycles() - t_start;
      if (stamp && threadIdx.x == 128 && t + ALT >= k_tiles) g_stamps[block_id][3] = now_cycles() - t_start;
      const uint32_t a = x_stage(s) + uint32_t(row_group * 64 * 128), b = w_stage(s);
#pragma unroll
      for (int c = 0; c < CH; c++) fence_accumulators(chain[c]);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int k = 0; k < 4; k++)
        wgmma_bf16<BN>(chain[k % CH], swizzled_operand(a + uint32_t(32 * k)), swizzled_operand(b + uint32_t(32 * k)));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      if (lag == 2) {
        asm volatile("wgmma.wait_group.sync.aligned 2;\n" ::: "memory");
        if (t - 2 * ALT >= 0) release(t - 2 * ALT);
      } else {
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (t - ALT >= 0) release(t - ALT);
      }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int c = 0; c < CH; c++) fence_accumulators(chain[c]);
#pragma unroll
    for (int c = 1; c < CH; c++)
#pragma unroll
      for (int i = 0; i < BN / 2; i++) acc[i] += chain[c][i];
    if (stamp && threadIdx.x == 128) g_stamps[block_id][4] = now_cycles() - t_start;
    const int lane = int(threadIdx.x) % 32, warp_row = row_group * 64 + (int(threadIdx.x) % 128) / 32 * 16;
    // Partial tiles of the other turns into their own region (past the stages), then one add by turn 0.
    float* partial = reinterpret_cast<float*>(smem_raw + (base - raw) + size_t(stages) * S::kStageBytes);
    constexpr int kPStride = BN + 8;
    if (ALT > 1 && turn > 0) {
#pragma unroll
      for (int i = 0; i < BN / 2; i += 2) {
        const int r = warp_row + lane / 4 + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<float2*>(partial + r * kPStride + c) = make_float2(acc[i], acc[i + 1]);
      }
    }
    if (ALT > 1) asm volatile("bar.sync 1, %0;\n" ::"r"(128 * kConsumers) : "memory");
    constexpr int kStride = BN + 8;
    bf16* tile = reinterpret_cast<bf16*>(partial + (ALT > 1 ? 64 * C * kPStride : 0));
    // TMA store: the tile in 64-column halves, each (64 C rows, 128 bytes) in the 128-byte swizzle its map asks
    // for (16-byte chunk k of row r at k ^ (r % 8)), 1,024-byte aligned; else padded rows and 16-byte stores.
    unsigned char* swz = reinterpret_cast<unsigned char*>(tile);
    auto tile_value = [&](int i, float v0, float v1) {
      const int r = warp_row + lane / 4 + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * (lane % 4);
      if (tma_store) {
        const int h = c / 64, cc = c % 64;
        *reinterpret_cast<__nv_bfloat162*>(swz + h * (64 * C * 128) + r * 128 + ((((cc * 2) / 16) ^ (r % 8)) * 16) + (cc * 2) % 16) =
            __floats2bfloat162_rn(v0, v1);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(tile + r * kStride + c) = __floats2bfloat162_rn(v0, v1);
      }
    };
    if (turn == 0) {
#pragma unroll
      for (int i = 0; i < BN / 2; i += 2) {
        const int r = warp_row + lane / 4 + 8 * ((i / 2) % 2), c = 8 * (i / 4) + 2 * (lane % 4);
        float v0 = acc[i], v1 = acc[i + 1];
        if (ALT > 1) {
          const float2 o = *reinterpret_cast<const float2*>(partial + r * kPStride + c);
          v0 += o.x, v1 += o.y;
        }
        tile_value(i, v0, v1);
      }
      if (tma_store) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // visible to the copy engine
    }
    asm volatile("bar.sync 1, %0;\n" ::"r"(128 * kConsumers) : "memory");  // the tile is whole
    if (tma_store) {
      if (threadIdx.x == 128) {
        for (int h = 0; h < BN / 64; h++)
          asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                       ::"l"(reinterpret_cast<uint64_t>(&y_map)), "r"(out0 + 64 * h), "r"(row0),
                         "r"(smem_address(swz + h * (64 * C * 128)))
                       : "memory");
        asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;\n" ::: "memory");
      }
    } else {
      constexpr int kChunks = BN / 8;
      for (int q = int(threadIdx.x) - 128; q < 64 * C * kChunks; q += 128 * kConsumers) {
        const int r = q / kChunks, c = q % kChunks * 8;
        if (row0 + r < n && out0 + c < out)  // out % 8 == 0; BN = 96 leaves a part tile at the end
          *reinterpret_cast<uint4*>(y + int64_t(row0 + r) * out + out0 + c) = *reinterpret_cast<const uint4*>(tile + r * kStride + c);
      }
    }
    if (stamp && threadIdx.x == 128) g_stamps[block_id][5] = now_cycles() - t_start;
    // The releases not yet made (the last `lag` turns of this consumer), after the stores.
    for (int t = turn; t < k_tiles; t += ALT)
      if (t + lag * ALT >= k_tiles) release(t);
    if (stamp && threadIdx.x == 128) g_stamps[block_id][6] = now_cycles() - t_start;
  }
}

// WMC_PROMO_W / WMC_PROMO_X: the L2 promotion of W's and x's boxes (0 none, 64, 128, 256 bytes; 256 default).
const void* g_x_matrix = nullptr;  // the sweep's x: every other matrix is a W
CUtensorMapL2promotion promotion(const bf16* M) {
  const char* v = std::getenv(M == g_x_matrix ? "WMC_PROMO_X" : "WMC_PROMO_W");
  const int b = v ? std::atoi(v) : 256;
  return b == 0 ? CU_TENSOR_MAP_L2_PROMOTION_NONE : b == 64 ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
       : b == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
}
CUtensorMap tensor_map(const bf16* M, int rows, int in, int box_rows) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  static std::map<std::tuple<const bf16*, int, int, int>, CUtensorMap> known;
  const auto key = std::make_tuple(M, rows, in, box_rows);
  auto it = known.find(key);
  if (it != known.end()) return it->second;
  CUtensorMap map;
  const cuuint64_t size[2] = {cuuint64_t(in), cuuint64_t(rows)};
  const cuuint64_t row_bytes[1] = {cuuint64_t(in) * sizeof(bf16)};
  const cuuint32_t box[2] = {64u, cuuint32_t(box_rows)}, strides[2] = {1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(M), size, row_bytes, box, strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion(M),
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    fail("encode");
  return known[key] = map;
}

struct Plan {
  int c, bn, splits, depth, stages, m = 0, wm = 0, flags = 0, alt = 0, lag = 1;
};

template <int BN, int C>
void launch_shape(bf16* y, const bf16* x, const bf16* W, int n, int in, int out, const Plan& p, cudaStream_t stream) {
  using S = Shape<BN, C>;
  static bool set = false;
  if (!set) {
    CUDA_CHECK(cudaFuncSetAttribute(ring_kernel<BN, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    set = true;
  }
  const dim3 grid{unsigned(p.splits), unsigned((out + BN - 1) / BN), unsigned((n + S::kRows - 1) / S::kRows)};
  launch_overlapped_in_clusters(ring_kernel<BN, C>, grid, unsigned(p.splits), S::kThreads, S::smem(p.stages), stream, y,
                                tensor_map(x, n, in, S::kRows), tensor_map(W, out, in, BN), n, in, out, p.depth,
                                p.stages);
}


template <int BN, int C, int M>
void launch_mc(bf16* y, const bf16* x, const bf16* W, int n, int in, int out, const Plan& p, cudaStream_t stream) {
  using S = Shape<BN, C>;
  static bool set = false;
  if (!set) {
    CUDA_CHECK(cudaFuncSetAttribute(mc_kernel<BN, C, M>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    set = true;
  }
  const dim3 grid{unsigned((out + BN - 1) / BN), unsigned((n + S::kRows - 1) / S::kRows)};
  launch_overlapped_in_clusters(mc_kernel<BN, C, M>, grid, unsigned(M), S::kThreads, S::smem(p.stages), stream, y,
                                tensor_map(x, n, in, S::kRows / M), tensor_map(W, out, in, BN), n, in, out, p.stages);
}

template <int BN, int C, int M>
void launch_wmc(bf16* y, const bf16* x, const bf16* W, int n, int in, int out, const Plan& p, cudaStream_t stream) {
  using S = Shape<BN, C>;
  static bool set = false;
  if (!set) {
    CUDA_CHECK(cudaFuncSetAttribute(wmc_kernel<BN, C, M, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    CUDA_CHECK(cudaFuncSetAttribute(wmc_kernel<BN, C, M, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    set = true;
  }
  const int row_tiles = (n + S::kRows - 1) / S::kRows;
  const dim3 grid{unsigned((row_tiles + M - 1) / M * M), unsigned((out + BN - 1) / BN)};
  launch_overlapped_in_clusters((p.flags & 16) ? wmc_kernel<BN, C, M, true> : wmc_kernel<BN, C, M, false>, grid, unsigned(M), S::kThreads, S::smem(p.stages), stream, y,
                                tensor_map(x, n, in, S::kRows), tensor_map(W, out, in, BN / M), n, in, out, p.stages, p.flags);
}

template <int BN, int C, int M, int ALT>
void launch_alt(bf16* y, const bf16* x, const bf16* W, int n, int in, int out, const Plan& p, cudaStream_t stream) {
  using S = Shape<BN, C>;
  // lag bits 19-20: the accumulator chains a consumer keeps (1, 2, 4), k slice k into chain k % CH
  constexpr int C2 = BN >= 256 ? 1 : 2, C4 = BN == 64 ? 4 : C2;
  static bool set = false;
  if (!set) {
    CUDA_CHECK(cudaFuncSetAttribute(alt_kernel<BN, C, M, ALT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    CUDA_CHECK(cudaFuncSetAttribute(alt_kernel<BN, C, M, ALT, C2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    CUDA_CHECK(cudaFuncSetAttribute(alt_kernel<BN, C, M, ALT, C4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024 - 1024));
    set = true;
  }
  const int ch_code = (p.lag >> 19) & 3;
  auto kernel = ch_code == 2 ? alt_kernel<BN, C, M, ALT, C4> : ch_code == 1 ? alt_kernel<BN, C, M, ALT, C2> : alt_kernel<BN, C, M, ALT, 1>;
  const int row_tiles = (n + S::kRows - 1) / S::kRows;
  const dim3 grid{unsigned((row_tiles + M - 1) / M * M), unsigned((out + BN - 1) / BN)};
  const size_t smem = size_t(p.stages) * S::kStageBytes + 64 * C * (BN + 8) * 4 * (ALT > 1 ? 1 : 0) + 64 * C * (BN + 8) * 2 + 1024;
  launch_overlapped_in_clusters(kernel, grid, unsigned(M), 128 * (C * ALT + 1), smem, stream, y,
                                tensor_map(x, n, in, S::kRows), tensor_map(W, out, in, BN / M),
                                tensor_map(y, n, out, S::kRows), n, in, out, p.stages, p.lag);
}
size_t alt_smem(const Plan& p) {
  return size_t(p.stages) * (p.bn + 64 * p.c) * 128 + 64 * p.c * (p.bn + 8) * 4 * (p.alt > 1 ? 1 : 0) + 64 * p.c * (p.bn + 8) * 2 + 1024;
}

int stage_bytes(const Plan& p) { return (p.bn + 64 * p.c) * 128; }

void launch(bf16* y, const bf16* x, const bf16* W, int n, int in, int out, const Plan& p, cudaStream_t stream) {
  if (p.alt) {
    switch (p.bn * 1000 + p.c * 100 + p.wm * 10 + p.alt) {
      case 64121: return launch_alt<64, 1, 2, 1>(y, x, W, n, in, out, p, stream);
      case 64122: return launch_alt<64, 1, 2, 2>(y, x, W, n, in, out, p, stream);
      case 128121: return launch_alt<128, 1, 2, 1>(y, x, W, n, in, out, p, stream);
      case 128122: return launch_alt<128, 1, 2, 2>(y, x, W, n, in, out, p, stream);
      case 64221: return launch_alt<64, 2, 2, 1>(y, x, W, n, in, out, p, stream);
      case 64222: return launch_alt<64, 2, 2, 2>(y, x, W, n, in, out, p, stream);
      case 96121: return launch_alt<96, 1, 2, 1>(y, x, W, n, in, out, p, stream);
      case 96122: return launch_alt<96, 1, 2, 2>(y, x, W, n, in, out, p, stream);
      case 256121: return launch_alt<256, 1, 2, 1>(y, x, W, n, in, out, p, stream);
    }
    fail("no alt shape");
  }
  if (p.wm) {
    switch (p.bn * 100 + p.c * 10 + p.wm) {
      case 6412: return launch_wmc<64, 1, 2>(y, x, W, n, in, out, p, stream);
      case 6414: return launch_wmc<64, 1, 4>(y, x, W, n, in, out, p, stream);
      case 6422: return launch_wmc<64, 2, 2>(y, x, W, n, in, out, p, stream);
      case 12812: return launch_wmc<128, 1, 2>(y, x, W, n, in, out, p, stream);
      case 12814: return launch_wmc<128, 1, 4>(y, x, W, n, in, out, p, stream);
      case 12822: return launch_wmc<128, 2, 2>(y, x, W, n, in, out, p, stream);
    }
    fail("no wmc shape");
  }
  if (p.m) {
    switch (p.bn * 100 + p.c * 10 + p.m) {
      case 6412: return launch_mc<64, 1, 2>(y, x, W, n, in, out, p, stream);
      case 6414: return launch_mc<64, 1, 4>(y, x, W, n, in, out, p, stream);
      case 6422: return launch_mc<64, 2, 2>(y, x, W, n, in, out, p, stream);
      case 6424: return launch_mc<64, 2, 4>(y, x, W, n, in, out, p, stream);
      case 12812: return launch_mc<128, 1, 2>(y, x, W, n, in, out, p, stream);
      case 12822: return launch_mc<128, 2, 2>(y, x, W, n, in, out, p, stream);
      case 12824: return launch_mc<128, 2, 4>(y, x, W, n, in, out, p, stream);
    }
    fail("no mc shape");
  }
  switch (p.bn * 10 + p.c) {
    case 641: return launch_shape<64, 1>(y, x, W, n, in, out, p, stream);
    case 642: return launch_shape<64, 2>(y, x, W, n, in, out, p, stream);
    case 644: return launch_shape<64, 4>(y, x, W, n, in, out, p, stream);
    case 1281: return launch_shape<128, 1>(y, x, W, n, in, out, p, stream);
    case 1282: return launch_shape<128, 2>(y, x, W, n, in, out, p, stream);
    case 1284: return launch_shape<128, 4>(y, x, W, n, in, out, p, stream);
  }
  fail("no shape");
}

__global__ void fill_random(bf16* p, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    p[i] = __float2bfloat16((float(h & 0xFFFF) / 65536.0f - 0.5f) * 0.25f);
  }
}

constexpr int kLayers = 28, kReplays = 20;

float time_per_call(cudaStream_t stream, const std::function<void(int)>& call) {
  for (int l = 0; l < kLayers; l++) call(l);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < kLayers; l++) call(l);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; i++) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < kReplays; i++) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return ms * 1000.0f / float(kReplays * kLayers);
}

}  // namespace

int probe(int argc, char** argv);
int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "probe") return probe(argc, argv);
  std::vector<int> rows;
  for (int i = 1; i < argc; i++) rows.push_back(std::atoi(argv[i]));
  if (rows.empty()) rows = {64, 96, 128, 192, 256};
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas;
  cublasCreate(&cublas);
  cublasSetStream(cublas, stream);
  void* workspace;
  CUDA_CHECK(cudaMalloc(&workspace, 32 << 20));
  cublasSetWorkspace(cublas, workspace, 32 << 20);
  struct Projection {
    const char* name;
    int in, out;
  };
  const Projection projections[] = {{"qkv", 1024, 4096}, {"o_proj", 2048, 1024}, {"gate_up", 1024, 6144}, {"down_proj", 3072, 1024}};
  std::vector<bf16*> weights;
  for (int l = 0; l < kLayers; l++)
    for (const Projection& p : projections) {
      bf16* w;
      CUDA_CHECK(cudaMalloc(&w, size_t(p.in) * p.out * 2));
      fill_random<<<512, 256>>>(w, size_t(p.in) * p.out, 17u + l * 4u + uint32_t(&p - projections));
      weights.push_back(w);
    }
  bf16 *x, *y, *y_ref;
  CUDA_CHECK(cudaMalloc(&x, size_t(512) * 6144 * 2));
  CUDA_CHECK(cudaMalloc(&y, size_t(512) * 6144 * 2));
  CUDA_CHECK(cudaMalloc(&y_ref, size_t(512) * 6144 * 2));
  fill_random<<<512, 256>>>(x, size_t(512) * 6144, 99u);
  g_x_matrix = x;
  CUDA_CHECK(cudaDeviceSynchronize());
  auto W = [&](int l, int k) { return weights[size_t(l) * 4 + k]; };
  auto cublas_call = [&](bf16* out_y, int l, int k, int n) {
    const Projection& p = projections[k];
    const float alpha = 1.0f, beta = 0.0f;
    if (cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, p.out, n, p.in, &alpha, W(l, k), CUDA_R_16BF, p.in, x,
                     CUDA_R_16BF, p.in, &beta, out_y, CUDA_R_16BF, p.out, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      fail("cublas");
  };
  int max_smem = 0;  // less the static barriers
  CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  max_smem -= 1024;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("µs per call, 28 calls on distinct weights in a CUDA graph; max error against cuBLAS\n");
  std::vector<bf16> a(size_t(512) * 6144), b(size_t(512) * 6144);
  for (int n : rows) {
    for (int k = 0; k < 4; k++) {
      const Projection& p = projections[k];
      const float cublas_us = time_per_call(stream, [&](int l) { cublas_call(y, l, k, n); });
      cublas_call(y_ref, 0, k, n);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaMemcpy(a.data(), y_ref, size_t(n) * p.out * 2, cudaMemcpyDeviceToHost));
      std::vector<std::pair<float, std::string>> results;
      const int k_tiles = p.in / 64;
      for (int c : {1, 2, 4}) {
        if (64 * c > 2 * n + 63 && c > 1) continue;  // more than half the block's rows empty
        for (int bn : {64, 96, 128})
          for (int splits : {1, 2, 3, 4, 6, 8}) {
            const int depth = (k_tiles + splits - 1) / splits;
            if ((splits - 1) * depth >= k_tiles) continue;
            const int tiles = ((p.out + bn - 1) / bn) * ((n + 64 * c - 1) / (64 * c));
            if (tiles * splits > 2 * 132 || tiles * splits < 48) continue;
            for (int m : {0, 2, 4, -2, -4}) {
            const int wm = m < 0 ? -m : 0;
            if (m > 0 && (splits != 1 || c == 4 || (bn == 128 && c == 1 && m == 4) || (p.out / bn) % m))
              continue;
            if (wm && (splits != 1 || c == 4 || (bn == 64 && c == 2 && wm == 4) || (n + 64 * c - 1) / (64 * c) < wm))
              continue;
            // {wmc flags, alt consumers, alt's lag code (bits 8-15 W's stages ahead of the wait, 16 TMA store)}
            struct Variant { int flags, alt, lag; };
            for (const Variant v : std::vector<Variant>{{0, 0, 0}, {200, 0, 0}, {0, 1, 1 | 4 << 8}, {0, 1, 1 | 4 << 8 | 1 << 19},
                                                        {0, 1, 1 | 4 << 8 | 2 << 19}, {0, 2, 1 | 4 << 8},
                                                        {0, 2, 1 | 4 << 8 | 1 << 19}, {0, 2, 1 | 4 << 8 | 2 << 19}}) {
            const int flags = v.flags, alt = v.alt, lag = v.lag, variant = flags + alt;
            if (variant && !wm) continue;
            if (alt && (wm != 2 || (bn == 128 && c == 2))) continue;
            if (bn == 96 && (!alt || c != 1 || (lag & 1 << 16))) continue;  // 96 outputs: alt_kernel only, no TMA store
            Plan plan{c, bn, splits, depth, 0, m > 0 ? m : 0, wm, flags, alt, lag};
            for (int stages : {2, 3, 4, 6, 8, 10, 12, 13, 16}) {
              plan.stages = stages;
              if (stages > depth && stages != std::min(depth, 16)) continue;
              if (stages > depth) continue;
              if (std::max(stages * stage_bytes(plan), 64 * c * (bn + 8) * 4) + 1024 > max_smem)
                continue;
              if (alt && alt_smem(plan) > size_t(max_smem)) continue;
              // A stage is refilled only after the tile lag x alt later is consumed, and each stage must belong to
              // one consumer (its waits then go phase by phase): else a deadlock. No refills: nothing to check.
              if (alt && stages < depth && (stages % alt != 0 || stages <= (lag & 0xff) * alt)) continue;
              CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(n) * p.out * 2, stream));
              launch(y, x, W(0, k), n, p.in, p.out, plan, stream);
              CUDA_CHECK(cudaStreamSynchronize(stream));
              CUDA_CHECK(cudaMemcpy(b.data(), y, size_t(n) * p.out * 2, cudaMemcpyDeviceToHost));
              float err = 0, ref = 0;
              for (size_t i = 0; i < size_t(n) * p.out; i++) {
                err = std::max(err, std::abs(__bfloat162float(a[i]) - __bfloat162float(b[i])));
                ref = std::max(ref, std::abs(__bfloat162float(a[i])));
              }
              const float us = time_per_call(stream, [&](int l) { launch(y, x, W(l, k), n, p.in, p.out, plan, stream); });
              char text[160];
              std::snprintf(text, sizeof(text), "%d wg %3d out %d splits %2d stages mc %d wmc %d f%d alt %d lag %#x: %5.2f (err %.3g of %.3g)", c, bn,
                            splits, stages, plan.m, wm, flags, alt, lag, us, err, ref);
              results.push_back({(flags & 16) ? us + 1000.0f : err > 0.02f * ref ? 1e9f : us, text});
            }
            }
            }
          }
      }
      std::sort(results.begin(), results.end());
      std::printf("%3d rows %-9s cuBLAS %5.2f | best: %s\n", n, p.name, cublas_us,
                  results.empty() ? "none" : results[0].second.c_str());
      for (size_t i = 1; i < results.size() && i < 4; i++) std::printf("      %s\n", results[i].second.c_str());
      for (const char* tag : {"wmc 2 f200 ", "alt 1 lag 0x401:", "alt 1 lag 0x80401:", "alt 1 lag 0x100401:", "alt 2 lag 0x401:", "alt 2 lag 0x80401:", "alt 2 lag 0x100401:"})
        for (auto& r : results)
          if (r.second.find(tag) != std::string::npos) { std::printf("      best %s\n", r.second.c_str()); break; }
      for (auto& r : results)
        if (r.first > 1e8f) std::printf("      WRONG %s\n", r.second.c_str());
    }
  }
  return 0;
}

#include <cuda_profiler_api.h>
// ring probe N IN OUT C BN SPLITS STAGES M: cuBLAS, then the plan, 3 times each between profiler markers.
int probe(int argc, char** argv) {
  if (argc != 10) fail("usage: ring probe N IN OUT C BN SPLITS STAGES M");
  const int n = std::atoi(argv[2]), in = std::atoi(argv[3]), out = std::atoi(argv[4]);
  Plan plan{std::atoi(argv[5]), std::atoi(argv[6]), std::atoi(argv[7]), 0, std::atoi(argv[8]), std::atoi(argv[9])};
  plan.depth = (in / 64 + plan.splits - 1) / plan.splits;
  if (plan.m < 0) plan.wm = -plan.m, plan.m = 0;
  if (const char* f = std::getenv("WMC_FLAGS")) plan.flags = std::atoi(f);
  if (plan.wm && std::getenv("WMC_ALT")) plan.alt = std::atoi(std::getenv("WMC_ALT"));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas;
  cublasCreate(&cublas);
  cublasSetStream(cublas, stream);
  bf16 *x, *w, *y;
  CUDA_CHECK(cudaMalloc(&x, size_t(n) * in * 2));
  CUDA_CHECK(cudaMalloc(&w, size_t(out) * in * 2));
  CUDA_CHECK(cudaMalloc(&y, size_t(n) * out * 2));
  fill_random<<<512, 256>>>(x, size_t(n) * in, 1u);
  fill_random<<<512, 256>>>(w, size_t(out) * in, 2u);
  const float alpha = 1.0f, beta = 0.0f;
  auto cub = [&] {
    cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, CUDA_R_16BF, in, x, CUDA_R_16BF, in, &beta,
                 y, CUDA_R_16BF, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  for (int i = 0; i < 3; i++) cub(), launch(y, x, w, n, in, out, plan, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaProfilerStart();
  for (int i = 0; i < 2; i++) cub();
  for (int i = 0; i < 2; i++) launch(y, x, w, n, in, out, plan, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaProfilerStop();
  if (plan.wm && std::getenv("WMC_ALT")) {
    // alt_kernel's phases (thread 128: the first consumer), for lag codes with and without the TMA store.
    plan.alt = std::atoi(std::getenv("WMC_ALT"));
    std::vector<bf16*> ws(28);
    for (auto& p : ws) {
      CUDA_CHECK(cudaMalloc(&p, size_t(out) * in * 2));
      fill_random<<<512, 256>>>(p, size_t(out) * in, 3u);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int> codes = {1 | 4 << 8, 1 | 4 << 8 | 1 << 19, 1 | 4 << 8 | 2 << 19};
    if (std::getenv("WMC_PRELOAD")) codes = {1, 1 | 1 << 18, 1 | 1 << 18 | 1 << 19, 1 | 1 << 18 | 2 << 19, 1 | 1 << 19, 1 | 2 << 19};  // needs stages >= in / 64
    for (int code : codes) {
      plan.lag = code | 1 << 17;
      double sum[7] = {};
      int blocks = 0;
      for (int l = 0; l < 28; l++) {
        launch(y, x, ws[l], n, in, out, plan, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        static long long h[1024][8];
        CUDA_CHECK(cudaMemcpyFromSymbol(h, g_stamps, sizeof(h)));
        const int nb = ((n + 64 * plan.c - 1) / (64 * plan.c) + plan.wm - 1) / plan.wm * plan.wm * ((out + plan.bn - 1) / plan.bn);
        for (int b = 0; b < nb; b++)
          for (int j = 0; j < 7; j++) sum[j] += double(h[b][j]);
        blocks += nb;
      }
      std::printf("alt %d lag %#x cycles: synced %.0f | copies issued %.0f | stage0 %.0f | last %.0f | products %.0f | stored %.0f | end %.0f\n",
                  plan.alt, code, sum[0] / blocks, sum[1] / blocks, sum[2] / blocks, sum[3] / blocks, sum[4] / blocks,
                  sum[5] / blocks, sum[6] / blocks);
    }
  }
  if (plan.wm && std::getenv("WMC_STAMPS")) {
    // Phases of every block (cycles from its start), averaged over blocks and over 28 launches on distinct W.
    std::vector<bf16*> ws(28);
    for (auto& p : ws) {
      CUDA_CHECK(cudaMalloc(&p, size_t(out) * in * 2));
      fill_random<<<512, 256>>>(p, size_t(out) * in, 3u);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    const int base_flags = plan.flags;
    for (int f : {base_flags, base_flags | 8, base_flags | 72, base_flags | 200, base_flags | 204, base_flags | 216}) {
      plan.flags = f | 32;
      double sum[7] = {}, mx[7] = {};
      int blocks = 0;
      for (int l = 0; l < 28; l++) {
        launch(y, x, ws[l], n, in, out, plan, stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        static long long h[1024][8];
        CUDA_CHECK(cudaMemcpyFromSymbol(h, g_stamps, sizeof(h)));
        const int nb = 128;  // the probe's grids at 128 rows
        for (int b = 0; b < nb; b++)
          for (int j = 0; j < 7; j++) sum[j] += double(h[b][j]), mx[j] = std::max(mx[j], double(h[b][j]));
        blocks += nb;
      }
      std::printf("flags %2d cycles from block start: synced %.0f | x issued %.0f | stage0 full %.0f | last full %.0f | products done %.0f | stored %.0f | exit sync %.0f   (max: %.0f %.0f %.0f %.0f %.0f %.0f %.0f)\n",
                  f, sum[0] / blocks, sum[1] / blocks, sum[2] / blocks, sum[3] / blocks, sum[4] / blocks, sum[5] / blocks,
                  sum[6] / blocks, mx[0], mx[1], mx[2], mx[3], mx[4], mx[5], mx[6]);
    }
  }
  std::printf("probe done\n");
  return 0;
}
