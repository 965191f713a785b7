// sampler_top_k_top_p_cpu.cpp: sample_top_k_top_p_kernel's algorithm on one thread, pass for pass: the
// same keys, masses, histograms and digit choices, with plain loops where the kernel has 1024 threads,
// atomics and scans. Tests run it without a GPU against sample_row_cpu, the definition.
#include <algorithm>
#include <cmath>

#include "07_sampler/sampler_top_k_top_p.h"

namespace nanovllm {

namespace {

// hist (256,) <- the digit at `shift` of the logits (vocab_size,) of `set` (keys above set.threshold,
// and set.ties of those equal to it) whose keys match `prefix` above `shift`: counted, or weighed by
// their masses when `with_mass`. The kernel's build_histograms.
void build_histogram(Mass* hist, const float* logits, int vocab_size, KeptSet set, uint32_t prefix, int shift,
                     bool with_mass, float max_logit, float temperature) {
  std::fill(hist, hist + kRadixBins, Mass(0));
  for (int i = 0; i < vocab_size; i++) {
    const uint32_t key = logit_key(logits[i]);
    if (key > set.threshold && key_matches(key, prefix, shift))
      hist[key_digit(key, shift)] += with_mass ? logit_mass(logits[i], max_logit, temperature) : 1;
  }
  // The ties of `set` all have one key, so they go to one bin together: no need to rank them here.
  if (set.ties > 0 && key_matches(set.threshold, prefix, shift)) {
    const Mass each = with_mass ? logit_mass(key_logit(set.threshold), max_logit, temperature) : 1;
    hist[key_digit(set.threshold, shift)] += set.ties * each;
  }
}

}  // namespace

KeptSet top_k_top_p_kept_cpu(const float* logits, int vocab_size, const SamplingRow& row) {
  uint32_t max_key = 0;
  for (int i = 0; i < vocab_size; i++) max_key = std::max(max_key, logit_key(logits[i]));
  const float max_logit = key_logit(max_key);
  Mass hist[kRadixBins];  // (256,)

  // Top-k: the k-th largest key, and k minus the count of keys above it = the ties kept.
  KeptSet kept{0, 0};  // every logit
  if (row.top_k > 0 && row.top_k < vocab_size) {
    uint32_t prefix = 0;
    Mass want = Mass(row.top_k);
    for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
      build_histogram(hist, logits, vocab_size, KeptSet{0, 0}, prefix, shift, false, max_logit, row.temperature);
      const DigitChoice c = select_digit<Mass>(hist, 0, kRadixBins, want);
      prefix |= uint32_t(c.digit) << shift;
      want = c.remaining;
    }
    kept = {prefix, uint32_t(want)};
  }

  // Top-p over the top-k set: the key where the running mass reaches ceil(top_p * Z), and as many
  // logits equal to it as the remaining mass needs (they all weigh the same).
  if (row.top_p < 1.0f) {
    uint32_t prefix = 0;
    Mass want = 0;
    for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
      build_histogram(hist, logits, vocab_size, kept, prefix, shift, true, max_logit, row.temperature);
      if (shift == 32 - kRadixBits) {
        Mass total = 0;  // Z
        for (Mass h : hist) total += h;
        want = top_p_target(row.top_p, total);
      }
      const DigitChoice c = select_digit<Mass>(hist, 0, kRadixBins, want);
      prefix |= uint32_t(c.digit) << shift;
      want = c.remaining;
    }
    const Mass each = logit_mass(key_logit(prefix), max_logit, row.temperature);  // > 0: its bin had mass
    kept = {prefix, uint32_t((want + each - 1) / each)};
  }
  return kept;
}

int32_t sample_row_top_k_top_p_cpu(const float* logits, int vocab_size, const SamplingRow& row) {
  float max_logit = -INFINITY;
  for (int i = 0; i < vocab_size; i++) {
    if (std::isnan(logits[i])) return -1;
    max_logit = std::max(max_logit, logits[i]);
  }
  if (!std::isfinite(max_logit)) return -1;  // +inf, or every logit -inf

  const KeptSet kept = top_k_top_p_kept_cpu(logits, vocab_size, row);
  // Gumbel-max in index order, the ties at the threshold kept while their rank is below kept.ties. A tie
  // of scores goes to the larger key, then the lower id: the first of the two in sample_row_cpu's sorted
  // order, which is the order it considers its candidates in.
  int32_t best = -1;
  float best_score = -INFINITY;
  uint32_t best_key = 0, rank = 0;
  for (int i = 0; i < vocab_size; i++) {
    const uint32_t key = logit_key(logits[i]);
    if (key < kept.threshold) continue;
    if (key == kept.threshold && rank++ >= kept.ties) continue;
    const float score = logits[i] / row.temperature + gumbel_noise(row.seed, row.step, uint32_t(i));
    if (best < 0 || score > best_score || (score == best_score && key > best_key))
      best = i, best_score = score, best_key = key;
  }
  return best;
}

}  // namespace nanovllm
