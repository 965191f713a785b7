// graph_edges_test.cu: kernels only the tests launch (test_ch04; the Makefile's *_test.cu rule), for
// start_successors_early (01_sequence/base/cuda_utils.h). A slow writer launched the ordinary way, as cuBLAS
// launches its GEMMs, then copies launched overlapped, as our kernels are: a copy that read its input before
// the writer had finished would copy what was there before.
#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {
namespace test {
namespace {

// out (n) = value, after a spin of delay_cycles. One block; launched the ordinary way (no griddepcontrol).
__global__ void slow_fill_kernel(float* out, int n, float value, long long delay_cycles) {
  const long long start = clock64();
  while (clock64() - start < delay_cycles) {
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}

// out (n) = in (n), read after the wait for the kernel before (which writes `in`).
__global__ void overlapped_copy_kernel(float* out, const float* in, int n) {
  wait_for_previous_kernel();
  allow_next_kernel();
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += int(gridDim.x * blockDim.x)) out[i] = in[i];
}

}  // namespace

void slow_fill_cuda(float* out, int n, float value, long long delay_cycles, cudaStream_t stream) {
  slow_fill_kernel<<<1, 256, 0, stream>>>(out, n, value, delay_cycles);
  CUDA_CHECK_LAUNCH();
}

void overlapped_copy_cuda(float* out, const float* in, int n, cudaStream_t stream) {
  launch_overlapped(overlapped_copy_kernel, 4, 256, 0, stream, out, in, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace test
}  // namespace nanovllm
