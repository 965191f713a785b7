// cuda_utils.h: what every CUDA file shares: CUDA_CHECK after every runtime call and launch, whether a
// GPU is present and how many SMs it has, warp_sum, and the overlapped launch of consecutive kernels (in a
// CUDA graph too: start_successors_early). Header-only; bf16 itself is in bf16.h.
#pragma once

#ifdef NANOVLLM_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "01_sequence/base/bf16.h"
#include "01_sequence/base/common.h"

namespace nanovllm {

// Every CUDA runtime call and every launch is checked: a failure becomes an Error naming the call, its
// file:line, and CUDA's own name and description of the error.
#define CUDA_CHECK(call)                                                                                   \
  do {                                                                                                     \
    cudaError_t err_ = (call);                                                                             \
    if (err_ != cudaSuccess)                                                                               \
      ::nanovllm::fail("CUDA error ", cudaGetErrorName(err_), " (", cudaGetErrorString(err_), ") in ",     \
                       #call, " at ", __FILE__, ":", __LINE__);                                            \
  } while (0)

// After a kernel launch: launch-configuration errors show up here (execution errors surface at the next
// synchronizing call).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// True when a CUDA device is present (false on CI machines, where GPU tests skip).
inline bool cuda_device_present() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

// A kernel that needs more than 48 KB of dynamic shared memory must opt in, once on each device: a function's
// attributes belong to the device's context, and tensor-parallel ranks run on several GPUs, each from its own
// thread. `once` is the call site's (a static, one for each kernel); the attribute is set on the first call on
// each device, which the engine makes eagerly, before any CUDA graph is captured. PerDeviceOnce also keeps
// other once-a-device work: device_figures below, and v9's non-portable cluster size (once_per_device).
struct PerDeviceOnce {
  static constexpr int kMaxDevices = 64;
  std::once_flag flags[kMaxDevices];
};
// Runs set() the first time it is called on the current device, for `once`.
template <class Set>
void once_per_device(PerDeviceOnce& once, Set&& set) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device >= PerDeviceOnce::kMaxDevices) fail("CUDA device ", device, ": more devices than the engine knows");
  std::call_once(once.flags[device], std::forward<Set>(set));
}
inline void allow_dynamic_shared_memory(PerDeviceOnce& once, const void* kernel, int bytes) {
  once_per_device(once,
                  [&] { CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)); });
}

// What grids are sized by, read once for each device (-1: the current one): launches ask on every eager call.
struct DeviceFigures {
  int multiprocessors = 0;  // streaming multiprocessors (H100 SXM and H200: 132)
  int smem_per_sm = 0;      // bytes of shared memory an SM has (H100 and H200: 228 KB)
};
inline const DeviceFigures& device_figures(int device = -1) {
  static PerDeviceOnce once;
  static DeviceFigures figures[PerDeviceOnce::kMaxDevices];
  if (device < 0) CUDA_CHECK(cudaGetDevice(&device));
  if (device >= PerDeviceOnce::kMaxDevices) fail("CUDA device ", device, ": more devices than the engine knows");
  std::call_once(once.flags[device], [&] {
    DeviceFigures& f = figures[device];
    CUDA_CHECK(cudaDeviceGetAttribute(&f.multiprocessors, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  });
  return figures[device];
}

// The number of streaming multiprocessors of `device` (-1: the current device), which sizes grids.
inline int multiprocessor_count(int device = -1) { return device_figures(device).multiprocessors; }

// Dynamic shared memory that holds a kernel's blocks to one an SM: a block then asks for more than half of
// what an SM has, so a second block of the same kernel never fits beside it (the bytes are never used).
// Why a kernel would want that: launched overlapped, a grid's blocks enter while the kernel before still
// holds SMs, and the block scheduler fills the SMs it finds room on, two blocks each, so a grid of one block
// an SM ran on about half of them, each SM's loads shared by two blocks (04_model_runner/NOTES.md, section 9,
// "One block an SM, and the MLP's weights sooner"). Only for a grid of at most multiprocessor_count() blocks:
// a larger one would run in waves (Ch04_BackendCuda.BlocksAskingForOneBlockPerSmSharedMemoryNeverShareAnSm).
inline int one_block_per_sm_smem_bytes(int device = -1) {
  // Half an SM's, and the 1 KB the system takes of it for each resident block.
  return device_figures(device).smem_per_sm / 2 + 1024;
}

// The dynamic shared memory a launch of `blocks` blocks, each using `used_bytes`, asks for so that its blocks
// land one an SM: at least one_block_per_sm_smem_bytes() for a grid no larger than the GPU's SM count, just
// `used_bytes` for a larger one, which runs in waves whatever it asks for. The kernel must have been allowed
// the larger (allow_one_block_per_sm, below), since one launch may take either size.
inline int one_block_per_sm_launch_bytes(int blocks, int used_bytes) {
  return blocks <= multiprocessor_count() ? std::max(used_bytes, one_block_per_sm_smem_bytes()) : used_bytes;
}

// The opt-in that goes with one_block_per_sm_launch_bytes: allows `kernel` the larger of the two sizes, once on
// each device, since a launch may ask for either (a graph captured later may ask for the other).
inline void allow_one_block_per_sm(PerDeviceOnce& once, const void* kernel, int used_bytes) {
  allow_dynamic_shared_memory(once, kernel, std::max(used_bytes, one_block_per_sm_smem_bytes()));
}

// Whether the current GPU is of compute capability 9.0, the only one sm_90a code (wgmma: 05_attention's v12,
// 06_tensor_parallel's v6) runs on. Whether that code was built is each kernel file's own question (a
// `__device__` flag set in its sm_90a pass, read back with cudaMemcpyFromSymbol in that file).
inline bool gpu_is_sm90() {
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

// Overlapped launches (programmatic dependent launch, sm_90 and later). A decode step is ~300 kernels in
// a row, most of them a few microseconds long; between two of them the GPU drains the first grid, then
// starts the second, and each such gap costs a few microseconds of idle SMs. A kernel launched with
// launch_overlapped may start while the kernel before it on the stream is still finishing: its blocks
// become resident as soon as every block of the previous kernel has called allow_next_kernel(), and
// each of its threads calls wait_for_previous_kernel() before it reads anything the previous kernel
// wrote (or writes anything it reads). That wait returns when the previous grid has completed and its
// memory is visible, exactly the guarantee plain stream order gives. Kernels launched the ordinary way
// (cuBLAS, the collectives) keep plain stream order on both sides. Works under CUDA graph capture.
inline bool overlapped_launch_supported() {
  // Asked once, of the device current at the first launch: the engine's GPUs are all of one kind.
  static const bool supported = [] {
    int device = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9;
  }();
  return supported;
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...), allowed to overlap the previous kernel's tail
// (see above; the kernel must call wait_for_previous_kernel first), with the grid's x dimension cut into
// thread-block clusters of cluster_x blocks (sm_90: the blocks of a cluster run at the same time and may
// read each other's shared memory; cluster_x = 1, no clusters). Checked like every launch.
template <class... KernelArgs, class... Args>
void launch_overlapped_in_clusters(void (*kernel)(KernelArgs...), dim3 grid, unsigned cluster_x, dim3 block,
                                   size_t smem_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = cluster_x, attrs[1].val.clusterDim.y = 1, attrs[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem_bytes, config.stream = stream;
  config.attrs = overlapped_launch_supported() ? attrs : attrs + 1;
  config.numAttrs = (overlapped_launch_supported() ? 1 : 0) + (cluster_x > 1 ? 1 : 0);
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <class... KernelArgs, class... Args>
void launch_overlapped(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                       Args&&... args) {
  launch_overlapped_in_clusters(kernel, grid, 1u, block, smem_bytes, stream, std::forward<Args>(args)...);
}

// In a captured CUDA graph, a kernel launched overlapped right after one launched the ordinary way (a cuBLAS
// GEMM) hangs on a programmatic edge that fires only once every block of that kernel has exited (it never
// calls allow_next_kernel): the overlapped kernel's launch then waits for the whole of the one before. But a
// node entered by ordinary edges only started after everything before it had completed, so its overlapped
// successors may be launched as soon as all its blocks have begun (cudaGraphKernelNodePortLaunchCompletion):
// they still wait for it in wait_for_previous_kernel, and what they read before that wait (see below) was
// written before it started. This moves those edges; it leaves every edge out of an overlapped kernel as it
// is, since that kernel's successors must not start before its own wait. Returns the number of edges moved.
inline int start_successors_early(cudaGraph_t graph) {
  size_t count = 0;
  CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);
  CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count));
  std::vector<cudaGraphNode_t> overlapped;  // the nodes a programmatic edge enters
  for (size_t i = 0; i < count; i++)
    if (data[i].type == cudaGraphDependencyTypeProgrammatic) overlapped.push_back(to[i]);
  std::sort(overlapped.begin(), overlapped.end());
  int moved = 0;
  for (size_t i = 0; i < count; i++) {
    if (data[i].type != cudaGraphDependencyTypeProgrammatic || data[i].from_port != cudaGraphKernelNodePortProgrammatic ||
        std::binary_search(overlapped.begin(), overlapped.end(), from[i]))
      continue;
    cudaGraphEdgeData early = data[i];
    early.from_port = cudaGraphKernelNodePortLaunchCompletion;
    CUDA_CHECK(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1));
    CUDA_CHECK(cudaGraphAddDependencies(graph, &from[i], &to[i], &early, 1));
    moved++;
  }
  return moved;
}

#ifdef __CUDACC__

// The two halves of an overlapped launch, for kernels launched with launch_overlapped (no-ops before
// sm_90, and when the kernel was launched the ordinary way). wait_for_previous_kernel: returns once the
// previous kernel on the stream has completed and its writes are visible; nothing the previous kernel
// writes may be touched before it. allow_next_kernel: this block no longer holds the next kernel back
// (the next kernel's blocks may then take free SM slots and wait there). Most kernels call it right after
// their wait; decode attention after its tile loop, so that o_proj's blocks do not compete with it (but
// right after its wait at one sequence, where o_proj's merge comes next: AttentionParams::next_at_wait); the
// norms, and at one decode row gate_up's GEMV and o_proj's merge, before their wait (below).
//
// What a kernel may read before its wait: anything not written by the kernel just before it. A kernel
// that calls allow_next_kernel after its own wait lets kernel i + 1 start only once all of kernel i's
// blocks have passed their wait, that is once kernel i - 1 has completed (and, by the same argument, every
// kernel before it). A kernel launched the ordinary way starts only once every kernel before it has
// completed, and the kernel after it starts once all its blocks have begun (in a graph,
// start_successors_early) or have exited: then too kernel i - 1 has completed. So the weights,
// the step's inputs (uploaded before the step's first kernel, or in a graph pulled by that kernel, which
// has completed before any kernel after the next one starts) and the KV cache of earlier steps may be
// loaded before the wait, while the previous kernel finishes (what changes from step to step through L2:
// ld.global.cg, cp.async.cg; an SM's L1 is not kept coherent with other SMs' writes). Writes still wait:
// the previous kernel may read what they overwrite.
//
// A norm lets the next kernel in first: rmsnorm_kernel calls allow_next_kernel before its wait, so the
// projection after it may start while the projection before it still runs (kernel i - 1). That is safe
// because a projection reads nothing but its weights before its wait, and its wait still returns only once
// the norm, and so everything before the norm, has completed. Two more kernels do the same at one decode
// row, for the same reason: gate_up's GEMV with its activation (linear_gemv.cu) lets down_proj in, and
// o_proj's merge of attention's splits (05_attention/o_proj_merge.cu) lets the norm in, whose weight is all
// it reads before its wait; so at one row the norm, gate_up and down_proj may all be loading their weights
// while attention still runs, each still waiting for the kernel just before it.
__device__ inline void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ inline void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

// Sum over the lanes of a warp (every lane gets the total).
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the threads of a block of at most MAX_WARPS warps (every thread gets the total, added warp by
// warp in order). Every thread of the block must call it.
template <int MAX_WARPS>
__device__ inline float block_sum(float v) {
  __shared__ float partial[MAX_WARPS];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();  // every warp's partial is written before any thread reads them
  float total = 0;
#pragma unroll
  for (int w = 0; w < MAX_WARPS; w++)
    if (w < int(blockDim.x / 32)) total += partial[w];
  __syncthreads();  // partial[] may be reused by the next call
  return total;
}

// SiLU(gate) * up in fp32, the MLP's activation (nano-vllm's SiluAndMul): the one expression of every
// kernel that applies it (04_model_runner/layers.cu's silu_and_mul, 06_tensor_parallel's v2, v5, v6 and v7),
// so that fused and separate kernels give the same bits.
__device__ inline float silu_times(float gate, float up) { return gate / (1.0f + __expf(-gate)) * up; }

#endif  // __CUDACC__

}  // namespace nanovllm

#endif  // NANOVLLM_CUDA
