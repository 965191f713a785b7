// cuda_utils.h: what every CUDA file shares: CUDA_CHECK, and 16-byte loads/stores of 8 bf16 values.
// (Header-only; in chapter 01 because chapters 04-07 all use it and 01 is the one they all build on.)
#pragma once

#ifdef NANOVLLM_CUDA

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

using bf16 = __nv_bfloat16;

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

// 8 bf16 values moved as one 16-byte access (the widest a thread can load), converted to/from fp32.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ inline void load_bf16x8(const bf16* p, float out[8]) {
  Bf16x8 v = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 f = __bfloat1622float2(v.h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ inline void store_bf16x8(bf16* p, const float in[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; i++) v.h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<Bf16x8*>(p) = v;
}

// Sum over the lanes of a warp (every lane gets the total).
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

#endif  // __CUDACC__

}  // namespace nanovllm

#endif  // NANOVLLM_CUDA
