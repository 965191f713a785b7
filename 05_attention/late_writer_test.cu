// late_writer_test.cu: a kernel only the tests launch (test_ch05; the Makefile's *_test.cu rule). It is
// launched overlapped, as every kernel of a decode step is, lets the next kernel start at once, and only
// after a spin of `delay_cycles` writes one row of K and one of V to each of `n` cache slots: the previous
// kernel of a decode step at its slowest, writing each sequence's newest key (qk_norm_rope_store does).
// A kernel after it that read those slots before its own wait (cuda_utils.h) would see what was there
// before. Ch05_AttentionCuda.DecodeReadsTheNewestKeyAfterThePreviousKernel puts NaN there.
#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {
namespace test {
namespace {

// k_cache, v_cache: (num_slots, kv_dim) bf16; k_rows, v_rows: (n, kv_dim) bf16; slots: (n). One block.
__global__ void late_cache_write_kernel(bf16* k_cache, bf16* v_cache, const bf16* k_rows, const bf16* v_rows,
                                        const int32_t* slots, int n, int kv_dim, long long delay_cycles) {
  wait_for_previous_kernel();
  allow_next_kernel();  // the next kernel's blocks may start now, and read what they read before their wait
  const long long start = clock64();
  while (clock64() - start < delay_cycles) {
  }
  for (int64_t i = threadIdx.x; i < int64_t(n) * kv_dim; i += blockDim.x) {
    const int64_t row = i / kv_dim, at = int64_t(slots[row]) * kv_dim + i % kv_dim;
    k_cache[at] = k_rows[i];
    v_cache[at] = v_rows[i];
  }
}

}  // namespace

void late_cache_write_cuda(bf16* k_cache, bf16* v_cache, const bf16* k_rows, const bf16* v_rows,
                           const int32_t* slots, int n, int kv_dim, long long delay_cycles, cudaStream_t stream) {
  launch_overlapped(late_cache_write_kernel, 1, 256, 0, stream, k_cache, v_cache, k_rows, v_rows, slots, n, kv_dim,
                    delay_cycles);
}

}  // namespace test
}  // namespace nanovllm
