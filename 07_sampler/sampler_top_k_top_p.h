// sampler_top_k_top_p.h: top-k and top-p without sorting, the pieces the GPU kernel and its CPU mirror share.
//
//   logit_key, key_logit    a float logit as an unsigned key with the same order, and back
//   Mass, logit_mass        a token's probability relative to the most likely one, as 64-bit fixed point
//   top_p_target            the mass the kept prefix must reach
//   select_digit            one step of a radix select: which digit of the threshold key comes next
//   KeptSet                 the result: keys above a threshold, and the first `ties` equal to it
//   is_top_k_top_p_row      which rows the kernel samples (the others stay with sample_kernel)
//   top_k_top_p_kept_cpu, sample_row_top_k_top_p_cpu   the kernel's algorithm, sequential (tests run it
//                           without a GPU); sample_row_cpu (sampler.h) stays the definition
//   sample_top_k_top_p_cuda the kernel's launcher (sampler_top_k_top_p.cu, whose header comment explains
//                           the algorithm with a worked example)
//
// The definition to match is sample_row_cpu's: sort the vocabulary by descending logit, ties in index
// order (a stable sort); keep the first top_k; of those, keep the shortest prefix whose probabilities
// (softmax of logits / T over the top-k candidates) reach top_p; Gumbel-max over what is left. The kept
// set is always a prefix of that sorted order, so it is described by the last key kept, the threshold,
// and how many of the logits equal to it are kept (lowest ids first): a KeptSet.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "07_sampler/sampler.h"

namespace nanovllm {

// ---------------------------------------------------------------------------------------------------
// Keys: the order of floats as the order of unsigned integers

// For floats a < b (not NaN), logit_key(a) < logit_key(b); -0 and +0 share the key of +0, as they compare
// equal (the CPU's stable sort then keeps them in index order, and so does the kernel). A positive float
// gets its sign bit set, so it sorts above every negative one; a negative float has all its bits flipped,
// since a larger magnitude is a smaller number:
//   logit_key(-inf) = 0x007fffff   logit_key(-1) = 0x407fffff   logit_key(0) = 0x80000000
//   logit_key(0.5)  = 0xbf000000   logit_key(1)  = 0xbf800000   logit_key(3) = 0xc0400000
//   logit_key(+inf) = 0xff800000
// No non-NaN float has key 0, so "keys above 0" means every logit.
SAMPLER_HD inline uint32_t logit_key(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  if (bits == 0x80000000u) bits = 0;  // -0 -> +0
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// The float of a key (the inverse of logit_key, -0 coming back as +0).
SAMPLER_HD inline float key_logit(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? key & 0x7fffffffu : ~key;
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

// Radix select looks at a key 8 bits at a time, most significant first: digit d of `key` at `shift`
// (24, 16, 8, 0) is (key >> shift) & 255, one of 256 bins.
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;  // 256

SAMPLER_HD inline int key_digit(uint32_t key, int shift) { return int((key >> shift) & (kRadixBins - 1)); }

// True when `key` has the digits of `prefix` above `shift` (the digits chosen so far). At shift 24 there
// are none and every key matches: 0xffffffff << 32 is done in 64 bits, whose low half is 0.
SAMPLER_HD inline bool key_matches(uint32_t key, uint32_t prefix, int shift) {
  const uint32_t above = uint32_t(0xffffffffull << (shift + kRadixBits));
  return (key & above) == (prefix & above);
}

// ---------------------------------------------------------------------------------------------------
// Masses: probabilities as integers, so that sums do not depend on their order

// A token's unnormalised probability q = exp((x - max_logit) / T), in (0, 1] for the finite logits of a
// row whose largest is max_logit, in fixed point: Q = round(q * 2^44). The most likely token has exactly
// 2^44. Integer sums are exact, so a histogram filled by atomics in any order holds the same totals on
// every run, which float atomics would not. A row of up to 2^19 tokens sums to at most 2^63: no overflow.
// q is computed in double, as sample_row_cpu does; rounding to 2^-44 moves a cumulative sum by at most
// 2^-45 per token (4e-9 of the largest mass over 151,936 tokens), so the kept set is the CPU's unless a
// cumulative sum lands that close to top_p * Z. A token more than 31 * T below the maximum (q < 2^-45)
// weighs 0: it is never the one that crosses top_p, as the whole tail of such tokens weighs less than
// 2^19 * 2^-45 = 2^-26 of the most likely token, less than 1 - top_p >= 2^-24 of the total.
using Mass = unsigned long long;  // unsigned long long, not uint64_t: the type CUDA's atomicAdd takes
constexpr int kMassBits = 44;
constexpr int kMaxTopKTopPVocab = 1 << 19;  // 2^19 tokens * 2^44 = 2^63

SAMPLER_HD inline Mass logit_mass(float x, float max_logit, float temperature) {
  const double q = exp((double(x) - double(max_logit)) / double(temperature));
  return Mass(q * double(1ull << kMassBits) + 0.5);  // q * 2^44 <= 2^44: + 0.5 is exact, the cast rounds
}

// The mass the kept prefix must reach: ceil(top_p * total), and at least 1 so that the first candidate is
// always kept (sample_row_cpu keeps it whatever top_p is). A prefix of masses S reaches top_p when
// S / total >= top_p, that is S >= top_p * total, that is S >= ceil(top_p * total) as S is an integer.
SAMPLER_HD inline Mass top_p_target(float top_p, Mass total) {
  const double target = ceil(double(top_p) * double(total));
  return target < 1 ? Mass(1) : Mass(target);
}

// ---------------------------------------------------------------------------------------------------
// Radix select

// One step of a radix select. hist[first .. first + count) counts (top-k) or weighs (top-p) the keys that
// match the digits chosen so far, by their next digit; `want` is how much of them the kept set still
// needs, largest keys first (0 < want <= their total). The threshold's next digit is the bin where the
// running total from the top first reaches `want`: the bins above it hold less than `want`, the bins from
// it up at least `want`. remaining = want minus what the bins above hold, still needed from keys with
// this digit. Example: hist[255..250] = {0, 0, 3, 4, 0, 1} and want 5: 0, 0, 3 < 5, then 3 + 4 >= 5, so
// digit 252, remaining 5 - 3 = 2.
struct DigitChoice {
  int digit;
  Mass remaining;  // a count (top-k) or a mass (top-p)
};

template <class T>
SAMPLER_HD inline DigitChoice select_digit(const T* hist, int first, int count, T want) {
  T above = 0;
  for (int d = first + count - 1; d > first; d--) {
    if (above + hist[d] >= want) return {d, Mass(want - above)};
    above += hist[d];
  }
  return {first, Mass(want - above)};
}

// The kept set of a row: every logit whose key is above `threshold`, and the first `ties` logits (lowest
// ids first) whose key equals it. {0, 0} keeps every logit.
struct KeptSet {
  uint32_t threshold;
  uint32_t ties;
};

// The rows that sample_top_k_top_p_kernel samples: sampled (not samples_greedily: temperature >= 1e-5)
// with top-k (0 < top_k < vocab) or top-p (< 1). These are sample_row_cpu's `filtered` rows less the
// greedy ones: a greedy row is the argmax whatever top-k and top-p say, and that token is always kept
// by them.
SAMPLER_HD inline bool is_top_k_top_p_row(const SamplingRow& row, int vocab_size) {
  return !samples_greedily(row.temperature) && ((row.top_k > 0 && row.top_k < vocab_size) || row.top_p < 1.0f);
}

// The kept set of one row of finite logits (vocab_size,), found as sample_top_k_top_p_kernel finds it
// (radix select over keys, then over fixed-point masses), one pass after another on one thread.
KeptSet top_k_top_p_kept_cpu(const float* logits, int vocab_size, const SamplingRow& row);

// The token sample_top_k_top_p_kernel draws for one row (vocab_size,): -1 when the row holds a NaN or its
// largest logit is infinite (+inf, or every logit -inf); else Gumbel-max over top_k_top_p_kept_cpu's set.
// Equals sample_row_cpu's token whenever the kept sets agree (see the Mass comment).
int32_t sample_row_top_k_top_p_cpu(const float* logits, int vocab_size, const SamplingRow& row);

}  // namespace nanovllm

#ifdef NANOVLLM_CUDA
namespace nanovllm {

// tokens (num_rows,) <- for every row b with is_top_k_top_p_row(rows[b]): its token (as
// sample_row_top_k_top_p_cpu), from logits (num_rows, vocab_size) fp32; other rows' tokens are left as
// they are. One block per row, no host synchronisation or allocation: safe inside a CUDA graph.
// vocab_size <= kMaxTopKTopPVocab.
void sample_top_k_top_p_cuda(int32_t* tokens, const float* logits, int num_rows, int vocab_size,
                             const SamplingRow* rows, cudaStream_t stream);

}  // namespace nanovllm
#endif
