// chain_bench.cu: what one dependent step of a decode step costs, whatever carries the dependency
// (04_model_runner/NOTES.md, section 9). A chain of P phases, each a small projection that reads the whole
// output of the phase before (1,024 floats) and writes its own: every block dots its warps' RW weight rows
// (1,024 bf16 each) with that vector. Four ways to run the chain, timed under the same conditions:
//   plain graph   P kernels captured in a CUDA graph, plain stream order
//   PDL graph     the same kernels launched overlapped (programmatic dependent launch): each loads its
//                 weight rows before griddepcontrol.wait, as the engine's GEMV does
//   persistent    one kernel, a grid barrier (an atomic counter in global memory) between phases; phase
//                 p's weight rows are loaded before the barrier that ends phase p - 1
//   deep          the persistent kernel with the weights of the next S phases in flight into shared memory
//                 (the copy engine, one bulk copy per warp), so that only the barrier and the vector are
//                 left on the chain
// Build and run on a GPU of compute capability 9.0 (tests/gpu_check.sh OUT chain does both):
//   nvcc -O3 -arch=sm_90 -std=c++17 -I. tests/chain_bench.cu -o build/chain_bench && build/chain_bench
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include "01_sequence/base/ptx.cuh"
using namespace nanovllm;
#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e = (x);                                                                    \
    if (e != cudaSuccess) {                                                                 \
      std::printf("error: %s at chain_bench.cu:%d\n", cudaGetErrorString(e), __LINE__);      \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)
constexpr int IN = 1024, THREADS = 256, WARPS = 8;
constexpr int MAXR = 4;  // weight rows per warp, at most
struct Rows { uint4 v[MAXR][4]; };  // a warp's rows in registers: lane l holds 16-byte chunks l, l + 32, ...

template <int RW>
__device__ inline void load_rows(Rows& r, const __nv_bfloat16* W, int row0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < RW; i++)
#pragma unroll
    for (int c = 0; c < 4; c++)
      r.v[i][c] = __ldg(reinterpret_cast<const uint4*>(W + size_t(row0 + i) * IN) + c * 32 + lane);
}
template <int RW>
__device__ inline void compute(const Rows& r, const float* xs, float* y, int row0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < RW; i++) {
    float acc = 0;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(&r.v[i][c]);
      const int k0 = (c * 32 + lane) * 8;
#pragma unroll
      for (int j = 0; j < 8; j++) acc += __bfloat162float(w[j]) * xs[k0 + j];
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
    if (lane == 0) y[row0 + i] = acc * 1e-3f;
  }
}
__device__ inline void load_x(float* xs, const float* x) {
  for (int k = threadIdx.x; k < IN; k += THREADS) xs[k] = x[k];
  __syncthreads();
}

// One phase as its own kernel: y (rows) = W (rows, IN) x, block b owning rows [b * WARPS * RW, ...).
template <int RW, bool PDL>
__global__ void __launch_bounds__(THREADS) phase_kernel(const __nv_bfloat16* W, const float* x, float* y) {
  __shared__ float xs[IN];
  const int row0 = (blockIdx.x * WARPS + threadIdx.x / 32) * RW;
  Rows r;
  load_rows<RW>(r, W, row0);
  if (PDL) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" :::);
  }
  load_x(xs, x);
  compute<RW>(r, xs, y, row0);
}

// Every block of the grid has arrived (the counter reached target, a multiple of the grid size: it only
// grows) and their writes before it are visible. All blocks must be resident at once: one per SM here.
__device__ inline void grid_barrier(unsigned* counter, unsigned target) {
  __syncthreads();  // the block's writes of this phase are done before thread 0 announces them
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" :: "l"(counter) : "memory");
    unsigned v;
    do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory"); } while (v < target);
  }
  __syncthreads();
}

// Every phase in one kernel: phase p reads bufs[p] (IN floats) and writes bufs[p + 1].
template <int RW>
__global__ void __launch_bounds__(THREADS) persistent_kernel(const __nv_bfloat16* W, size_t w_stride, float* bufs,
                                                            int phases, unsigned* counter, unsigned base) {
  __shared__ float xs[IN];
  const int row0 = (blockIdx.x * WARPS + threadIdx.x / 32) * RW;
  const size_t vec = size_t(gridDim.x) * WARPS * RW;
  for (int p = 0; p < phases; p++) {
    Rows r;
    load_rows<RW>(r, W + size_t(p) * w_stride, row0);
    if (p > 0) grid_barrier(counter, base + unsigned(p) * gridDim.x);
    load_x(xs, bufs + size_t(p) * vec);
    compute<RW>(r, xs, bufs + size_t(p + 1) * vec, row0);
    __syncthreads();  // xs reused
  }
}


// Persistent, weights streamed S phases ahead into shared memory by the copy engine (per warp, its RW rows).
template <int RW, int S>
__global__ void __launch_bounds__(THREADS) deep_kernel(const __nv_bfloat16* W, size_t w_stride, float* bufs,
                                                      int phases, unsigned* counter, unsigned base) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float xs[IN];
  __shared__ uint64_t bars[S][WARPS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * WARPS + warp) * RW;
  const size_t vec = size_t(gridDim.x) * WARPS * RW;
  constexpr int kSlab = RW * IN * 2;  // bytes per warp per phase
  auto slab = [&](int stage) { return smem + (size_t(stage) * WARPS + warp) * kSlab; };
  if (lane == 0) {
    for (int st = 0; st < S; st++) mbarrier_init(smem_address(&bars[st][warp]));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncwarp();
  auto issue = [&](int p) {
    if (lane == 0 && p < phases) {
      const int st = p % S;
      const uint32_t bar = smem_address(&bars[st][warp]);
      mbarrier_arrive_expecting(bar, kSlab);
      bulk_copy_to_shared(smem_address(slab(st)), W + size_t(p) * w_stride + size_t(row0) * IN, kSlab, bar);
    }
  };
  for (int p = 0; p < S; p++) issue(p);
  for (int p = 0; p < phases; p++) {
    if (p > 0) grid_barrier(counter, base + unsigned(p) * gridDim.x);
    load_x(xs, bufs + size_t(p) * vec);
    const int st = p % S;
    mbarrier_wait(smem_address(&bars[st][warp]), (p / S) & 1);
    Rows r;
    const uint4* s4 = reinterpret_cast<const uint4*>(slab(st));
#pragma unroll
    for (int i = 0; i < RW; i++)
#pragma unroll
      for (int c = 0; c < 4; c++) r.v[i][c] = s4[i * (IN / 8) + c * 32 + lane];
    compute<RW>(r, xs, bufs + size_t(p + 1) * vec, row0);
    __syncwarp();  // every lane has read the slab before it is refilled
    issue(p + S);
    __syncthreads();  // xs reused
  }
}

// Times the four chains of `phases` phases on `blocks` blocks (RW weight rows per warp, S stages ahead
// for the deep kernel) and prints each one's time per phase and the bandwidth its weights streamed at.
template <int RW, int S>
void run(int blocks, int phases) {
  const int rows = blocks * WARPS * RW;  // >= IN needed
  const size_t w_stride = size_t(rows) * IN;
  __nv_bfloat16* W; float* bufs; unsigned* counter;
  CK(cudaMalloc(&W, w_stride * phases * 2));
  CK(cudaMemset(W, 0x3c, w_stride * phases * 2));
  CK(cudaMalloc(&bufs, size_t(rows) * (phases + 1) * 4));
  CK(cudaMemset(bufs, 0, size_t(rows) * (phases + 1) * 4));
  CK(cudaMalloc(&counter, 4));
  CK(cudaMemset(counter, 0, 4));
  cudaStream_t s; CK(cudaStreamCreate(&s));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  const double bytes = double(w_stride) * phases * 2;
  auto time_graph = [&](bool pdl) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < phases; p++) {
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t c = {}; c.gridDim = blocks; c.blockDim = THREADS; c.stream = s;
      c.attrs = at; c.numAttrs = pdl ? 1 : 0;
      const __nv_bfloat16* w = W + size_t(p) * w_stride;
      const float* x = bufs + size_t(p) * rows; float* y = bufs + size_t(p + 1) * rows;
      if (pdl) CK(cudaLaunchKernelEx(&c, phase_kernel<RW, true>, w, x, y));
      else CK(cudaLaunchKernelEx(&c, phase_kernel<RW, false>, w, x, y));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    const int reps = 20;
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge, s));
    cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= reps;
    return ms;
  };
  unsigned base = 0;
  auto time_persistent = [&]() {
    auto launch = [&]() {
      persistent_kernel<RW><<<blocks, THREADS, 0, s>>>(W, w_stride, bufs, phases, counter, base);
      base += unsigned(phases - 1) * blocks;
    };
    for (int i = 0; i < 3; i++) launch();
    CK(cudaStreamSynchronize(s));
    const int reps = 20;
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) launch();
    cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= reps;
    return ms;
  };
  auto time_deep = [&]() {
    const size_t smem = size_t(S) * WARPS * RW * IN * 2;
    CK(cudaFuncSetAttribute(deep_kernel<RW, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    auto launch = [&]() {
      deep_kernel<RW, S><<<blocks, THREADS, smem, s>>>(W, w_stride, bufs, phases, counter, base);
      base += unsigned(phases - 1) * blocks;
    };
    for (int i = 0; i < 3; i++) launch();
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    const int reps = 20;
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) launch();
    cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= reps;
    return ms;
  };
  float ta = time_graph(false), tb = time_graph(true), tc = time_persistent(), td = time_deep();
  printf("blocks %d rows/warp %d phases %d: weights %.1f MB/phase (floor %.2f us/phase)\n", blocks, RW, phases,
         w_stride * 2 / 1e6, w_stride * 2 / 4.23e12 * 1e6);
  printf("  plain graph   %.3f ms  %.2f us/phase  %.0f GB/s\n", ta, ta * 1e3 / phases, bytes / ta / 1e6);
  printf("  PDL graph     %.3f ms  %.2f us/phase  %.0f GB/s\n", tb, tb * 1e3 / phases, bytes / tb / 1e6);
  printf("  persistent    %.3f ms  %.2f us/phase  %.0f GB/s\n", tc, tc * 1e3 / phases, bytes / tc / 1e6);
  printf("  deep S=%d      %.3f ms  %.2f us/phase  %.0f GB/s\n", S, td, td * 1e3 / phases, bytes / td / 1e6);
  cudaFree(W); cudaFree(bufs); cudaFree(counter); cudaStreamDestroy(s);
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run<1, 6>(sms, 252);
  run<2, 4>(sms, 252);
  run<4, 2>(sms, 252);
  run<4, 3>(sms, 252);
}
