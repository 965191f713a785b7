// bf16.h: bfloat16 and half precision, the one home of their conversions. On the host: bit-exact
// float <-> bf16 (as PyTorch rounds) and fp16 -> float for checkpoints. In CUDA code: the bf16 type and
// 8 values moved as one 16-byte access.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef NANOVLLM_CUDA
#include <cuda_bf16.h>
#endif

namespace nanovllm {

// bfloat16: the top 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits).

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest, ties to even, as torch's .to(torch.bfloat16) does; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

// IEEE half precision (1 sign, 5 exponent, 10 mantissa bits), for checkpoints stored as F16.
inline float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal: value = mantissa * 2^-24, exact in float
    float f = float(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

#ifdef NANOVLLM_CUDA
using bf16 = __nv_bfloat16;
#endif

#ifdef __CUDACC__
// 8 bf16 values moved as one 16-byte access (the widest a thread can load), converted to/from fp32.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ inline void unpack_bf16x8(const Bf16x8& v, float out[8]) {
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 f = __bfloat1622float2(v.h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// p: 8 values starting on a 16-byte boundary (one vector access; a misaligned p is a fault, not a slow load).
__device__ inline void load_bf16x8(const bf16* p, float out[8]) {
  unpack_bf16x8(*reinterpret_cast<const Bf16x8*>(p), out);
}

// p: 8 values starting on a 16-byte boundary, as for load_bf16x8; in rounded to bf16 (nearest even).
__device__ inline void store_bf16x8(bf16* p, const float in[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; i++) v.h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<Bf16x8*>(p) = v;
}

// One fp32 result stored as the output's element type: rounded to bf16 (activations) or as it is (fp32
// logits). The projections' kernels are templates over that type.
__device__ inline void store_float(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ inline void store_float(float* p, float v) { *p = v; }
// Two and four neighbouring results in one store: 4 and 8 bytes of bf16, 8 and 16 of fp32. p must be
// aligned to that size.
__device__ inline void store_float2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ inline void store_float2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ inline void store_float4(bf16* p, float4 v) {
  struct alignas(8) Bf16x4 {
    __nv_bfloat162 h[2];
  } four = {{__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)}};
  *reinterpret_cast<Bf16x4*>(p) = four;
}
__device__ inline void store_float4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// The same 8 values already loaded as raw 16 bytes (a uint4), converted to float.
__device__ inline void bf16x8_to_float(const uint4& raw, float out[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}
#endif  // __CUDACC__

}  // namespace nanovllm
