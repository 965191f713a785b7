// chain_bench.cu: what one dependent step of a decode step costs, whatever carries the dependency
// (04_model_runner/NOTES.md, section 9). A chain of P phases, each a small projection that reads the whole
// output of the phase before (1,024 floats) and writes its own: every block dots its warps' RW weight rows
// (1,024 bf16 each) with that vector. Five ways to run the chain, timed under the same conditions, then
// the same chains with the vectors flagged (below):
//   plain graph   P kernels captured in a CUDA graph, plain stream order
//   PDL graph     the same kernels launched overlapped (programmatic dependent launch): each loads its
//                 weight rows before griddepcontrol.wait, as the engine's GEMV does
//   persistent    one kernel, a grid barrier (an atomic counter in global memory) between phases; phase
//                 p's weight rows are loaded before the barrier that ends phase p - 1
//   PDL early     the PDL graph with each kernel letting the next one launch first thing, so that several
//                 phases' weights are in flight (each still waits for the kernel before it to end)
//   deep          the persistent kernel with the weights of the next S phases in flight into shared memory
//                 (the copy engine, one bulk copy per warp), so that only the barrier and the vector are
//                 left on the chain
// Flagged: each vector element is one 64-bit word, value and the writing phase's tag together, so a phase
// polls its input instead of waiting for the grid before it to end (NCCL's low-latency protocol):
//   flagged graph  the PDL graph's kernels letting the next one launch first thing and polling their input
//                  (every thread its own words, or one warp all of them), with no griddepcontrol.wait, or
//                  with it before their stores (what an engine would need for its other inputs)
//   persistent flagged  the persistent kernel polling its input instead of a grid barrier
// Each flagged chain must end on the plain chain's value (W = 1, so each phase multiplies by 1.024).
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
template <int RW, class Store>
__device__ inline void compute_into(const Rows& r, const float* xs, int row0, Store store) {
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
    if (lane == 0) store(row0 + i, acc * 1e-3f);
  }
}
template <int RW>
__device__ inline void compute(const Rows& r, const float* xs, float* y, int row0) {
  compute_into<RW>(r, xs, row0, [&](int row, float v) { y[row] = v; });
}
__device__ inline void load_x(float* xs, const float* x) {
  for (int k = threadIdx.x; k < IN; k += THREADS) xs[k] = x[k];
  __syncthreads();
}

// One phase as its own kernel: y (rows) = W (rows, IN) x, block b owning rows [b * WARPS * RW, ...).
// EARLY: the next kernel may launch first thing, before this one's loads and wait, so that several phases'
// weights are in flight at once (each kernel still waits for the one before to end).
template <int RW, bool PDL, bool EARLY = false>
__global__ void __launch_bounds__(THREADS) phase_kernel(const __nv_bfloat16* W, const float* x, float* y) {
  __shared__ float xs[IN];
  if (EARLY) asm volatile("griddepcontrol.launch_dependents;\n" :::);
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

// Flagged vectors, the low-latency handoff: element k is one 64-bit word, the float's bits low and the tag
// of the phase that wrote it high. One store makes value and tag visible together, so the reader polls the
// data itself: no fence, no counter, no wait for the writing grid to end.
__device__ inline void store_flagged(uint64_t* v, int k, float value, unsigned tag) {
  const uint64_t w = uint64_t(__float_as_uint(value)) | (uint64_t(tag) << 32);
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" :: "l"(v + k), "l"(w) : "memory");
}
__device__ inline uint64_t load_word(const uint64_t* p) {
  uint64_t w;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(w) : "l"(p) : "memory");
  return w;
}
// xs (IN floats) = v's first IN values, once each carries tag (tag 0: take them as they are).
// Every thread polls its own 4 words, or (ONE_WARP) warp 0 polls them all, each lane 16 pairs in flight
// at once, reading all again until every tag matches: 8 times fewer requests at the vector's few L2 lines.
template <bool ONE_WARP>
__device__ inline void load_x_flagged(float* xs, const uint64_t* v, unsigned tag) {
  if (!ONE_WARP) {
    constexpr int PER = IN / THREADS;
    uint64_t w[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) w[i] = load_word(v + threadIdx.x + i * THREADS);
#pragma unroll
    for (int i = 0; i < PER; i++)
      while (tag != 0 && unsigned(w[i] >> 32) != tag) w[i] = load_word(v + threadIdx.x + i * THREADS);
#pragma unroll
    for (int i = 0; i < PER; i++) xs[threadIdx.x + i * THREADS] = __uint_as_float(uint32_t(w[i]));
  } else if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    constexpr int PAIRS = IN / 64;
    uint64_t w[2 * PAIRS];
    while (true) {
#pragma unroll
      for (int c = 0; c < PAIRS; c++)
        asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];\n"
                     : "=l"(w[2 * c]), "=l"(w[2 * c + 1]) : "l"(v + c * 64 + lane * 2) : "memory");
      bool ok = true;
#pragma unroll
      for (int i = 0; i < 2 * PAIRS; i++) ok = ok && (tag == 0 || unsigned(w[i] >> 32) == tag);
      if (__all_sync(~0u, ok)) break;
    }
#pragma unroll
    for (int c = 0; c < PAIRS; c++) {
      xs[c * 64 + lane * 2] = __uint_as_float(uint32_t(w[2 * c]));
      xs[c * 64 + lane * 2 + 1] = __uint_as_float(uint32_t(w[2 * c + 1]));
    }
  }
  __syncthreads();
}
// One phase as its own kernel, overlapped, its input polled: y (rows) = W x. WAIT: griddepcontrol.wait
// before the stores (so that the grid before has ended, and every grid before it, once y is seen).
template <int RW, bool WAIT, bool ONE_WARP>
__global__ void __launch_bounds__(THREADS) flagged_kernel(const __nv_bfloat16* W, const uint64_t* x, uint64_t* y,
                                                         const unsigned* epoch, unsigned phase) {
  __shared__ float xs[IN];
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
  const unsigned base = __ldcg(epoch) * 4096u;
  const int row0 = (blockIdx.x * WARPS + threadIdx.x / 32) * RW;
  Rows r;
  load_rows<RW>(r, W, row0);
  load_x_flagged<ONE_WARP>(xs, x, phase == 0 ? 0u : base + phase);
  if (WAIT) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  compute_into<RW>(r, xs, row0, [&](int row, float v) { store_flagged(y, row, v, base + phase + 1); });
}
// Every phase in one kernel, each phase polling the vector of the one before.
template <int RW, bool ONE_WARP>
__global__ void __launch_bounds__(THREADS) persistent_flagged_kernel(const __nv_bfloat16* W, size_t w_stride,
                                                                    uint64_t* bufs, int phases,
                                                                    const unsigned* epoch) {
  __shared__ float xs[IN];
  const unsigned base = __ldcg(epoch) * 4096u;
  const int row0 = (blockIdx.x * WARPS + threadIdx.x / 32) * RW;
  const size_t vec = size_t(gridDim.x) * WARPS * RW;
  for (int p = 0; p < phases; p++) {
    Rows r;
    load_rows<RW>(r, W + size_t(p) * w_stride, row0);
    load_x_flagged<ONE_WARP>(xs, bufs + size_t(p) * vec, p == 0 ? 0u : base + p);
    compute_into<RW>(r, xs, row0, [&](int row, float v) { store_flagged(bufs + size_t(p + 1) * vec, row, v, base + p + 1); });
    __syncthreads();  // xs reused
  }
}
// A phase's tag is epoch * 4096 + its index, and the epoch moves on after every run of the chain (a graph
// replay or a persistent launch), so a vector left by the run before never carries the tag a poll waits for.
__global__ void bump_epoch(unsigned* epoch) { *epoch += 1; }
// W = 1 and the first vector = 1 (tag 0), so that each phase multiplies the vector by 1.024: the last
// vector's value says that every phase ran on its whole input (it cannot tell the run before's equal
// vector from this run's: that is the tags' job).
__global__ void fill_ones(__nv_bfloat16* W, size_t n, float* x, uint64_t* fx, int in) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    W[i] = __float2bfloat16(1.0f);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < in; i += gridDim.x * blockDim.x) {
    x[i] = 1.0f;
    fx[i] = __float_as_uint(1.0f);
  }
}

// Times every chain above, of `phases` phases on `blocks` blocks (RW weight rows per warp, S stages ahead
// for the deep kernel), prints each one's time per phase and the bandwidth its weights streamed at, and
// exits 1 if the PDL graph launching early or a flagged chain ended on another value than the plain chain.
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
  // ms per run of launch(): 3 runs to warm up, then 20 timed.
  auto time_runs = [&](auto launch) {
    for (int i = 0; i < 3; i++) launch();
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    const int reps = 20;
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) launch();
    cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
    CK(cudaGetLastError());
    float ms; cudaEventElapsedTime(&ms, a, b);
    return ms / reps;
  };
  // ms per replay of a graph of the chain: launch_phase(config, p) for every phase, config overlapped
  // (programmatic dependent launch) where pdl(p) says so; then after() (stream work ending the chain).
  auto time_chain_graph = [&](auto pdl, auto launch_phase, auto after) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int p = 0; p < phases; p++) {
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t c = {}; c.gridDim = blocks; c.blockDim = THREADS; c.stream = s;
      c.attrs = at; c.numAttrs = pdl(p) ? 1 : 0;
      launch_phase(c, p);
    }
    after();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = time_runs([&]() { CK(cudaGraphLaunch(ge, s)); });
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms;
  };
  auto time_graph = [&](bool pdl, bool early = false) {
    return time_chain_graph([&](int) { return pdl; },
                            [&](cudaLaunchConfig_t& c, int p) {
                              const __nv_bfloat16* w = W + size_t(p) * w_stride;
                              const float* x = bufs + size_t(p) * rows; float* y = bufs + size_t(p + 1) * rows;
                              if (pdl && early) CK(cudaLaunchKernelEx(&c, phase_kernel<RW, true, true>, w, x, y));
                              else if (pdl) CK(cudaLaunchKernelEx(&c, phase_kernel<RW, true>, w, x, y));
                              else CK(cudaLaunchKernelEx(&c, phase_kernel<RW, false>, w, x, y));
                            },
                            [] {});
  };
  unsigned base = 0;
  auto time_persistent = [&]() {
    return time_runs([&]() {
      persistent_kernel<RW><<<blocks, THREADS, 0, s>>>(W, w_stride, bufs, phases, counter, base);
      base += unsigned(phases - 1) * blocks;
    });
  };
  auto time_deep = [&]() {
    const size_t smem = size_t(S) * WARPS * RW * IN * 2;
    CK(cudaFuncSetAttribute(deep_kernel<RW, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return time_runs([&]() {
      deep_kernel<RW, S><<<blocks, THREADS, smem, s>>>(W, w_stride, bufs, phases, counter, base);
      base += unsigned(phases - 1) * blocks;
    });
  };
  uint64_t* fbufs; unsigned* epoch;
  CK(cudaMalloc(&fbufs, size_t(rows) * (phases + 1) * 8));
  CK(cudaMemset(fbufs, 0, size_t(rows) * (phases + 1) * 8));
  CK(cudaMalloc(&epoch, 4));
  CK(cudaMemset(epoch, 0, 4));
  fill_ones<<<1024, 256, 0, s>>>(W, w_stride * phases, bufs, fbufs, rows);
  CK(cudaStreamSynchronize(s));
  auto bump = [&]() { bump_epoch<<<1, 1, 0, s>>>(epoch); };
  bump();  // epoch 1: no buffer yet carries its tags
  auto time_flagged = [&](auto kernel) {
    return time_chain_graph([](int p) { return p > 0; },
                            [&](cudaLaunchConfig_t& c, int p) {
                              const __nv_bfloat16* w = W + size_t(p) * w_stride;
                              const uint64_t* x = fbufs + size_t(p) * rows; uint64_t* y = fbufs + size_t(p + 1) * rows;
                              CK(cudaLaunchKernelEx(&c, kernel, w, x, y, (const unsigned*)epoch, unsigned(p)));
                            },
                            bump);
  };
  auto time_persistent_flagged = [&](auto kernel) {
    return time_runs([&]() {
      kernel<<<blocks, THREADS, 0, s>>>(W, w_stride, fbufs, phases, (const unsigned*)epoch);
      bump();
    });
  };
  // A check that the flagged chains computed what the plain one did: the last vector's first value.
  auto last_value = [&](bool flagged) {
    float v;
    if (flagged) {
      uint64_t w; CK(cudaMemcpy(&w, fbufs + size_t(phases) * rows, 8, cudaMemcpyDeviceToHost));
      v = __builtin_bit_cast(float, uint32_t(w));
    } else {
      CK(cudaMemcpy(&v, bufs + size_t(phases) * rows, 4, cudaMemcpyDeviceToHost));
    }
    return v;
  };
  float ta = time_graph(false), tb = time_graph(true), tc = time_persistent(), td = time_deep();
  const float plain_value = last_value(false);
  float tb2 = time_graph(true, true);
  if (last_value(false) != plain_value) {
    printf("error: the PDL graph launching early ended on %.9g, the plain chain on %.9g\n", last_value(false), plain_value);
    std::exit(1);
  }
  float te = time_flagged(flagged_kernel<RW, false, false>);
  const float e_value = last_value(true);
  float te2 = time_flagged(flagged_kernel<RW, false, true>);
  const float e2_value = last_value(true);
  float tf = time_flagged(flagged_kernel<RW, true, true>);
  const float f_value = last_value(true);
  float tg = time_persistent_flagged(persistent_flagged_kernel<RW, false>);
  const float g_value = last_value(true);
  float tg2 = time_persistent_flagged(persistent_flagged_kernel<RW, true>);
  const float g2_value = last_value(true);
  printf("blocks %d rows/warp %d phases %d: weights %.1f MB/phase (floor %.2f us/phase)\n", blocks, RW, phases,
         w_stride * 2 / 1e6, w_stride * 2 / 4.23e12 * 1e6);
  printf("  plain graph   %.3f ms  %.2f us/phase  %.0f GB/s\n", ta, ta * 1e3 / phases, bytes / ta / 1e6);
  printf("  PDL graph     %.3f ms  %.2f us/phase  %.0f GB/s\n", tb, tb * 1e3 / phases, bytes / tb / 1e6);
  printf("  persistent    %.3f ms  %.2f us/phase  %.0f GB/s\n", tc, tc * 1e3 / phases, bytes / tc / 1e6);
  printf("  deep S=%d      %.3f ms  %.2f us/phase  %.0f GB/s\n", S, td, td * 1e3 / phases, bytes / td / 1e6);
  auto line = [&](const char* what, float ms) {
    printf("  %-29s %.3f ms  %.2f us/phase  %.0f GB/s\n", what, ms, ms * 1e3 / phases, bytes / ms / 1e6);
  };
  line("PDL graph, next launched first", tb2);
  line("flagged graph, every thread", te);
  line("flagged graph, one warp", te2);
  line("flagged graph, wait at store", tf);
  line("persistent flagged", tg);
  line("persistent flagged, one warp", tg2);
  for (float v : {e_value, e2_value, f_value, g_value, g2_value})
    if (v != plain_value) {
      printf("error: a flagged chain ended on %.9g, the plain chain on %.9g\n", v, plain_value);
      std::exit(1);
    }
  printf("  every flagged chain ended on the plain chain's value, %.6g\n", plain_value);
  cudaFree(fbufs); cudaFree(epoch);
  cudaFree(W); cudaFree(bufs); cudaFree(counter); cudaStreamDestroy(s);
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run<1, 6>(sms, 252);
  run<2, 4>(sms, 252);
  run<4, 2>(sms, 252);
  run<4, 3>(sms, 252);
}
