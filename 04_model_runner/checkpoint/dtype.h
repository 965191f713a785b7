// dtype.h: element types of checkpoint tensors and of the engine's own buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nanovllm {

// The names are safetensors' own ("BF16", "F32", ...).
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

// Parses a safetensors dtype name; returns false for anything else.
inline bool dtype_from_name(std::string_view name, DType* out) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16,
                  DType::I8, DType::U8, DType::BOOL}) {
    if (name == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

}  // namespace nanovllm
