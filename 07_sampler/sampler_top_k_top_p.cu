// sampler_top_k_top_p.cu: top-k and top-p sampling on the GPU, one block of 1024 threads per row.
//
// sample_row_cpu (the definition) sorts the vocabulary, cuts the sorted list, and draws among what is
// left. Sorting 151,936 logits per row on the GPU is possible but heavy; this kernel never sorts. The kept
// set is a prefix of the sorted order, so it is enough to find where that prefix ends: the threshold key
// t and how many logits equal to t are kept (lowest ids first), a KeptSet (sampler_top_k_top_p.h). It is
// found by radix select: the threshold's 32-bit key is built 8 bits at a time, most significant first,
// each from a 256-bin histogram of the keys that match the digits found so far.
//
// Passes over the row (every pass reads the row's logits from global memory, L2 when it fits):
//   1   the largest key (NaN or an infinite maximum: token -1) and, for top-k, the histogram of digit 3
//   2-4 top-k: histograms of counts for digits 2, 1, 0 -> top-k's threshold and ties
//   5-8 top-p: histograms of counts and masses (Q = exp((x - max) / T) in 64-bit fixed point) over the
//       top-k set, for digits 3, 2, 1, 0; pass 5's total mass Z (the top-k set's masses, summed over
//       digit 3's bins) gives the target ceil(top_p * Z)
//   9   only when the kept ties are fewer than the logits equal to the threshold: count them per warp,
//       so that each can be given its rank in index order
//   10  Gumbel-max over the kept logits: the same score logits[i] / T + gumbel_noise(seed, step, i) as
//       sample_row_cpu, so the same token whenever the kept set is the same
// Top-k only skips 5-8, top-p only skips 2-4 and digit 3's histogram in pass 1.
//
// Worked example: vocab 8, T = 1, top_k = 5, top_p = 0.8.
//   id        0     1     2     3     4     5     6     7
//   logit    2.0   0.5   3.0   0.5  -1.0   0.5   1.0   3.0
//   key     c0000000 bf000000 c0400000 bf000000 407fffff bf000000 bf800000 c0400000   (logit_key)
//   sample_row_cpu sorts ids as 2 7 0 6 1 3 5 4, keeps 2 7 0 6 1 (top-k 5: of the three 0.5s, id 1),
//   then q = exp(x - 3) = 1 1 .368 .135 .082, Z = 2.585, 0.8 Z = 2.068 is reached at id 0: keeps 2 7 0.
//   Top-k, want 5 logits:
//     digit 3 (key >> 24): bin c0 holds 3 (ids 0 2 7), bf holds 4 (1 3 5 6), 40 holds 1. From the top:
//       3 < 5, then 3 + 4 >= 5: digit bf, still 5 - 3 = 2 to take among keys bf......
//     digit 2 among bf......: bin 80 holds 1 (id 6), bin 00 holds 3 (1 3 5): 1 < 2, 1 + 3 >= 2: digit 00,
//       1 left. Digits 1 and 0 leave the three 0.5s together: threshold bf000000, ties 1.
//     Top-k set: keys above bf000000 (ids 0 2 6 7) and the first 1 tie (id 1).
//   Top-p over that set, masses in units of 2^-44 (here as decimals):
//     digit 3: bin c0 weighs 1 + 1 + .368 (ids 2 7 0), bin bf weighs .135 (id 6) + 1 tie x .082 (added
//       once, not by ranking the ties). Z = 2.585, target .8 Z = 2.068: bin c0 reaches it, 2.068 left.
//     digit 2 among c0......: bin 40 weighs 2 (ids 2 7) < 2.068, bin 00 .368 (id 0): 2 + .368 >= 2.068,
//       .068 left. Digits 1 and 0 single out 2.0: threshold c0000000, ceil(.068 / .368) = 1 tie.
//   Kept: ids 2 7 (keys above c0000000) and id 0 (the one tie): as sample_row_cpu. Gumbel-max over them.
//
// Histograms hold integers only (counts, and masses in fixed point), filled by shared-memory atomics: the
// totals do not depend on the order of the atomics, so the kernel is deterministic. Lanes of a warp that
// add to the same bin are combined first (add_to_histograms): the top digit of most logits is one of a
// few bins (it is the sign and 7 exponent bits), and 32 atomics on one address would be serialised.
//
// Tie ranks. Each warp owns a contiguous chunk of the vocabulary and reads it 32 consecutive logits at a
// time, so index order is: warp by warp, then step by step, then lane by lane. A tie's rank is the ties
// in earlier warps' chunks (pass 9, a scan over 32 counts) plus the ties earlier in its own chunk (a
// running count and a ballot). A tie is kept when its rank is below KeptSet::ties.
//
// Where it can differ from sample_row_cpu: (1) the masses are rounded to 2^-44 and summed exactly, while
// the CPU sums doubles: when a cumulative sum is within rounding error of top_p * Z (at worst 2^-45 per
// token: 4e-9 of the largest mass for 151,936 tokens), the two can cut after different tokens. (2) The
// GPU's logf may differ from the host's by an ulp, so two Gumbel scores within an ulp can be ordered
// differently (as in sample_kernel). Rows with a NaN or an infinite maximum give -1 here, as on the CPU
// (sampler.h).
//
// Cost: up to 10 reads of the row (600 KB for Qwen3's 151,936 tokens) and a double-precision exp per
// counted logit in each of passes 5-8 (the whole top-k set in pass 5, those matching the prefix after), fast on an H100/H200 (FP64 at half the FP32 rate), about 30x slower on consumer GPUs
// (1/64 rate). Not yet measured. nvcc -Xptxas -v, sm_90: 56 registers (the limit at 1024 threads is 64),
// no spills, 3,616 bytes of shared memory.
//
// The CPU mirror of this kernel, pass for pass, is sampler_top_k_top_p_cpu.cpp.
#include <climits>

#include "07_sampler/sampler_top_k_top_p.h"

namespace nanovllm {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;                 // 32: one warp-0 lane per warp in block reductions
constexpr int kBinsPerLane = kRadixBins / 32;         // 8: warp 0 scans the 256 bins, 8 per lane
constexpr unsigned kFullMask = 0xffffffffu;

// What one block keeps in shared memory (3,616 bytes).
struct Shared {
  uint32_t counts[kRadixBins];  // (256,) how many keys of the current pass have each digit
  Mass masses[kRadixBins];      // (256,) their total mass (top-p passes only)
  DigitChoice choice;           // the digit chosen after a pass (written by one lane of warp 0)
  Mass target;                  // top-p: ceil(top_p * Z)
  uint32_t max_key;             // pass 1: the largest key
  uint32_t warp_ties[kWarps];   // (32,) pass 9: ties at the threshold in each warp's chunk
  float best_score[kWarps];     // (32,) pass 10: each warp's winner
  uint32_t best_key[kWarps];
  int best_index[kWarps];
};

// What every pass needs to know about the row.
struct Row {
  const float* logits;  // (vocab_size,)
  int begin, end;       // this warp's chunk [begin, end)
  float max_logit;      // the largest logit (after pass 1)
  float temperature;
};

// ---------------------------------------------------------------------------------------------------
// Histograms

// Adds (1, q) to (counts[bin], masses[bin]) for every lane with `active` (masses only when `with_mass`).
// One round per distinct bin among the active lanes: the lowest pending lane leads, the lanes with its
// bin join, the leader adds their count and mass with one atomic each. Called by whole warps (the loop
// condition is a ballot, the same on every lane).
__device__ void add_to_histograms(Shared& s, int bin, Mass q, bool active, bool with_mass) {
  const int lane = threadIdx.x % 32;
  unsigned pending = __ballot_sync(kFullMask, active);
  while (pending != 0) {
    const int leader = __ffs(pending) - 1;
    const int leader_bin = __shfl_sync(kFullMask, bin, leader);
    const bool member = active && bin == leader_bin;
    const unsigned group = __ballot_sync(kFullMask, member);
    if (with_mass) {
      Mass sum = member ? q : 0;
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (lane == leader) atomicAdd(&s.masses[leader_bin], sum);
    }
    if (lane == leader) atomicAdd(&s.counts[leader_bin], uint32_t(__popc(group)));
    pending &= ~group;
  }
}

// Clears the histograms, then fills them with the digit at `shift` of the logits of `set` (keys above
// set.threshold, and the first set.ties equal to it) whose keys match `prefix` above `shift`; with
// masses when `with_mass`. On return (after a barrier) the histograms are complete.
__device__ void build_histograms(Shared& s, const Row& r, KeptSet set, uint32_t prefix, int shift, bool with_mass) {
  __syncthreads();  // every thread is done reading the previous pass's histograms and choice
  if (threadIdx.x < kRadixBins) s.counts[threadIdx.x] = 0, s.masses[threadIdx.x] = 0;
  __syncthreads();  // cleared before any thread adds
  const int lane = threadIdx.x % 32;
  for (int base = r.begin; base < r.end; base += 32) {  // warp-uniform: the whole warp runs every step
    const int i = base + lane;
    const bool in = i < r.end;
    const float x = in ? r.logits[i] : 0.0f;
    const uint32_t key = logit_key(x);
    const bool counted = in && key > set.threshold && key_matches(key, prefix, shift);
    const Mass q = with_mass && counted ? logit_mass(x, r.max_logit, r.temperature) : 0;
    add_to_histograms(s, key_digit(key, shift), q, counted, with_mass);
  }
  // The ties of `set` all have one key, so they go to one bin together: no need to rank them here.
  if (threadIdx.x == 0 && set.ties > 0 && key_matches(set.threshold, prefix, shift)) {
    const int bin = key_digit(set.threshold, shift);
    atomicAdd(&s.counts[bin], set.ties);
    if (with_mass) atomicAdd(&s.masses[bin], Mass(set.ties) * logit_mass(key_logit(set.threshold), r.max_logit, r.temperature));
  }
  __syncthreads();  // every thread's atomics are in: the histograms are complete
}

// ---------------------------------------------------------------------------------------------------
// Choosing a digit: warp 0 scans the 256 bins, largest keys first

// The digit of the threshold (select_digit over all 256 bins of `hist`, 0 < want <= their total), for
// the whole block. Lane j of warp 0 sums bins 255 - 8j down to 248 - 8j (lane 0: the largest keys); an
// inclusive scan over the lanes gives each lane the total of its bins and all bins above; the one lane
// where the running total first reaches `want` finishes with select_digit over its 8 bins.
template <class T>
__device__ DigitChoice choose_digit(Shared& s, const T* hist, T want) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int first = kRadixBins - kBinsPerLane * (lane + 1);  // lane 0: 248, lane 31: 0
    T own = 0;
#pragma unroll
    for (int b = 0; b < kBinsPerLane; b++) own += hist[first + b];
    T through = own;  // own bins and every bin above them
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const T other = __shfl_up_sync(kFullMask, through, offset);
      if (lane >= offset) through += other;
    }
    const T above = through - own;
    if (above < want && want <= through) {
      s.choice = select_digit<T>(hist, first, kBinsPerLane, T(want - above));
    }
  }
  __syncthreads();  // the crossing lane has written the choice
  return s.choice;
}

// The total of the 256 bins of `hist`, on warp 0 (lane 0 holds it).
__device__ Mass histogram_total(const Mass* hist) {
  const int lane = threadIdx.x % 32;
  Mass total = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerLane; b++) total += hist[lane * kBinsPerLane + b];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(kFullMask, total, offset);
  return total;
}

// ---------------------------------------------------------------------------------------------------
// The final draw

// Gumbel-max order: the higher score; on an exact tie, the larger key, then the lower id (the first of
// the two in sample_row_cpu's sorted order, the one it keeps).
__device__ bool better(float score, uint32_t key, int index, float best_score, uint32_t best_key, int best_index) {
  if (score != best_score) return score > best_score;
  if (key != best_key) return key > best_key;
  return index < best_index;
}

// ---------------------------------------------------------------------------------------------------
// The kernel

// tokens (num_rows,) <- one token per row that is_top_k_top_p_row; logits (num_rows, vocab_size) fp32;
// rows (num_rows,). One block of kThreads per row; rows it does not own return at once.
__global__ void __launch_bounds__(kThreads)
sample_top_k_top_p_kernel(int32_t* tokens, const float* logits, int vocab_size, const SamplingRow* rows) {
  wait_for_previous_kernel();  // launched overlapped: nothing the previous kernel writes is read before this
  allow_next_kernel();
  const SamplingRow row = rows[blockIdx.x];
  if (!is_top_k_top_p_row(row, vocab_size)) return;  // sample_kernel's token stands
  const bool top_k = row.top_k > 0 && row.top_k < vocab_size;
  const bool top_p = row.top_p < 1.0f;
  __shared__ Shared s;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // This warp's chunk: ceil(vocab / 1024) * 32 logits, a multiple of 32 so that 32 of them cover the row.
  // Vocab 151,936: 149 * 32 = 4,768 per warp, the last gets 151,936 - 31 * 4,768 = 4,128.
  const int chunk = (vocab_size + kThreads - 1) / kThreads * 32;
  Row r;
  r.logits = logits + int64_t(blockIdx.x) * vocab_size;
  r.begin = min(vocab_size, warp * chunk);
  r.end = min(vocab_size, r.begin + chunk);
  r.temperature = row.temperature;

  // Pass 1: the largest key, any NaN, and for top-k the counts of digit 3.
  if (threadIdx.x < kRadixBins) s.counts[threadIdx.x] = 0;
  if (threadIdx.x == 0) s.max_key = 0;
  __syncthreads();  // cleared before any thread adds
  uint32_t max_key = 0;
  bool nan = false;
  for (int base = r.begin; base < r.end; base += 32) {
    const int i = base + lane;
    const bool in = i < r.end;
    const float x = in ? r.logits[i] : 0.0f;
    const uint32_t key = logit_key(x);
    nan |= in && isnan(x);
    if (in) max_key = max(max_key, key);
    if (top_k) add_to_histograms(s, key_digit(key, 24), 0, in, false);
  }
  max_key = __reduce_max_sync(kFullMask, max_key);
  if (lane == 0) atomicMax(&s.max_key, max_key);
  const bool any_nan = __syncthreads_or(nan);  // also the barrier after which max_key and counts are complete
  r.max_logit = key_logit(s.max_key);
  if (any_nan || !isfinite(r.max_logit)) {  // NaN anywhere, +inf, or every logit -inf: no distribution
    if (threadIdx.x == 0) tokens[blockIdx.x] = -1;
    return;
  }

  // Passes 2-4, top-k: the k-th largest key, and k minus the count of keys above it = the ties kept.
  KeptSet kept{0, 0};  // every logit
  uint32_t equal = 0;  // how many logits of the row have the key kept.threshold
  if (top_k) {
    uint32_t prefix = 0, want = uint32_t(row.top_k);
    for (int shift = 24; shift >= 0; shift -= kRadixBits) {
      if (shift != 24) build_histograms(s, r, KeptSet{0, 0}, prefix, shift, false);  // digit 3: pass 1
      const DigitChoice c = choose_digit<uint32_t>(s, s.counts, want);
      prefix |= uint32_t(c.digit) << shift;
      want = uint32_t(c.remaining);
      if (shift == 0) equal = s.counts[c.digit];
    }
    kept = {prefix, want};
  }

  // Passes 5-8, top-p over the top-k set: the key where the running mass reaches ceil(top_p * Z), and
  // as many logits equal to it as the remaining mass needs (they all weigh the same).
  if (top_p) {
    uint32_t prefix = 0;
    Mass want = 0;
    uint32_t equal_p = 0;
    for (int shift = 24; shift >= 0; shift -= kRadixBits) {
      build_histograms(s, r, kept, prefix, shift, true);
      if (shift == 24) {
        const Mass total = threadIdx.x < 32 ? histogram_total(s.masses) : 0;
        if (threadIdx.x == 0) s.target = top_p_target(row.top_p, total);
        __syncthreads();  // the target is written
        want = s.target;
      }
      const DigitChoice c = choose_digit<Mass>(s, s.masses, want);
      prefix |= uint32_t(c.digit) << shift;
      want = c.remaining;
      if (shift == 0) equal_p = s.counts[c.digit];
    }
    const Mass each = logit_mass(key_logit(prefix), r.max_logit, r.temperature);  // > 0: its bin had mass
    // If the threshold is top-k's, its bin held the kept.ties added by build_histograms, not the row's count.
    if (!(top_k && prefix == kept.threshold)) equal = equal_p;
    kept = {prefix, uint32_t((want + each - 1) / each)};
  }

  // Pass 9, only when some logits equal to the threshold are left out: ties in the warps before this one.
  uint32_t tie_limit = UINT_MAX;  // every tie kept
  uint32_t ties_before = 0;       // ties at lower ids than the current step of this warp's chunk
  // Block-uniform: kept and equal come from shared memory after a barrier, the same in every thread, so
  // the barrier inside is reached by all threads or none.
  if (kept.ties < equal) {
    uint32_t mine = 0;  // the same on every lane: a sum of ballots
    for (int base = r.begin; base < r.end; base += 32) {
      const int i = base + lane;
      const bool in = i < r.end;
      const float x = in ? r.logits[i] : 0.0f;
      mine += __popc(__ballot_sync(kFullMask, in && logit_key(x) == kept.threshold));
    }
    if (lane == 0) s.warp_ties[warp] = mine;
    __syncthreads();  // every warp's count is written
    ties_before = lane < warp ? s.warp_ties[lane] : 0;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) ties_before += __shfl_xor_sync(kFullMask, ties_before, offset);
    tie_limit = kept.ties;
  }

  // Pass 10: Gumbel-max over the kept logits.
  float best_score = -INFINITY;
  uint32_t best_key = 0;
  int best_index = INT_MAX;
  for (int base = r.begin; base < r.end; base += 32) {
    const int i = base + lane;
    const bool in = i < r.end;
    const float x = in ? r.logits[i] : 0.0f;
    const uint32_t key = logit_key(x);
    const bool tie = in && key == kept.threshold;
    const unsigned ties = __ballot_sync(kFullMask, tie);
    const uint32_t rank = ties_before + __popc(ties & ((1u << lane) - 1));  // ties at lower ids
    ties_before += __popc(ties);
    if (in && (key > kept.threshold || (tie && rank < tie_limit))) {
      const float score = x / row.temperature + gumbel_noise(row.seed, row.step, uint32_t(i));
      if (better(score, key, i, best_score, best_key, best_index)) best_score = score, best_key = key, best_index = i;
    }
  }
  // Reduce over the warp, then over the warps' winners.
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o_score = __shfl_xor_sync(kFullMask, best_score, offset);
    const uint32_t o_key = __shfl_xor_sync(kFullMask, best_key, offset);
    const int o_index = __shfl_xor_sync(kFullMask, best_index, offset);
    if (better(o_score, o_key, o_index, best_score, best_key, best_index))
      best_score = o_score, best_key = o_key, best_index = o_index;
  }
  if (lane == 0) s.best_score[warp] = best_score, s.best_key[warp] = best_key, s.best_index[warp] = best_index;
  __syncthreads();  // every warp's winner is written
  if (warp != 0) return;
  best_score = s.best_score[lane], best_key = s.best_key[lane], best_index = s.best_index[lane];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o_score = __shfl_xor_sync(kFullMask, best_score, offset);
    const uint32_t o_key = __shfl_xor_sync(kFullMask, best_key, offset);
    const int o_index = __shfl_xor_sync(kFullMask, best_index, offset);
    if (better(o_score, o_key, o_index, best_score, best_key, best_index))
      best_score = o_score, best_key = o_key, best_index = o_index;
  }
  if (lane == 0) tokens[blockIdx.x] = best_index;  // never INT_MAX: the most likely logit is always kept
}

}  // namespace

void sample_top_k_top_p_cuda(int32_t* tokens, const float* logits, int num_rows, int vocab_size,
                             const SamplingRow* rows, cudaStream_t stream) {
  if (num_rows == 0) return;
  if (vocab_size < 1 || vocab_size > kMaxTopKTopPVocab)
    fail("sample_top_k_top_p_cuda: vocab_size ", vocab_size, " outside [1, ", kMaxTopKTopPVocab,
         "] (the fixed-point masses of a row must sum below 2^63)");
  launch_overlapped(sample_top_k_top_p_kernel, num_rows, kThreads, 0, stream, tokens, logits, vocab_size, rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
