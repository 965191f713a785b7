// Shadow of 01_sequence/base/cuda_utils.h for the emulator (host compiler): the CUDA built-ins the
// kernels use become calls into emu_runtime.cc; bf16.h's device-only helpers get host versions.
#pragma once
#include <cuda_runtime.h>
#include <cmath>
#include <algorithm>
#include "01_sequence/base/bf16.h"
#include "01_sequence/base/common.h"
#include "emu_runtime.h"

#undef __shared__
#define __shared__ static
#undef threadIdx
#undef blockIdx
#undef gridDim
#undef blockDim
#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define gridDim (::emu::grid_dim())
#define blockDim (::emu::block_dim())
#define __syncthreads() ::emu::syncthreads()
#define __shfl_xor_sync(mask, v, off) ::emu::shfl_xor(mask, v, off)
#define __cvta_generic_to_shared(p) ::emu::cvta_shared(p)
inline int min(int a, int b) { return a < b ? a : b; }

namespace nanovllm {
#define CUDA_CHECK(call) do { } while (0)
#define CUDA_CHECK_LAUNCH()
struct alignas(16) Bf16x8 { __nv_bfloat162 h[4]; };
inline void load_bf16x8(const bf16* p, float out[8]) {
  if (reinterpret_cast<uintptr_t>(p) % 16) ::nanovllm::fail("emu: misaligned 16-byte load");
  Bf16x8 v = *reinterpret_cast<const Bf16x8*>(p);
  for (int i = 0; i < 4; i++) { float2 f = __bfloat1622float2(v.h[i]); out[2 * i] = f.x; out[2 * i + 1] = f.y; }
}
inline void store_bf16x8(bf16* p, const float in[8]) {
  if (reinterpret_cast<uintptr_t>(p) % 16) ::nanovllm::fail("emu: misaligned 16-byte store");
  Bf16x8 v;
  for (int i = 0; i < 4; i++) v.h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<Bf16x8*>(p) = v;
}
inline void bf16x8_to_float(const uint4& raw, float out[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  for (int i = 0; i < 4; i++) { float2 f = __bfloat1622float2(h[i]); out[2 * i] = f.x, out[2 * i + 1] = f.y; }
}
inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
}  // namespace nanovllm
