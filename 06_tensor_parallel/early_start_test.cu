// early_start_test.cu: kernels only the tests launch (test_ch06; the Makefile's *_test.cu rule), for
// waits_for_a_late_writer and the GEMMs started early (linear.h, CudaLinear::take_gemm_predecessors).
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace test {
namespace {

// y (count) = 2 x. Launched the ordinary way. With WAIT it first waits for the kernel before it, as a
// kernel built for overlapped launches does (a no-op when its edge is an ordinary one); without, it reads
// x at once.
template <bool WAIT>
__global__ void double_kernel(bf16* y, const bf16* x, size_t count) {
  if (WAIT) wait_for_previous_kernel();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    y[i] = bf16(2.0f * float(x[i]));
}

// Does nothing: gives the overlapped kernel after it a programmatic edge to enter.
__global__ void nothing_kernel() {}

// x (count) = source (count), after the wait for the kernel before and a spin of delay_ns. Launched
// overlapped, as the engine's kernels before a projection are.
__global__ void late_copy_kernel(bf16* x, const bf16* source, size_t count, long long delay_ns) {
  wait_for_previous_kernel();
  allow_next_kernel();
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < delay_ns);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    x[i] = source[i];
}

}  // namespace

void double_cuda(bf16* y, const bf16* x, size_t count, bool wait, cudaStream_t stream) {
  if (wait)
    double_kernel<true><<<132, 256, 0, stream>>>(y, x, count);
  else
    double_kernel<false><<<132, 256, 0, stream>>>(y, x, count);
  CUDA_CHECK_LAUNCH();
}

void late_copy_after_nothing_cuda(bf16* x, const bf16* source, size_t count, long long delay_ns, cudaStream_t stream) {
  nothing_kernel<<<1, 32, 0, stream>>>();
  CUDA_CHECK_LAUNCH();
  launch_overlapped(late_copy_kernel, 132, 256, 0, stream, x, source, count, delay_ns);
  CUDA_CHECK_LAUNCH();
}

}  // namespace test
}  // namespace nanovllm
