// graph_edges_test.cu: kernels only the tests launch (test_ch04; the Makefile's *_test.cu rule), for the
// edges between kernels (01_sequence/base/cuda_utils.h). A slow writer launched the ordinary way, as cuBLAS
// launches its GEMMs, then copies launched overlapped, as our kernels are: a copy that read its input before
// the writer had finished would copy what was there before (start_successors_early). And a late writer
// launched overlapped, which lets the next kernel start at once: the projection before a norm at its
// slowest (a norm lets its own next kernel start before its wait). And blocks that record the SM they ran on
// and when, for the test of one_block_per_sm_smem_bytes; and a kernel that does nothing, whose opt-in to
// dynamic shared memory the test of allow_one_block_per_sm reads back.
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

// dst (n) = src (n), after a spin of delay_cycles. One block; launched overlapped, and the next kernel may
// start as soon as the wait returns, long before dst is written.
__global__ void late_copy_kernel(bf16* dst, const bf16* src, int64_t n, long long delay_cycles) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const long long start = clock64();
  while (clock64() - start < delay_cycles) {
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Block b: sm_of_block[b] = the SM it ran on, begin[b] and end[b] = the global timer (ns) as it started and
// as it ended, a spin of delay_cycles apart. Its dynamic shared memory is asked for and never used.
__global__ void record_residency_kernel(int* sm_of_block, long long* begin, long long* end, long long delay_cycles) {
  if (threadIdx.x != 0) return;
  unsigned sm = 0;
  long long t0 = 0, t1 = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long start = clock64();
  while (clock64() - start < delay_cycles) {
  }
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  sm_of_block[blockIdx.x] = int(sm), begin[blockIdx.x] = t0, end[blockIdx.x] = t1;
}

// Never launched: its address is what allow_one_block_per_sm's test opts in and reads the attribute of.
__global__ void opt_in_probe_kernel() {}

}  // namespace

const void* opt_in_probe_kernel_address() { return reinterpret_cast<const void*>(opt_in_probe_kernel); }

void record_residency_cuda(int blocks, int smem_bytes, int* sm_of_block, long long* begin, long long* end,
                           long long delay_cycles, cudaStream_t stream) {
  CUDA_CHECK(cudaFuncSetAttribute(record_residency_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  record_residency_kernel<<<blocks, 32, smem_bytes, stream>>>(sm_of_block, begin, end, delay_cycles);
  CUDA_CHECK_LAUNCH();
}

void late_copy_cuda(bf16* dst, const bf16* src, int64_t n, long long delay_cycles, cudaStream_t stream) {
  launch_overlapped(late_copy_kernel, 1, 256, 0, stream, dst, src, n, delay_cycles);
  CUDA_CHECK_LAUNCH();
}

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
