// cuda_utils.h: what every CUDA file shares: CUDA_CHECK after every runtime call and launch, whether a
// GPU is present, and warp_sum. Header-only; bf16 itself is in bf16.h.
#pragma once

#ifdef NANOVLLM_CUDA

#include <cuda_runtime.h>

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

#ifdef __CUDACC__

// Sum over the lanes of a warp (every lane gets the total).
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

#endif  // __CUDACC__

}  // namespace nanovllm

#endif  // NANOVLLM_CUDA
