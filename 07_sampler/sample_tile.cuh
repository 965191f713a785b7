// sample_tile.cuh: the sampler's device code that a GEMM's ending can run. sample_kernel (sampler.cu)
// reads its logits from memory; a GEMM that computes the logits (06_tensor_parallel's v6 with its sampling
// ending, linear_sample_cuda) can score each tile of them where it lies, in shared memory, and never write
// it: the LM head's 151,936 logits a row, 78 MB at 128 rows in fp32, neither written nor read back.
//
// A tile of rows x 128 vocabulary entries sees only part of each row, so a row's winner is found in two
// steps. Each tile merges its best (score, index) per row into one 64-bit key per row in global memory with
// atomicMax (pack_candidate: the key's unsigned order is `better`'s), and a last kernel turns the keys into
// tokens (sample_from_keys_cuda, sampler.cu). The same keys give each tile its bar: a tile starts from the
// keys other tiles have already written, so most of its entries are skipped with no exact score (below_bar),
// as sample_kernel's warps skip theirs against their own best so far.
//
// Measured against cuBLAS writing fp32 logits + sample_cuda (04_model_runner/NOTES.md, section 5, "The LM
// head with the sampler in its ending"): faster at 16-128 rows, not above.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "07_sampler/sampler.h"
#include "07_sampler/sampler_top_k_top_p.h"

namespace nanovllm {

// (score, index) pairs compare by score, then prefer the lower index (torch.argmax's first maximum).
__device__ inline bool better(float score, int index, float best_score, int best_index) {
  return score > best_score || (score == best_score && index < best_index);
}

// Gumbel noise never exceeds this: G(u) = -log(-log u) is largest at the largest u sampler_uniform gives,
// 1 - 2^-24, where it is 16.64.
constexpr float kMaxNoise = 16.7f;

// Which entries of a sampled row can be skipped without their exact score: those whose score l / T + G(u)
// is certainly below `bar`, a little under the best score seen so far (below_bar).
//
// The exact score costs a precise division and two precise logarithms, about 100 of the ~136 instructions
// an entry took (04_model_runner/NOTES.md, section 5). The bound costs a multiplication and two fast
// exponentials: G is increasing in u, so G(u) < g exactly when u < exp(-exp(-g)), and with g = bar - l / T
// that says the score is below the bar. An entry whose scaled logit is more than kMaxNoise under the bar
// is skipped without its random number (its pair is hashed only if the other entry of the pair needs it).
//
// Why it never skips a winner. The scaled logit is l * (1 / T), within 2 ulps of l / T; __expf is within a
// few parts in 10^6, so the threshold is within 2e-6 of exp(-exp(-g)) and kUniformMargin (1e-5) covers
// it; the exact score's own rounding (two logf, one addition: a few ulps of a value under 17 and of the
// score) is far inside the bar's margin below the best (1e-3 + 1e-4 |best|, prune_bar). An entry that is
// not skipped gets its exact score, so the token is the one the unpruned loop picks (tested against it:
// Ch07_SamplerCuda.PruningNeverChangesTheToken).
constexpr float kUniformMargin = 1e-5f;

__device__ inline float prune_bar(float best) { return best - (1e-3f + 1e-4f * fabsf(best)); }

// The bound for an entry whose 23 random bits are k (sampler_bits_of_entry): true when its score is
// certainly below the bar, g = bar - l / T being the noise the entry would need to reach it. (An entry
// that would need more than kMaxNoise is skipped before its pair is hashed.)
__device__ inline bool below_bar(float g, uint32_t k) {
  return uniform_of_bits(k) < __expf(-__expf(-g)) - kUniformMargin;  // G(u) < g, with room for the fast exponentials
}

// (score, index) as one 64-bit key whose unsigned order is better()'s: the score's bits made monotonic (a
// negative float's bits all flipped, so a larger magnitude sorts lower; a positive float's sign bit set, so
// it sorts above every negative one), then the complement of the index (the lower
// index wins a tie). -0 is made +0 first, since better() finds them equal. 0 is below every key: "no
// candidate yet".
__device__ inline unsigned long long pack_candidate(float score, int index) {
  const uint32_t bits = __float_as_uint(score == 0.0f ? 0.0f : score);
  const uint32_t ordered = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  return (uint64_t(ordered) << 32) | uint32_t(0xFFFFFFFFu - uint32_t(index));
}
__device__ inline float score_of_candidate(unsigned long long key) {
  const uint32_t ordered = uint32_t(key >> 32);
  return __uint_as_float(ordered & 0x80000000u ? ordered & 0x7FFFFFFFu : ~ordered);
}
__device__ inline int index_of_candidate(unsigned long long key) { return int(0xFFFFFFFFu - uint32_t(key)); }

// What a GEMM's sampling ending needs besides its tile (linear_sample_cuda's arguments).
struct TileSampling {
  const SamplingRow* rows;        // (n,) each row's settings
  unsigned long long* best_keys;  // (n,) the rows' best candidates so far (0: none); zero before the GEMM
  int* broken;                    // (n,) set to 1 where a row holds a NaN or +Inf; zero before the GEMM
  float* logits;                  // (n, vocab) written only for the rows that need them (below)
  int vocab;
  bool all_logits;                // write every row's logits, not only the top-k / top-p rows'
};

// The tile's rows that must be written as logits: top-k / top-p rows are sampled again from them by
// sample_top_k_top_p_cuda, which the Gumbel-max race over the whole row cannot replace.
__device__ inline bool tile_row_needs_logits(const SamplingRow& row, const TileSampling& s) {
  return s.all_logits || is_top_k_top_p_row(row, s.vocab);
}

// Scores a tile of logits held in shared memory: tile (ROWS, STRIDE) fp32, rows [row0, row0 + ROWS) of
// the batch (those >= n are padding) x vocabulary entries [col0, col0 + 128) (those >= vocab are past the
// vocabulary); rows (ROWS,) and seen (ROWS,) are the rows' settings and their keys when the block started,
// also in shared memory. Every thread of the block calls it. Per row it merges the tile's best candidate
// into s.best_keys (atomicMax), flags a NaN or +Inf in s.broken (the row's token is then -1, as
// sample_row_cpu's), and writes the row's logits where tile_row_needs_logits says so. Requires STRIDE even
// and >= 128 and `tile` 8-byte aligned (each lane reads float2 pairs), and blockDim.x a multiple of 32.
//
// The loop: 8 lanes a row, 4 rows a warp at a time; lane `sub` holds the row's 8 pairs of neighbouring
// entries 2 (sub + 8 m), m = 0..7. Greedy rows keep their largest logit. Sampled rows: the lane's 16
// scaled logits and their maximum a, the bar b from the row's key (or, for the blocks that start before
// any key is written, from each lane's largest entry scored exactly), and one threshold on the random
// bits that clears all 16 entries at once: an entry with bits k under floor(t 2^23 - 0.5), t = exp(-exp(
// -(b - a))) - kUniformMargin, is below_bar, since its own scaled logit is at most a. The lane hashes its
// 8 pairs (half a hash an entry, the part no bound avoids), and only the few entries whose bits reach the
// threshold are bounded one by one and, if they pass, scored exactly.
template <int ROWS, int STRIDE>
__device__ void sample_tile(const float* tile, const SamplingRow* rows, const unsigned long long* seen, int row0,
                            int n, int col0, const TileSampling& s) {
  static_assert(STRIDE % 2 == 0 && STRIDE >= 128, "a lane reads float2 pairs of a 128-entry tile row");
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32, warps = int(blockDim.x) / 32;
  const int sub = lane % 8;
  const bool whole_tile = col0 + 128 <= s.vocab;
  // Warp-uniform: a warp's 4 rows are rl - lane / 8 + 0..3, and every lane takes the same number of passes.
  for (int rl = warp * 4 + lane / 8; rl - lane / 8 < ROWS && row0 + rl - lane / 8 < n; rl += 4 * warps) {
    const int r = row0 + rl;
    const bool row_ok = r < n;
    const SamplingRow p = rows[rl];
    const bool greedy = samples_greedily(p.temperature), sampled = row_ok && !greedy;
    const float* trow = tile + rl * STRIDE;
    float2 v[8];
#pragma unroll
    for (int m = 0; m < 8; m++) v[m] = *reinterpret_cast<const float2*>(trow + 2 * (sub + 8 * m));
    auto column = [&](int m, int e) { return col0 + 2 * (sub + 8 * m) + e; };
    auto value = [&](int q) { return q % 2 ? v[q / 2].y : v[q / 2].x; };
    if (row_ok && tile_row_needs_logits(p, s))
#pragma unroll
      for (int q = 0; q < 16; q++)
        if (column(q / 2, q % 2) < s.vocab) s.logits[int64_t(r) * s.vocab + column(q / 2, q % 2)] = value(q);

    // A partial tile or a non-finite value (0 x is NaN for those, 0 otherwise): every entry checked, those
    // past the vocabulary made -Inf (never a candidate), a NaN or +Inf flagged.
    float poison = 0.0f;
#pragma unroll
    for (int m = 0; m < 8; m++) poison = fmaf(v[m].x, 0.0f, fmaf(v[m].y, 0.0f, poison));
    int non_finite = 0;
    if (row_ok && (!whole_tile || poison != 0.0f)) {
#pragma unroll
      for (int m = 0; m < 8; m++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float& x = e ? v[m].y : v[m].x;
          if (column(m, e) >= s.vocab) x = -INFINITY;
          else non_finite |= isnan(x) || x == INFINITY;
        }
    }
    float best = -INFINITY;
    int best_index = INT_MAX;
    if (row_ok && greedy) {
#pragma unroll
      for (int q = 0; q < 16; q++)
        if (value(q) != -INFINITY && better(value(q), column(q / 2, q % 2), best, best_index))
          best = value(q), best_index = column(q / 2, q % 2);
    }

    const float inverse_temperature = sampled ? 1.0f / p.temperature : 1.0f;
    float a_max = -INFINITY;
#pragma unroll
    for (int m = 0; m < 8; m++) a_max = fmaxf(a_max, fmaxf(v[m].x, v[m].y) * inverse_temperature);
    // seen may be stale (another block's atomicMax may land after this read): keys only grow, so an old key
    // gives a lower bar, which only prunes less, never a wrong token. Relaxed atomics suffice: the keys are
    // read as a whole only by the next kernel (tokens_from_keys_kernel).
    const unsigned long long seen_key = seen[rl];
    float bar = sampled && seen_key != 0 ? prune_bar(score_of_candidate(seen_key)) : -INFINITY;
    {
      // No key from other blocks yet: the exact score of each lane's largest logit, the best of the 8 lanes.
      float exact = -INFINITY;
      if (sampled && bar == -INFINITY && a_max != -INFINITY) {
        float x_max = value(0);
        int q_max = 0;  // (the value kept beside its position: v indexed by a variable would go to local memory)
#pragma unroll
        for (int q = 1; q < 16; q++)
          if (value(q) > x_max) x_max = value(q), q_max = q;
        exact = x_max / p.temperature + gumbel_noise(p.seed, p.step, uint32_t(column(q_max / 2, q_max % 2)));
      }
#pragma unroll
      for (int off = 1; off < 8; off <<= 1) exact = fmaxf(exact, __shfl_xor_sync(0xffffffffu, exact, off));
      if (sampled && bar == -INFINITY && exact != -INFINITY) bar = prune_bar(exact);
    }
    unsigned need = 0;  // bit q: entry q's bits reach the lane's threshold
    uint64_t z[8];      // the lane's 8 pair hashes, sampler_bits(seed, step, col0 / 2 + sub + 8 m)
    if (sampled && a_max != -INFINITY) {
      int k_clear = 0;
      if (bar != -INFINITY) {
        const float t = __expf(-__expf(-(bar - a_max))) - kUniformMargin;
        if (t > 0.0f) k_clear = __float2int_rd(t * 8388608.0f - 0.5f);
      }
      // sampler_bits (sampler.h) with the step's part hashed once: pair + 8 m's hash input is first's + 8 m
      // kGolden64. It must give sampler_bits(seed, step, col0 / 2 + sub + 8 m): change both together.
      const uint64_t first = p.seed + kGolden64 * (mix64(p.step) + 1 + uint64_t(uint32_t(col0 / 2 + sub)));
#pragma unroll
      for (int m = 0; m < 8; m++) {
        z[m] = mix64(first + uint64_t(m) * (8 * kGolden64));
        if (int(sampler_bits_of_entry(z[m], 0)) >= k_clear && v[m].x != -INFINITY) need |= 1u << (2 * m);
        if (int(sampler_bits_of_entry(z[m], 1)) >= k_clear && v[m].y != -INFINITY) need |= 2u << (2 * m);
      }
    }
#pragma unroll
    for (int q = 0; q < 16; q++)
      if (need >> q & 1) {
        const uint32_t k = sampler_bits_of_entry(z[q / 2], uint32_t(q % 2));
        if (below_bar(bar - value(q) * inverse_temperature, k)) continue;
        const float score = value(q) / p.temperature + -logf(-logf(uniform_of_bits(k)));
        if (better(score, column(q / 2, q % 2), best, best_index)) best = score, best_index = column(q / 2, q % 2);
      }
    // The row's best over its 8 lanes, merged into its key.
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, off);
      const int other_index = __shfl_xor_sync(0xffffffffu, best_index, off);
      if (better(other, other_index, best, best_index)) best = other, best_index = other_index;
    }
    if (row_ok && non_finite) atomicOr(s.broken + r, 1);
    if (row_ok && sub == 0 && best_index != INT_MAX && pack_candidate(best, best_index) > seen_key)
      atomicMax(s.best_keys + r, pack_candidate(best, best_index));
  }
}

}  // namespace nanovllm
