// common.h: the few helpers every chapter shares.
//
//   Error           the one exception type for anything a user can get wrong (a file, a flag, a request)
//   fail(...)       throw an Error whose message is the arguments streamed together
//   ceil_div(a, b)  rounded-up integer division (blocks needed for n tokens)
//   bf16 / fp16     conversions to and from float, bit-exact with PyTorch's
//   data_dir()      build/data, where `make` unpacks the shipped tokenizer
//
// They live in chapter 01 because it is the lowest chapter that needs them (the JSON reader throws Error).
#pragma once

#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace nanovllm {

// Thrown for bad input. The command line prints "error: " + what() as one line and exits 1, so a message
// names the file, field or value at fault and needs no "error:" prefix of its own.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream message;
  (message << ... << args);
  throw Error(message.str());
}

// The folder of data files that `make` prepares beside the binaries: <folder of this executable>/data, so
// build/data for build/nanovllm and for the test binaries, or $NANOVLLM_DATA_DIR when set. The tokenizer
// is at data_dir() + "/qwen3-tokenizer"; the command line writes its random checkpoints there too.
std::string data_dir();

template <class T>
constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// ---------------------------------------------------------------------------------------------------
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

}  // namespace nanovllm
