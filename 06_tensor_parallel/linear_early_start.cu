// linear_early_start.cu: whether a kernel someone else wrote (cuBLAS's GEMM) may be started early in a
// CUDA graph, asked of the kernel itself (linear.h, waits_for_a_late_writer).
//
// Why: in a decode step from 65 rows on, cuBLAS runs the projections, and its kernels are launched the
// ordinary way: each starts only once the kernel before it has drained, while our kernels (launched
// overlapped, 01_sequence/base/cuda_utils.h) start as the one before them passes its wait. An edge into a
// GEMM made programmatic lets the GEMM start as ours do, but only a kernel that waits (griddepcontrol.wait)
// before it reads its inputs may start that way, and cuBLAS documents nothing about its kernels. So we ask
// each product: started early behind a kernel that lets it start at once and writes its input 20 µs later,
// does it compute the same y as in stream order? A kernel that does not wait reads the input before it is
// written (a GEMM of these sizes takes 3-15 µs), and the answer is no.
#ifdef NANOVLLM_CUDA
#include <vector>

#include "06_tensor_parallel/linear.h"

namespace nanovllm {

namespace {

// Lets the next kernel start at once (every block triggers first), then, after delay_ns, writes x = 1.
// Launched the ordinary way: it is the first kernel of the probe's graph.
__global__ void late_writer_kernel(bf16* x, size_t count, long long delay_ns) {
  allow_next_kernel();
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < delay_ns);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    x[i] = bf16(1.0f);
}

// counts[0] = the number of 4-byte words where a and b differ, counts[1] = the number of words of b not 0.
__global__ void count_differences_kernel(const uint32_t* a, const uint32_t* b, size_t words, unsigned* counts) {
  unsigned differ = 0, nonzero = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < words; i += size_t(gridDim.x) * blockDim.x)
    differ += a[i] != b[i], nonzero += b[i] != 0;
  if (differ) atomicAdd(&counts[0], differ);
  if (nonzero) atomicAdd(&counts[1], nonzero);
}

constexpr long long kLateNs = 20000;  // the writer's delay: longer than any product probed takes

}  // namespace

bool waits_for_a_late_writer(cudaStream_t stream, bf16* x, size_t x_count, void* y, void* y_reference,
                             size_t y_bytes, unsigned* counts, const std::function<void()>& launch) {
  if (!overlapped_launch_supported() || y_bytes % 4 != 0) return false;
  // The reference: x = 1, then the product, in stream order.
  late_writer_kernel<<<132, 256, 0, stream>>>(x, x_count, 0);
  CUDA_CHECK_LAUNCH();
  launch();
  CUDA_CHECK(cudaMemcpyAsync(y_reference, y, y_bytes, cudaMemcpyDeviceToDevice, stream));

  // The same product started early: x = 0, the late writer, the product, with the writer's edges into the
  // product's kernels made programmatic.
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemsetAsync(x, 0, x_count * sizeof(bf16), stream));
  CUDA_CHECK(cudaMemsetAsync(y, 0, y_bytes, stream));
  late_writer_kernel<<<132, 256, 0, stream>>>(x, x_count, kLateNs);
  const cudaError_t launched = cudaGetLastError();
  const std::vector<cudaGraphNode_t> writer = capture_tail(stream);
  launch();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(launched);
  const int started_early = start_after(graph, writer);
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaMemsetAsync(counts, 0, 2 * sizeof(unsigned), stream));
  count_differences_kernel<<<132, 256, 0, stream>>>(static_cast<const uint32_t*>(y),
                                                    static_cast<const uint32_t*>(y_reference), y_bytes / 4, counts);
  CUDA_CHECK_LAUNCH();
  unsigned host[2] = {};
  CUDA_CHECK(cudaMemcpyAsync(host, counts, sizeof(host), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  // A y of zeros either way would say nothing (a kernel that read x = 0 would have computed it too).
  return started_early > 0 && host[0] == 0 && host[1] > 0;
}

}  // namespace nanovllm
#endif
