// Shadow of 05_attention/ptx.cuh for the emulator.
#pragma once
#include <cstdint>
#include "01_sequence/base/cuda_utils.h"
namespace nanovllm {
inline uint32_t smem_address(const void* p) { return __cvta_generic_to_shared(p); }
inline void cp_async_16(uint32_t dst, const void* src, bool valid) { ::emu::cp_async_16(dst, src, valid); }
inline void cp_async_commit() { ::emu::cp_async_commit(); }
template <int N> inline void cp_async_wait() { ::emu::cp_async_wait(N); }
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t a) { ::emu::ldmatrix_x4(r, a, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t a) { ::emu::ldmatrix_x4(r, a, true); }
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { ::emu::mma_16816(d, a, b0, b1); }
inline uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
}  // namespace nanovllm
