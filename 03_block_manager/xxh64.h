// xxh64.h: the XXH64 hash (xxHash spec, "XXH64 algorithm description", steps 1-6), one-shot and
// streaming. BlockManager::compute_hash chains it over blocks of token ids for the prefix cache.
//
// Walkthrough: walkthrough/xxh64.md follows the spec step by step beside this code.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nanovllm {

// XXH64 of len bytes at data, with the given seed (nano-vllm uses seed 0).
uint64_t xxh64(const void* data, size_t len, uint64_t seed = 0);

// The same hash fed in pieces: update() any number of times, then digest(). Equal to the one-shot
// xxh64() of the concatenated pieces, however the input is split.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t len);
  uint64_t digest() const;

 private:
  uint64_t seed_;
  uint64_t acc_[4];         // the four lane accumulators (step 1)
  uint8_t stripe_[32];      // bytes of a stripe not yet consumed
  size_t stripe_size_ = 0;  // how many bytes of stripe_ are filled
  uint64_t total_len_ = 0;
};

}  // namespace nanovllm
