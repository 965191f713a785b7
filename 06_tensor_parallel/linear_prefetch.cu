// linear_prefetch.cu: v7 of the projection, y (n, out) = x (n, in) @ W (out, in)^T for 1-4 rows, written
// for decode at batch 1, where a step is ~250 short kernels and each pays its start and its tail.
//
// Idea. A kernel launched overlapped (01_sequence/base/cuda_utils.h) becomes resident while the previous
// kernel still runs, and may do anything before its griddepcontrol.wait that does not read the previous
// kernel's output. The weights are nobody's output. So each warp asks the copy engine for its weight rows
// whole (one bulk copy of rows x in x 2 bytes into shared memory) before it waits: with a block per SM,
// qkv's 8.4 MB is 64 KB a block, and it streams while the previous kernel runs. After the wait the block
// only reads x (a few KB), multiplies from shared memory and writes y.
//
// That pays only if the previous kernel runs long enough, which the small kernels between two projections
// (add_rmsnorm, silu_and_mul: ~2 µs each) do not. So this kernel also does their work, and the projections
// follow each other:
//   input  Plain       x as it is
//          RmsNorm     x / rms(x) * norm_weight, as rmsnorm_kernel (04_model_runner/layers.cu) computes and
//                      rounds it; every block normalises the whole row for itself (1-4 rows of 1-8 KB)
//          SiluAndMul  silu(gate) * up of x = gate_up (n, 2 in), as silu_and_mul_kernel
//   output add_to_y    y += the product: the product rounded to bf16 (what linear would store), added to
//                      y (the residual stream) in fp32 and rounded: add_rmsnorm's add, done where the
//                      product is made, one thread per element
// so that a layer at batch 1 is qkv (RmsNorm), attention, o_proj (add), gate_up (RmsNorm), down_proj
// (SiluAndMul, add): no small kernel between two projections (Qwen3Model::forward_fused_around_linear).
//
// Inside a block (up to 8 warps, plan.warps, `rows_per_warp` weight rows each, consecutive: the warp's rows are one
// contiguous range of W, one copy):
//   lane 0 of warp w   initialises landed[w], announces the bytes, issues the bulk copy of its rows
//   every thread       waits for the previous kernel, then writes the n input rows into x_s
//   warp w             waits for landed[w]; lane l takes 16-byte chunks c = l, l + 32, ... of its rows
//                      and the matching chunk of each x row: acc[m][r] = its part of y[m, row0 + r],
//                      then a warp-shuffle sum, and lane 0 writes
//
// Shared memory: W_s (warps, rows_per_warp, in) bf16, x_s (n, in) bf16, landed (warps,) mbarriers. The
// plan (linear_prefetch_plan) keeps it within 112 KB where it can, so that two consecutive projections'
// blocks fit on one SM together (the next one's copies start while this one computes).
//
// Measured on the H200 (04_model_runner/NOTES.md, section 2): a decode step at batch 1 in 0.922 ms against
// 0.929 with v2 and the separate kernels, within the noise, and slower at 2 and 4 rows; so it is not the
// default. Under CUDA graphs with overlapped launches the boundaries it removes cost less than they seem.
//
// Versions of the projection: linear.h. CPU reference: linear_cpu (with the RMSNorm, the SiLU-and-mul and
// the add written out around it in the tests).
#include <algorithm>
#include <cstdint>

#include "01_sequence/base/ptx.cuh"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

constexpr int kMaxWarps = 8;         // warps per block at most (plan.warps)
constexpr int kMaxRowsPerWarp = 8;   // weight rows per warp at most (its accumulators: n x kMaxRowsPerWarp)
constexpr int kSmemBudget = 114688;  // 112 KB: two blocks of consecutive projections share an SM (227 KB)
constexpr int kSmemMax = 231424;     // 226 KB: a block alone on its SM (with 1 KB left for the static arrays)

// The device helpers exist in the passes for sm_90 and later (and in the host pass, which never calls
// them): the older GPUs' passes compile the kernel empty, and linear_prefetch_available keeps callers away.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

__device__ inline float round_to_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

// x_s (n, in) = the projection's input rows, computed from x as INPUT says (see the top), each value
// rounded to bf16 as the separate kernel would have stored it. All threads; ends with a barrier.
template <LinearInput INPUT>
__device__ void load_input(bf16* x_s, const bf16* x, const bf16* norm_weight, float eps, int n, int in) {
  const int chunks = in / 8;
  const int64_t x_row = INPUT == LinearInput::SiluAndMul ? 2 * int64_t(in) : in;
  for (int m = 0; m < n; m++) {
    const bf16* row = x + m * x_row;
    float inv_rms = 1.0f;
    if (INPUT == LinearInput::RmsNorm) {
      float sum_sq = 0;
      for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        float v[8];
        load_bf16x8(row + 8 * c, v);
#pragma unroll
        for (int k = 0; k < 8; k++) sum_sq += v[k] * v[k];
      }
      inv_rms = rsqrtf(block_sum<kMaxWarps>(sum_sq) / in + eps);
    }
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      float v[8];
      load_bf16x8(row + 8 * c, v);
      if (INPUT == LinearInput::RmsNorm) {
        float w[8];
        load_bf16x8(norm_weight + 8 * c, w);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = v[k] * inv_rms * w[k];
      } else if (INPUT == LinearInput::SiluAndMul) {
        float u[8];
        load_bf16x8(row + in + 8 * c, u);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = silu_times(v[k], u[k]);
      }
      store_bf16x8(x_s + int64_t(m) * in + 8 * c, v);
    }
  }
  __syncthreads();  // every warp reads every input row
}

#endif  // the host pass or sm_90 and later

// Grid: plan.blocks of plan.warps warps. Warp w of block b computes outputs [row0, row0 + rows) with
// row0 = (b * warps + w) * rows_per_warp, for the n <= MAX_N rows of x. y (n, out) bf16 (ADD: added to);
// x (n, in) bf16, (n, 2 in) with SiluAndMul; W (out, in) bf16; norm_weight (in,) bf16 (RmsNorm); in % 8 == 0,
// x and W 16-byte aligned; plan.smem_bytes of dynamic shared memory.
template <int MAX_N, LinearInput INPUT, bool ADD>
__global__ void __launch_bounds__(kMaxWarps * 32)
    linear_prefetch_kernel(bf16* y, const bf16* x, const bf16* W, const bf16* norm_weight, float eps, int n, int in,
                           int out, int rows_per_warp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  const int warps = int(blockDim.x) / 32, warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int slab = rows_per_warp * in;  // bf16 per warp
  bf16* w_s = reinterpret_cast<bf16*>(smem) + int64_t(warp) * slab;
  bf16* x_s = reinterpret_cast<bf16*>(smem) + int64_t(warps) * slab;  // 16-byte aligned: in % 8 == 0
  uint64_t* landed = reinterpret_cast<uint64_t*>(x_s + int64_t(n) * in);
  const int row0 = (int(blockIdx.x) * warps + warp) * rows_per_warp;
  const int rows = max(0, min(rows_per_warp, out - row0));
  const uint32_t barrier = smem_address(&landed[warp]);

  // Before the wait: this warp's weight rows, one copy (W is no kernel's output). (Letting the next kernel
  // start here too, before the wait, so that its copies overlap this kernel's, was slower:
  // 04_model_runner/NOTES.md, section 2.)
  if (lane == 0 && rows > 0) {
    mbarrier_init(barrier);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
    mbarrier_arrive_expecting(barrier, rows * in * 2);
    bulk_copy_to_shared(smem_address(w_s), W + int64_t(row0) * in, rows * in * 2, barrier);
  }
  wait_for_previous_kernel();
  allow_next_kernel();
  load_input<INPUT>(x_s, x, norm_weight, eps, n, in);
  if (rows == 0) return;  // a warp past the last row (after the block's barriers)
  mbarrier_wait(barrier, 0);  // this warp's rows have landed (phase 0: the barrier is used once)

  float acc[MAX_N][kMaxRowsPerWarp];
#pragma unroll
  for (int m = 0; m < MAX_N; m++)
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; r++) acc[m][r] = 0.0f;
  const int chunks = in / 8;
  const uint4* w4 = reinterpret_cast<const uint4*>(w_s);  // (rows, chunks): 8 bf16 each
  const uint4* x4 = reinterpret_cast<const uint4*>(x_s);  // (n, chunks)
  for (int c = lane; c < chunks; c += 32) {
    float xf[MAX_N][8];
#pragma unroll
    for (int m = 0; m < MAX_N; m++) {
      if (m >= n) break;  // the same for every lane
      bf16x8_to_float(x4[m * chunks + c], xf[m]);
    }
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; r++) {
      if (r >= rows) break;
      float wf[8];
      bf16x8_to_float(w4[r * chunks + c], wf);
#pragma unroll
      for (int m = 0; m < MAX_N; m++) {
        if (m >= n) break;
#pragma unroll
        for (int k = 0; k < 8; k++) acc[m][r] += xf[m][k] * wf[k];
      }
    }
  }
  // Every lane holds part of each dot product: sum over the warp, lane 0 writes.
#pragma unroll
  for (int m = 0; m < MAX_N; m++) {
    if (m >= n) break;
#pragma unroll
    for (int r = 0; r < kMaxRowsPerWarp; r++) {
      if (r >= rows) break;
      const float sum = warp_sum(acc[m][r]);
      if (lane == 0) {
        bf16* dst = y + int64_t(m) * out + row0 + r;
        *dst = ADD ? __float2bfloat16(__bfloat162float(*dst) + round_to_bf16(sum)) : __float2bfloat16(sum);
      }
    }
  }
#endif
}

template <int MAX_N, LinearInput INPUT, bool ADD>
void launch(bf16* y, const bf16* x, const bf16* W, const LinearFusion& f, int n, int in, int out,
            const LinearPrefetchPlan& plan, cudaStream_t stream) {
  auto* kernel = linear_prefetch_kernel<MAX_N, INPUT, ADD>;
  static PerDeviceOnce once;  // the plan's largest shared memory, allowed once per instance and device
  allow_dynamic_shared_memory(once, reinterpret_cast<const void*>(kernel), kSmemMax);
  launch_overlapped(kernel, unsigned(plan.blocks), unsigned(plan.warps * 32), size_t(plan.smem_bytes), stream, y, x,
                    W, f.norm_weight, f.eps, n, in, out, plan.rows_per_warp);
}

template <LinearInput INPUT, bool ADD>
void launch_for_rows(bf16* y, const bf16* x, const bf16* W, const LinearFusion& f, int n, int in, int out,
                     const LinearPrefetchPlan& plan, cudaStream_t stream) {
  if (n == 1)
    launch<1, INPUT, ADD>(y, x, W, f, n, in, out, plan, stream);
  else if (n == 2)
    launch<2, INPUT, ADD>(y, x, W, f, n, in, out, plan, stream);
  else
    launch<4, INPUT, ADD>(y, x, W, f, n, in, out, plan, stream);
}

template <LinearInput INPUT>
void launch_for_output(bf16* y, const bf16* x, const bf16* W, const LinearFusion& f, int n, int in, int out,
                       const LinearPrefetchPlan& plan, cudaStream_t stream) {
  if (f.add_to_y)
    launch_for_rows<INPUT, true>(y, x, W, f, n, in, out, plan, stream);
  else
    launch_for_rows<INPUT, false>(y, x, W, f, n, in, out, plan, stream);
}

// 1 where the kernels were compiled (sm_90 and later), 0 in the passes for older GPUs, where they are empty.
__device__ const int kPrefetchCompiled =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    1;
#else
    0;
#endif

}  // namespace

LinearPrefetchPlan linear_prefetch_plan(int n, int in_features, int out_features, int num_sms) {
  LinearPrefetchPlan plan;
  auto smem = [&](int warps, int rows_per_warp) {
    return (int64_t(warps) * rows_per_warp + n) * in_features * 2 + warps * 8;
  };
  // About one block per SM: the rows split evenly over num_sms blocks of up to 8 warps.
  const int per_block = std::max(1, (out_features + num_sms - 1) / num_sms);
  plan.warps = std::min(kMaxWarps, per_block);
  plan.rows_per_warp = std::min(kMaxRowsPerWarp, (per_block + plan.warps - 1) / plan.warps);
  // Within the budget: fewer rows per warp first, then fewer warps (more blocks, more than one wave). A
  // single row past the budget still runs, alone on its SM, up to the SM's shared memory.
  while (smem(plan.warps, plan.rows_per_warp) > kSmemBudget && plan.rows_per_warp > 1) plan.rows_per_warp--;
  while (smem(plan.warps, plan.rows_per_warp) > kSmemBudget && plan.warps > 1) plan.warps--;
  if (smem(plan.warps, plan.rows_per_warp) > kSmemMax) return LinearPrefetchPlan{0, 0, 0, 0};
  const int per_block_planned = plan.warps * plan.rows_per_warp;
  plan.blocks = (out_features + per_block_planned - 1) / per_block_planned;
  plan.smem_bytes = int(smem(plan.warps, plan.rows_per_warp));
  return plan;
}

bool linear_prefetch_available() {
  static const bool available = [] {
    int device = 0, major = 0, compiled = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (major < 9) return false;  // the bulk copy and its barrier are sm_90
    CUDA_CHECK(cudaMemcpyFromSymbol(&compiled, kPrefetchCompiled, sizeof(int)));
    return compiled == 1;
  }();
  return available;
}

namespace {

// What linear_prefetch_fits checks besides the plan.
bool prefetch_inputs_fit(const bf16* x, const bf16* W, int n, int in_features) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return n >= 1 && n <= kPrefetchMaxRows && in_features % 8 == 0 && aligned16(x) && aligned16(W) &&
         linear_prefetch_available();
}

}  // namespace

bool linear_prefetch_fits(const bf16* x, const bf16* W, int n, int in_features, int out_features) {
  // Whether a plan fits depends on n and in_features only (one warp of one row, and x_s (n, in)), not on
  // the SM count or out_features.
  return prefetch_inputs_fit(x, W, n, in_features) && linear_prefetch_plan(n, in_features, out_features, 1).blocks > 0;
}

void linear_prefetch_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                          const LinearFusion& fusion, cudaStream_t stream) {
  if (out_features == 0) return;  // nothing to compute (and no plan: zero blocks)
  const LinearPrefetchPlan plan = linear_prefetch_plan(n, in_features, out_features, multiprocessor_count());
  if (!prefetch_inputs_fit(x, W, n, in_features) || plan.blocks == 0)
    fail("internal: linear_prefetch_cuda needs a GPU of compute capability 9.0 or later, 1 <= n <= ",
         kPrefetchMaxRows, ", in_features % 8 == 0, 16-byte aligned x and W, and a weight row and x within 226 KB "
         "of shared memory (n ", n, ", in_features ", in_features, ")");
  switch (fusion.input) {
    case LinearInput::Plain:
      launch_for_output<LinearInput::Plain>(y, x, W, fusion, n, in_features, out_features, plan, stream);
      break;
    case LinearInput::RmsNorm:
      launch_for_output<LinearInput::RmsNorm>(y, x, W, fusion, n, in_features, out_features, plan, stream);
      break;
    case LinearInput::SiluAndMul:
      launch_for_output<LinearInput::SiluAndMul>(y, x, W, fusion, n, in_features, out_features, plan, stream);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
