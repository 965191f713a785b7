// linear_wide_gemv_mma.cu: v7 of the projection, y (n, out) = x (n, in) @ W (out, in)^T for n <= 64 rows:
// v5's tensor-core GEMV with x shared by two weight groups per warp, up to 64 rows of x per mma group, and
// the in_features split over a thread-block cluster reduced in distributed shared memory.
//
// v5 (linear_gemv_mma.cu) loads 16 bytes of two weight rows and of one x row per lane and uses the words
// of each load as mma fragments directly (its header explains the permuted k order). It wins from 2 to 8
// rows and loses to cuBLAS at 16, for two reasons measured in 04_model_runner/NOTES.md: each 16-output
// group reloads all of x (at 16 rows x costs as many bytes from L2 as W from memory), and for few outputs
// its block split needs a second kernel to add the partials. v7 changes three things:
//   - a warp multiplies each x load by kGroups = 2 groups of 16 weight rows (32 outputs per block), so
//     x is loaded once per 32 outputs instead of once per 16;
//   - X_TILES (1, 2, 4 or 8) tiles of 8 rows of x ride in the same loop, up to 64 rows, with 4, 4, 2 or 1
//     k blocks of loads in flight per warp (what the registers allow);
//   - the in_features split over blocks (splits = 1, 2, 4 or 8) is one thread-block cluster: the blocks
//     leave their sums in shared memory and add them through distributed shared memory (as v6 does), with
//     no partials in memory and no second kernel.
// Inside a block, 4 warps take every 4th 32-wide k block of the block's range; their sums are added in
// warp order, then the cluster's in split order: the result does not depend on which block finished first.
//
// Versions of the projection (linear.h): v1 cuBLAS, v2 GEMV, v3 cuBLASLt, v4 and v6 split-K GEMM, v5 the
// tensor-core GEMV, v7 this file. CPU reference: linear_cpu. Prediction and measurement:
// 04_model_runner/NOTES.md.
#include <cstdint>

#include <cooperative_groups.h>

#include "01_sequence/base/ptx.cuh"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

constexpr int kWarps = 4;   // warps per block, splitting the block's in_features in 32-wide k blocks
constexpr int kGroups = 2;  // groups of 16 weight rows per warp: 32 outputs per block
constexpr int kMaxSplits = 8;  // the largest portable cluster

__device__ inline void store_out(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store_out(float* p, float v) { *p = v; }

// Block (output group, split): outputs o0 = 32 * blockIdx.x .. o0 + 31, in_features of split blockIdx.y
// (k_per_split of them, a multiple of 32); the blockIdx.y blocks of an output group are one cluster.
// Rows of x: 8 * X_TILES at most.
template <int X_TILES, class OutT>
__global__ void __launch_bounds__(kWarps * 32)
    linear_wide_gemv_mma_kernel(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, int k_per_split) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int o0 = 32 * blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int k_begin = split * k_per_split, k_end = min(in, k_begin + k_per_split);
  // Weight rows of this lane: group j's rows o0 + 16 j + g (the A fragment's a0, a2) and + 8 (a1, a3).
  const bf16* w_row[kGroups][2];
  bool w_ok[kGroups][2];
#pragma unroll
  for (int j = 0; j < kGroups; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int o = o0 + 16 * j + 8 * h + g;
      w_ok[j][h] = o < out;
      w_row[j][h] = W + int64_t(w_ok[j][h] ? o : 0) * in;
    }

  // Overlapped launch: the weights are nobody's output, so ask L2 for this warp's first weight lines
  // before waiting for the kernel that writes x.
  {
    const int k = k_begin + 32 * warp + 8 * t4;
#pragma unroll
    for (int j = 0; j < kGroups; j++)
#pragma unroll
      for (int h = 0; h < 2; h++)
        if (k < k_end && w_ok[j][h]) asm volatile("prefetch.global.L2 [%0];" ::"l"(w_row[j][h] + k));
  }
  wait_for_previous_kernel();
  allow_next_kernel();

  // C of group j, x tile t: (output o0 + 16 j + g (+ 8 for c2, c3), x row 8 t + 2 t4 + {0, 1}).
  // kUnroll k blocks of loads are issued before the first multiply: about 100 bytes in flight per lane.
  constexpr int kUnroll = X_TILES <= 2 ? 4 : X_TILES == 4 ? 2 : 1;
  float acc[kGroups][X_TILES][4] = {};
  for (int kb = k_begin + 32 * warp; kb < k_end; kb += 32 * kWarps * kUnroll) {
    uint4 w[kUnroll][kGroups][2], xr[kUnroll][X_TILES];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {  // every load first: 16 bytes per weight row, then per x row
      const int k = kb + 32 * kWarps * u + 8 * t4;  // this lane's 8 in_features (in % 8 == 0: all in or none)
      const bool k_ok = k < k_end;
#pragma unroll
      for (int j = 0; j < kGroups; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
          w[u][j][h] = k_ok && w_ok[j][h] ? __ldcs(reinterpret_cast<const uint4*>(w_row[j][h] + k)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int t = 0; t < X_TILES; t++) {
        const int row = 8 * t + g;
        xr[u][t] = k_ok && row < n ? __ldg(reinterpret_cast<const uint4*>(x + int64_t(row) * in + k))
                                   : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
#pragma unroll
      for (int j = 0; j < kGroups; j++) {
        // Step s = 0 takes words x, y of each load (in_features + 0..3), s = 1 words z, w (+ 4..7): v5's map.
        const uint32_t a_s0[4] = {w[u][j][0].x, w[u][j][1].x, w[u][j][0].y, w[u][j][1].y};
        const uint32_t a_s1[4] = {w[u][j][0].z, w[u][j][1].z, w[u][j][0].w, w[u][j][1].w};
#pragma unroll
        for (int t = 0; t < X_TILES; t++) {
          mma_16816(acc[j][t], a_s0, xr[u][t].x, xr[u][t].y);
          mma_16816(acc[j][t], a_s1, xr[u][t].z, xr[u][t].w);
        }
      }
  }

  // Every warp's sums into this block's shared memory: (warps, kGroups * X_TILES * 4 values, 32 lanes).
  constexpr int kValues = kGroups * X_TILES * 4;
  __shared__ float part[kWarps][kValues][32];
#pragma unroll
  for (int j = 0; j < kGroups; j++)
#pragma unroll
    for (int t = 0; t < X_TILES; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) part[warp][(j * X_TILES + t) * 4 + e][lane] = acc[j][t][e];
  // Then block `split` of the cluster adds value slots split * kValues / splits .. of every block, warps
  // in order, blocks in split order, and writes them (with one split: the block adds its own warps).
  const float* parts[kMaxSplits];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (splits > 1) {
    cluster.sync();  // every block's sums are written and visible to the cluster
    for (int s = 0; s < splits; s++) parts[s] = cluster.map_shared_rank(&part[0][0][0], s);
  } else
#endif
  {
    __syncthreads();  // every warp's sums are written
    parts[0] = &part[0][0][0];
  }
  const int v_begin = split * kValues / splits, v_end = (split + 1) * kValues / splits;
  for (int i = v_begin * 32 + int(threadIdx.x); i < v_end * 32; i += kWarps * 32) {
    const int v = i / 32, l = i % 32;  // value slot, lane of the warps that computed it
    float sum = 0.0f;
    for (int s = 0; s < splits; s++)
      for (int w = 0; w < kWarps; w++) sum += parts[s][(w * kValues + v) * 32 + l];
    const int j = v / (X_TILES * 4), t = (v / 4) % X_TILES, e = v % 4;
    const int o = o0 + 16 * j + (l / 4) + 8 * (e / 2), row = 8 * t + 2 * (l % 4) + e % 2;
    if (o < out && row < n) store_out(y + int64_t(row) * out + o, sum);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (splits > 1) cluster.sync();  // no block exits (freeing its shared memory) while another reads it
#endif
}

template <int X_TILES, class OutT>
void launch(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, cudaStream_t stream) {
  const int splits = linear_wide_gemv_mma_splits(n, in, out);
  const int k_per_split = (in / splits + 31) / 32 * 32;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // overlapped, as launch_overlapped
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = 1, attrs[1].val.clusterDim.y = unsigned(splits), attrs[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned((out + 31) / 32), unsigned(splits)), config.blockDim = kWarps * 32;
  config.stream = stream, config.attrs = attrs;
  config.numAttrs = splits > 1 ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, linear_wide_gemv_mma_kernel<X_TILES, OutT>, y, x, W, n, in, out, k_per_split));
}

template <class OutT>
void launch_for_rows(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, cudaStream_t stream) {
  if (n <= 8) launch<1>(y, x, W, n, in, out, stream);
  else if (n <= 16) launch<2>(y, x, W, n, in, out, stream);
  else if (n <= 32) launch<4>(y, x, W, n, in, out, stream);
  else launch<8>(y, x, W, n, in, out, stream);
}

}  // namespace

int linear_wide_gemv_mma_splits(int n, int in_features, int out_features) {
  // Doubling while the output groups give fewer blocks than SMs, each split at least one 32-wide k block
  // per warp deep.
  (void)n;
  const int groups = (out_features + 31) / 32;
  int splits = 1;
  while (splits < kMaxSplits && groups * splits < 132 && in_features / (2 * splits) >= 32 * kWarps) splits *= 2;
  return splits;
}

bool linear_wide_gemv_mma_available() {
  // The cluster reduction is compiled for sm_90 and later only; the code loaded for this GPU must be it.
  static const bool available = [] {
    cudaFuncAttributes kernel = {};
    CUDA_CHECK(cudaFuncGetAttributes(&kernel, linear_wide_gemv_mma_kernel<1, bf16>));
    return kernel.binaryVersion >= 90;
  }();
  return available;
}

bool linear_wide_gemv_mma_fits(const bf16* x, const bf16* W, int n, int in_features) {
  return n >= 1 && n <= kWideGemvMaxRows && in_features % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W) % 16 == 0;
}

void linear_wide_gemv_mma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                               int out_features, cudaStream_t stream) {
  if (!linear_wide_gemv_mma_fits(x, W, n, in_features) || !linear_wide_gemv_mma_available())
    fail("linear_wide_gemv_mma_cuda: needs 1 <= n <= ", kWideGemvMaxRows,
         ", in_features % 8 == 0, 16-byte aligned x and W, and sm_90 code (n ", n, ", in ", in_features, ")");
  if (y_is_fp32) launch_for_rows(static_cast<float*>(y), x, W, n, in_features, out_features, stream);
  else launch_for_rows(static_cast<bf16*>(y), x, W, n, in_features, out_features, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
