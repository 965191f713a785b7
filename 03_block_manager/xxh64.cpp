// xxh64.cpp: XXH64, written to follow the xxHash specification (doc/xxhash_spec.md in Cyan4973/xxHash)
// step by step. Each function is named after the spec's step it implements.
#include "03_block_manager/xxh64.h"

#include <cstring>

namespace nanovllm {
namespace {

// The five primes of the spec (odd 64-bit numbers with a good mix of 0 and 1 bits).
constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The spec reads input as little-endian words whatever the machine: assembling each word byte by byte does
// that on any endianness.
uint64_t read64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
uint32_t read32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

// Step 2: one lane of a 32-byte stripe mixed into its accumulator.
uint64_t round(uint64_t acc, uint64_t lane) {
  acc += lane * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

// Step 3: fold one accumulator into the converged value.
uint64_t merge_accumulator(uint64_t acc, uint64_t accN) {
  acc ^= round(0, accN);
  return acc * kPrime1 + kPrime4;
}

// Step 1 (initialise the four accumulators).
void init_accumulators(uint64_t acc[4], uint64_t seed) {
  acc[0] = seed + kPrime1 + kPrime2;
  acc[1] = seed + kPrime2;
  acc[2] = seed;
  acc[3] = seed - kPrime1;
}

void consume_stripe(uint64_t acc[4], const uint8_t* stripe) {
  for (int i = 0; i < 4; i++) acc[i] = round(acc[i], read64(stripe + 8 * i));
}

// Step 3 (converge the accumulators) when at least one stripe was read, else the short-input start.
uint64_t converge(const uint64_t acc[4], uint64_t seed, uint64_t total_len) {
  if (total_len < 32) return seed + kPrime5;
  uint64_t h = rotl(acc[0], 1) + rotl(acc[1], 7) + rotl(acc[2], 12) + rotl(acc[3], 18);
  for (int i = 0; i < 4; i++) h = merge_accumulator(h, acc[i]);
  return h;
}

// Steps 4-6: add the length, consume the last 0..31 bytes (8, then 4, then 1 at a time), avalanche.
uint64_t finalize(uint64_t h, uint64_t total_len, const uint8_t* tail, size_t tail_len) {
  h += total_len;
  while (tail_len >= 8) {
    h ^= round(0, read64(tail));
    h = rotl(h, 27) * kPrime1 + kPrime4;
    tail += 8, tail_len -= 8;
  }
  if (tail_len >= 4) {
    h ^= uint64_t(read32(tail)) * kPrime1;
    h = rotl(h, 23) * kPrime2 + kPrime3;
    tail += 4, tail_len -= 4;
  }
  while (tail_len > 0) {
    h ^= uint64_t(*tail) * kPrime5;
    h = rotl(h, 11) * kPrime1;
    tail++, tail_len--;
  }
  // Step 6: the avalanche makes every input bit affect every output bit.
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t xxh64(const void* data, size_t len, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t acc[4];
  init_accumulators(acc, seed);
  size_t consumed = 0;
  for (; consumed + 32 <= len; consumed += 32) consume_stripe(acc, p + consumed);
  return finalize(converge(acc, seed, len), len, p + consumed, len - consumed);
}

Xxh64::Xxh64(uint64_t seed) : seed_(seed) { init_accumulators(acc_, seed); }

void Xxh64::update(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_len_ += len;
  if (stripe_size_ > 0) {  // top up the partial stripe first
    size_t take = 32 - stripe_size_ < len ? 32 - stripe_size_ : len;
    std::memcpy(stripe_ + stripe_size_, p, take);
    stripe_size_ += take, p += take, len -= take;
    if (stripe_size_ < 32) return;
    consume_stripe(acc_, stripe_);
    stripe_size_ = 0;
  }
  for (; len >= 32; p += 32, len -= 32) consume_stripe(acc_, p);
  std::memcpy(stripe_, p, len);
  stripe_size_ = len;
}

uint64_t Xxh64::digest() const {
  return finalize(converge(acc_, seed_, total_len_), total_len_, stripe_, stripe_size_);
}

}  // namespace nanovllm
