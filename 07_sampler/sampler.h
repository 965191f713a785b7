// sampler.h: from logits to the next token (nano-vllm: layers/sampler.py).
//
//   temperature 0      greedy: the argmax (lowest id on ties, as torch.argmax)
//   temperature T > 0  a categorical sample of softmax(logits / T), by the Gumbel-max trick:
//                      argmax_i (logits_i / T + g_i), g_i = -log(-log u_i), u_i uniform in (0, 1).
//                      nano-vllm writes the same thing as argmax_i p_i / E_i with E_i ~ Exp(1)
//                      (E = -log u, and log is monotonic): no softmax is needed at all.
//   top_k > 0          only the k largest logits compete (ties at the boundary: lowest ids first)
//   top_p < 1          only the smallest set of most likely tokens whose probability reaches top_p
//                      (after top-k), the token that crosses top_p included
//
// Random numbers are counter-based: u_i is a hash of (the request's seed, the index of the token being
// generated, i). A request therefore draws the same numbers whatever batch it lands in, whether it was
// preempted, and on CPU or GPU: a seeded run is reproducible, and its tokens do not depend on scheduling.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define SAMPLER_HD __host__ __device__
#else
#define SAMPLER_HD
#endif

namespace nanovllm {

// splitmix64's output function: a bijective mix of 64 bits (every input bit affects every output bit).
SAMPLER_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The 64 random bits of vocabulary entries 2 * pair and 2 * pair + 1 when generating the token at
// position `step` of a request with seed `seed`. Two entries share one hash: its 64 bits hold both
// entries' 23, and the hash's three 64-bit multiplications were most of what the GPU sampler's loop spent
// per entry (04_model_runner/NOTES.md, section 5).
// kGolden64 is 2^64 divided by the golden ratio, splitmix64's increment: its multiples (a Weyl sequence) spread
// neighbouring pairs' hash inputs over all 64 bits before mix64 scrambles them. sample_tile.cuh computes the same
// bits with the step's part hashed once: a change here must be made there too
// (Ch06_LinearCuda.SampleInTheEndingMatchesCpuOverItsOwnLogits compares the two).
constexpr uint64_t kGolden64 = 0x9e3779b97f4a7c15ull;
SAMPLER_HD inline uint64_t sampler_bits(uint64_t seed, uint64_t step, uint32_t pair) {
  return mix64(seed + kGolden64 * (mix64(step) + pair + 1));
}

// Entry i's 23 random bits k within its pair's hash z: bits 41-63 for the even entry, 18-40 for the odd one.
SAMPLER_HD inline uint32_t sampler_bits_of_entry(uint64_t z, uint32_t index) {
  return uint32_t(index % 2 == 0 ? z >> 41 : (z >> 18) & 0x7fffff);
}

// k mapped to (k + 0.5) / 2^23, in the open interval (0, 1). 23 bits, not 24: k + 0.5 then has at most 24
// significant bits and is exact in fp32. With 24 bits, 16777215 + 0.5 rounds to 16777216 and u = 1.0
// exactly, once in 2^24 draws: Gumbel noise +inf, and that token wins whatever its logit (about 1 step in
// 110 over a 151,936-token vocabulary).
SAMPLER_HD inline float uniform_of_bits(uint32_t k) { return (float(k) + 0.5f) * (1.0f / 8388608.0f); }

// The uniform number for vocabulary entry `index` when generating the token at position `step` of a
// request with seed `seed`.
SAMPLER_HD inline float sampler_uniform(uint64_t seed, uint64_t step, uint32_t index) {
  return uniform_of_bits(sampler_bits_of_entry(sampler_bits(seed, step, index / 2), index));
}

// Gumbel(0, 1) noise: -log(-log u).
SAMPLER_HD inline float gumbel_noise(uint64_t seed, uint64_t step, uint32_t index) {
  return -logf(-logf(sampler_uniform(seed, step, index)));
}

// Temperatures below 1e-5 sample greedily (the argmax). logits / T must stay finite: at T = 1e-40 every
// positive logit would be +inf, and the first of them would win wherever the argmax is; from 1e-5 up, a
// logit would need |l| > 3.4e33 to overflow. Nothing is lost: the Gumbel noise spans less than 19.5
// (u is in [2^-24, 1 - 2^-24]), so at T < 1e-5 only tokens within 2e-4 of the maximum logit could win,
// a difference below the precision the logits are computed to (bf16 weights).
SAMPLER_HD inline bool samples_greedily(float temperature) { return temperature < 1e-5f; }

// Per-row sampling settings.
struct SamplingRow {
  float temperature;  // 0 = greedy (so is anything below 1e-5: samples_greedily)
  int top_k;          // 0 = off
  float top_p;        // 1 = off
  uint64_t seed;
  uint64_t step;      // index of the token being generated (the sequence's length before it)
};

// Picks one token from one row of `vocab_size` logits; -1 when the row holds a NaN or its maximum is not
// finite (the engine fails the step rather than emit a token from broken logits; -Inf entries are fine).
int32_t sample_row_cpu(const float* logits, int vocab_size, const SamplingRow& row);

// Batched: tokens[b] = sample_row_cpu(logits + b * vocab_size, vocab_size, rows[b]).
void sample_cpu(int32_t* tokens, const float* logits, int num_rows, int vocab_size, const SamplingRow* rows);

}  // namespace nanovllm

// CUDA (sampler.cu): every row, the same random numbers as the CPU. Greedy and temperature rows by
// sample_kernel (up to 8 blocks per row, a thread-block cluster, when the rows alone leave SMs idle); rows asking for top-k or top-p by sample_top_k_top_p_kernel
// (sampler_top_k_top_p.cu: radix select, no sort), which writes -1 for a row with a NaN or an infinite
// maximum. No host synchronisation or allocation: safe inside a CUDA graph. prune (the default) lets
// sample_kernel skip the exact score of entries that provably cannot win (sampler.cu, below_bar): the same
// tokens in 41% of the time at 256 rows (177 -> 72.7 µs a step on an H200, `bench-step --random qwen3-0.6b
// --batch 256`; 04_model_runner/NOTES.md, sections 5 and 13); false scores every entry, the loop of
// sample_row_cpu.
#ifdef NANOVLLM_CUDA
#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

// tokens (num_rows,) <- one id a row, -1 for a row whose logits hold a NaN or have no finite maximum; logits
// (num_rows, vocab_size) fp32 and rows (num_rows,) in device memory. Queued on `stream`; no host sync.
void sample_cuda(int32_t* tokens, const float* logits, int num_rows, int vocab_size, const SamplingRow* rows,
                 cudaStream_t stream, bool prune = true);

// The second half of sampling inside a GEMM (sample_tile.cuh; 06_tensor_parallel's linear_sample_cuda is the
// first): tokens (num_rows,) from the rows' keys best_keys (num_rows,), -1 where broken (num_rows,) is set or
// a row has no candidate, then keys and flags zeroed for the next call; then the rows asking for top-k or
// top-p sampled again from their logits (num_rows, vocab_size), which the GEMM wrote for them.
void sample_from_keys_cuda(int32_t* tokens, unsigned long long* best_keys, int* broken, const float* logits,
                           int num_rows, int vocab_size, const SamplingRow* rows, cudaStream_t stream);

}  // namespace nanovllm
#endif
