// linear_split_k.cu: v4 of the projection, y (n, out) = x (n, in) @ W (out, in)^T on tensor cores with
// small tiles and split-K: the decode batches of 2 to a few hundred rows.
//
// At n = 256 a layer projection of Qwen3-0.6B is a skinny GEMM: o_proj is 256 x 1024 outputs over
// 2,048 inputs. A GEMM library tiles the output in 128 x 128 (or larger) tiles: 16 tiles for 132 SMs, so
// most of the GPU waits while a few SMs stream the whole weight (cuBLAS measured 14-36% of the copy
// bandwidth on these shapes, 04_model_runner/NOTES.md). Two cuts give every SM work:
//   - small tiles, 64 rows x 64 outputs: 4 x 16 = 64 tiles for o_proj at n = 256;
//   - split-K: the in_features are cut into `splits` ranges, each its own thread block writing an fp32
//     partial tile; a second kernel adds the partials (in split order, so the result does not depend on
//     which block finished first) and rounds once. o_proj at n = 256 runs 5 splits: 320 blocks.
// The weight tile of a block is read from memory once and used for all 64 rows of its x tile; the 4
// row tiles of one weight tile are neighbours in the grid, so 3 of the 4 reads of it hit L2.
//
// Inside a block (4 warps, 2 x 2, each 32 rows x 32 outputs): 64 x 64 tiles of x and W (64 in_features
// deep) stream through a 3-stage cp.async pipeline into XOR-swizzled shared memory; ldmatrix feeds
// mma.sync m16n8k16 (05_attention/v5_tensor_core_prefill.cu's header explains both), fp32 accumulation.
// W's rows are (out, in) with in contiguous: the "column-major" B operand as it stands, no transpose.
//
// This is v4 of the projection's versions (linear.h lists them all). CPU reference:
// linear_cpu. Prediction and measurement: 04_model_runner/NOTES.md.
#include <cstdint>

#include "01_sequence/base/ptx.cuh"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

constexpr int kTileRows = 64;  // rows of x (and of y) per block
constexpr int kTileOut = 64;   // output features (rows of W) per block
constexpr int kTileIn = 64;    // in_features per pipeline stage
constexpr int kStagesGemm = 3;      // 3 x (8 KB of x + 8 KB of W) = 48 KB: the most without the opt-in
constexpr int kThreadsGemm = 128;   // 4 warps, 2 x 2 of 32 x 32 outputs
constexpr int kTileBytes = kTileRows * kTileIn * 2;  // one 64 x 64 bf16 tile: 8 KB

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a 64 x 64 bf16 tile (128-byte rows), XOR
// swizzled so that the 8 rows an ldmatrix matrix reads (same chunk) hit 8 different bank groups.
__device__ inline uint32_t swizzled(int row, int chunk) { return uint32_t(row * 128 + ((chunk ^ (row % 8)) * 16)); }

// The block's 128 threads copy a (64, 64) tile of the (rows, in) bf16 matrix M, rows row0.., columns
// k0.., into shared memory at `tile`: 512 chunks of 16 bytes, 4 per thread. Rows at or past `rows` and
// columns at or past `in` (in % 8 == 0, so a chunk is all in or all out) are zero-filled.
__device__ inline void copy_tile(uint32_t tile, const bf16* M, int rows, int in, int row0, int k0) {
#pragma unroll
  for (int i = 0; i < kTileRows * kTileIn / 8 / kThreadsGemm; i++) {
    const int c = threadIdx.x + i * kThreadsGemm, row = c / 8, chunk = c % 8;
    const bool valid = row0 + row < rows && k0 + chunk * 8 < in;
    const bf16* src = valid ? M + int64_t(row0 + row) * in + k0 + chunk * 8 : M;
    cp_async_16(tile + swizzled(row, chunk), src, valid);
  }
}

// x (n, in) bf16, W (out, in) bf16, in % 8 == 0, both 16-byte aligned; k_per_split a multiple of 64 (the
// last splits may start past in: they add nothing); 128 threads, 48 KB of dynamic shared memory.
// Block (row tile, output tile, split): y[rows, outs] over in_features [split * k_per_split, ...).
// splits == 1: writes y (OutT). splits > 1: writes its fp32 partial to partial[split] (n, out), added up
// by linear_split_k_reduce_kernel.
template <class OutT>
__global__ void __launch_bounds__(kThreadsGemm)
    linear_split_k_kernel(OutT* y, float* partial, const bf16* x, const bf16* W, int n, int in, int out,
                          int k_per_split) {
  extern __shared__ __align__(128) unsigned char smem[];  // (kStagesGemm, x tile + W tile)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int row0 = blockIdx.x * kTileRows, out0 = blockIdx.y * kTileOut, split = blockIdx.z;
  const int k_begin = split * k_per_split, k_end = min(in, k_begin + k_per_split);
  const int k_tiles = (k_end - k_begin + kTileIn - 1) / kTileIn;
  const uint32_t base = smem_address(smem);
  auto x_tile = [&](int s) { return base + uint32_t(s * 2 * kTileBytes); };
  auto w_tile = [&](int s) { return base + uint32_t(s * 2 * kTileBytes + kTileBytes); };

  // Launched overlapped: W is nobody's output, so the prologue's weight tiles start before the wait;
  // x is the previous kernel's output. (Each stage's commit group then holds its x tile; the W tiles
  // issued before the wait fall in the first group, which only makes the first wait longer.)
#pragma unroll
  for (int s = 0; s < kStagesGemm - 1; s++)
    if (s < k_tiles) copy_tile(w_tile(s), W, out, in, out0, k_begin + s * kTileIn);
  wait_for_previous_kernel();
  allow_next_kernel();
#pragma unroll
  for (int s = 0; s < kStagesGemm - 1; s++) {
    if (s < k_tiles) copy_tile(x_tile(s), x, n, in, row0, k_begin + s * kTileIn);
    cp_async_commit();
  }

  // Warp (wm, wn) computes rows wm * 32 .. + 31 and outputs wn * 32 .. + 31 of the tile: 2 m-tiles of 16
  // rows x 4 n-tiles of 8 outputs, 4 fp32 each (the C fragment: rows g, g + 8; outputs 2 t4, 2 t4 + 1).
  const int wm = warp / 2, wn = warp % 2;
  float acc[2][4][4] = {};
  for (int t = 0; t < k_tiles; t++) {
    // Every thread's copies of tile t have landed and are visible; every warp is done with tile t - 1,
    // whose stage the copy below refills.
    cp_async_wait<kStagesGemm - 2>();
    __syncthreads();
    const int ahead = t + kStagesGemm - 1;
    if (ahead < k_tiles) {
      copy_tile(x_tile(ahead % kStagesGemm), x, n, in, row0, k_begin + ahead * kTileIn);
      copy_tile(w_tile(ahead % kStagesGemm), W, out, in, out0, k_begin + ahead * kTileIn);
    }
    cp_async_commit();
    const uint32_t xs = x_tile(t % kStagesGemm), ws = w_tile(t % kStagesGemm);
#pragma unroll
    for (int kk = 0; kk < kTileIn / 16; kk++) {
      // A (x rows, row-major): matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15,
      // k hi) -> a0..a3; lane gives row lane % 16, k half lane / 16.
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; mi++)
        ldmatrix_x4(a[mi], xs + swizzled(wm * 32 + mi * 16 + lane % 16, 2 * kk + lane / 16));
      // B (W rows = outputs, k contiguous): matrices (outs 0-7, k lo), (outs 0-7, k hi), (outs 8-15, k lo),
      // (outs 8-15, k hi) -> b0, b1 of n-tile 2 nj, b0, b1 of n-tile 2 nj + 1.
#pragma unroll
      for (int nj = 0; nj < 2; nj++) {
        uint32_t b[4];
        ldmatrix_x4(b, ws + swizzled(wn * 32 + nj * 16 + lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
          mma_16816(acc[mi][2 * nj], a[mi], b[0], b[1]);
          mma_16816(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the block exits

  const bool direct = gridDim.z == 1;
#pragma unroll
  for (int mi = 0; mi < 2; mi++)
#pragma unroll
    for (int ni = 0; ni < 4; ni++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int row = row0 + wm * 32 + mi * 16 + g + 8 * (e / 2), col = out0 + wn * 32 + ni * 8 + 2 * t4 + e % 2;
        if (row >= n || col >= out) continue;
        if (direct) store_float(y + int64_t(row) * out + col, acc[mi][ni][e]);
        else partial[(int64_t(split) * n + row) * out + col] = acc[mi][ni][e];
      }
}

// y (n, out) = sum over s of partial[s] (n, out), added in split order, rounded once.
template <class OutT>
__global__ void linear_split_k_reduce_kernel(OutT* y, const float* partial, int64_t elems, int splits) {
  wait_for_previous_kernel();  // launched overlapped: the partials are the previous kernel's output
  allow_next_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= elems) return;
  float sum = 0.0f;
  for (int s = 0; s < splits; s++) sum += partial[s * elems + i];
  store_float(y + i, sum);
}

template <class OutT>
void launch_split_k(OutT* y, const bf16* x, const bf16* W, int n, int in, int out, float* workspace,
                    size_t workspace_bytes, cudaStream_t stream) {
  const int row_tiles = (n + kTileRows - 1) / kTileRows, out_tiles = (out + kTileOut - 1) / kTileOut;
  const int splits = linear_split_k_splits(n, in, out, workspace_bytes);
  const int k_per_split = linear_split_k_depth(in, splits);
  const int smem_bytes = kStagesGemm * 2 * kTileBytes;  // 48 KB: no opt-in needed
  const dim3 grid{unsigned(row_tiles), unsigned(out_tiles), unsigned(splits)};
  launch_overlapped(linear_split_k_kernel<OutT>, grid, kThreadsGemm, smem_bytes, stream, y, workspace, x, W, n, in,
                    out, k_per_split);
  if (splits > 1) {
    const int64_t elems = int64_t(n) * out;
    launch_overlapped(linear_split_k_reduce_kernel<OutT>, unsigned((elems + 255) / 256), 256, 0, stream, y,
                      static_cast<const float*>(workspace), elems, splits);
  }
}

}  // namespace

int linear_split_k_splits(int n, int in_features, int out_features, size_t workspace_bytes) {
  // Enough blocks for two per SM on a 132-SM GPU, at most 16 splits, in_features / splits at least two
  // stages (linear_split_k_depth rounds each split up to whole stages, so the last may be shorter), and the
  // partials within the workspace.
  const int64_t tiles = int64_t((n + kTileRows - 1) / kTileRows) * ((out_features + kTileOut - 1) / kTileOut);
  int splits = int(std::min<int64_t>(16, (264 + tiles - 1) / tiles));
  splits = std::min(splits, std::max(1, in_features / (2 * kTileIn)));
  while (splits > 1 && size_t(splits) * n * out_features * sizeof(float) > workspace_bytes) splits--;
  return std::max(1, splits);
}

int linear_split_k_depth(int in_features, int splits) {
  // ceil(in / splits), then up to whole stages: the splits cover every in_feature. (Rounding in / splits
  // down first, as this did until 2026-12-04, left 1,160 in_features over 9 splits at 9 x 128 = 1,152: the
  // last 8 were never multiplied.) The last splits may hold fewer stages, or none: 1,024 over 5 splits is
  // 4 splits of 256 and an empty fifth, whose blocks write zero partials.
  const int per_split = (in_features + splits - 1) / splits;
  return (per_split + kTileIn - 1) / kTileIn * kTileIn;
}

bool linear_split_k_fits(const bf16* x, const bf16* W, int n, int in_features) {
  return n >= 1 && in_features % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W) % 16 == 0;
}

void linear_split_k_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                         int out_features, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (!linear_split_k_fits(x, W, n, in_features))
    fail("linear_split_k_cuda: needs in_features % 8 == 0 and 16-byte aligned x and W (n ", n, ", in ",
         in_features, ")");
  float* partials = static_cast<float*>(workspace);
  if (y_is_fp32)
    launch_split_k(static_cast<float*>(y), x, W, n, in_features, out_features, partials, workspace_bytes, stream);
  else
    launch_split_k(static_cast<bf16*>(y), x, W, n, in_features, out_features, partials, workspace_bytes, stream);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
