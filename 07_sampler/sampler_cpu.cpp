// sampler_cpu.cpp: the reference sampler (nano-vllm: layers/sampler.py).
#include <algorithm>
#include <numeric>
#include <vector>

#include "07_sampler/sampler.h"

namespace nanovllm {

int32_t sample_row_cpu(const float* logits, int vocab_size, const SamplingRow& row) {
  // A NaN, or a maximum that is not finite (+Inf, or every entry -Inf): no token is right, and sorting
  // NaN is undefined. -Inf alone is a masked entry.
  float max_logit = -INFINITY;
  for (int i = 0; i < vocab_size; i++) {
    if (std::isnan(logits[i])) return -1;
    max_logit = std::max(max_logit, logits[i]);
  }
  if (!std::isfinite(max_logit)) return -1;
  if (samples_greedily(row.temperature)) {  // greedy: first index of the maximum
    int best = 0;
    for (int i = 1; i < vocab_size; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }

  // Candidates, most likely first (only needed when top-k or top-p cut the list).
  std::vector<int> candidates;
  const bool filtered = (row.top_k > 0 && row.top_k < vocab_size) || row.top_p < 1.0f;
  if (filtered) {
    candidates.resize(size_t(vocab_size));
    std::iota(candidates.begin(), candidates.end(), 0);
    std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    if (row.top_k > 0 && row.top_k < vocab_size) candidates.resize(size_t(row.top_k));
    if (row.top_p < 1.0f) {
      // Probabilities of the kept candidates, renormalised over them, accumulated until top_p is reached.
      double max_scaled = double(logits[candidates[0]]) / row.temperature, total = 0;  // the top token: q = 1
      std::vector<double> p(candidates.size());
      for (size_t i = 0; i < candidates.size(); i++) {
        p[i] = std::exp(double(logits[candidates[i]]) / row.temperature - max_scaled);
        total += p[i];
      }
      double cumulative = 0;
      size_t keep = candidates.size();
      for (size_t i = 0; i < candidates.size(); i++) {
        cumulative += p[i] / total;
        if (cumulative >= row.top_p) {
          keep = i + 1;
          break;
        }
      }
      candidates.resize(keep);
    }
  }

  // Gumbel-max over the candidates (or the whole vocabulary).
  int best = -1;
  float best_score = -INFINITY;
  auto consider = [&](int i) {
    float score = logits[i] / row.temperature + gumbel_noise(row.seed, row.step, uint32_t(i));
    if (best < 0 || score > best_score) best = i, best_score = score;
  };
  if (filtered) {
    for (int i : candidates) consider(i);
  } else {
    for (int i = 0; i < vocab_size; i++) consider(i);
  }
  return best;
}

void sample_cpu(int32_t* tokens, const float* logits, int num_rows, int vocab_size, const SamplingRow* rows) {
  for (int b = 0; b < num_rows; b++) tokens[b] = sample_row_cpu(logits + int64_t(b) * vocab_size, vocab_size, rows[b]);
}

}  // namespace nanovllm
