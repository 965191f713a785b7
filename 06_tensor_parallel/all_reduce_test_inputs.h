// all_reduce_test_inputs.h: the all-reduce tests' inputs (CPU and GPU), chosen so that the order in which
// the ranks' values are added shows in the rounded sums. Random bf16 values of similar size would not
// do: with 8 significant bits each, their fp32 sums are exact or differ below bf16's rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "06_tensor_parallel/all_reduce.h"
#include "tests/test_util.h"

namespace nanovllm::test {

// (world, n) bf16 bits. Per element, one magnitude M in [2^-8, 2^9); each rank holds +M or -M (one chance in
// two, either sign at random) or a small value 2^-9 M .. 2^-30 M. The Ms add up exactly (to a multiple of M),
// and a small value added while an M was in the fp32 accumulator lost its low bits (or all of them):
// which ones depends on the order. No NaN, no infinity, no overflow.
inline std::vector<std::vector<uint16_t>> reduce_inputs(int world, int64_t n, Rng& rng) {
  std::vector<std::vector<uint16_t>> x(size_t(world), std::vector<uint16_t>(size_t(n), 0));
  for (int64_t i = 0; i < n; i++) {
    const uint64_t m = rng.next();
    const int big_exponent = 127 - 8 + int(m % 17);  // bf16 exponent field: [2^-8, 2^9)
    const uint16_t big_mantissa = uint16_t((m >> 8) & 0x7f);
    for (int r = 0; r < world; r++) {
      const uint64_t bits = rng.next();
      const uint16_t sign = uint16_t((bits & 1) << 15);
      const bool big = (bits >> 1) & 1;
      const int exponent = big ? big_exponent : big_exponent - 9 - int((bits >> 2) % 22);
      const uint16_t mantissa = big ? big_mantissa : uint16_t((bits >> 8) & 0x7f);
      x[size_t(r)][size_t(i)] = uint16_t(sign | (exponent << 7) | mantissa);
    }
  }
  return x;
}

// all_reduce_cpu of reduce_inputs' layout: the (n,) bits every rank must hold.
inline std::vector<uint16_t> reduce_reference(const std::vector<std::vector<uint16_t>>& x) {
  std::vector<const uint16_t*> ranks;
  for (const auto& rank : x) ranks.push_back(rank.data());
  std::vector<uint16_t> out(x.empty() ? 0 : x[0].size());
  all_reduce_cpu(out.data(), ranks.data(), int(ranks.size()), int64_t(out.size()));
  return out;
}

}  // namespace nanovllm::test
