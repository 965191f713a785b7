// sampler_test_inputs.h: what the CPU and GPU top-k/top-p tests share: logits with and without exact
// ties, a grid of sampling settings, and the kept set by definition (sample_row_cpu's stable sort,
// restated) next to the kept set a KeptSet describes.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "01_sequence/base/bf16.h"
#include "07_sampler/sampler_top_k_top_p.h"
#include "tests/test_util.h"

namespace nanovllm::test {

// A bell-shaped value with standard deviation `scale` (a sum of 4 uniforms: reproducible bit for bit).
inline float bell(Rng& rng, float scale) {
  float sum = 0;
  for (int j = 0; j < 4; j++) sum += rng.uniform(-1, 1);
  return sum * scale * 0.8660254f;  // a uniform on [-1, 1) has variance 1/3: 4 of them, 4/3
}

// (n,) logits rounded to bf16 (8 significant bits), as a bf16 LM head would give: a few exact ties.
inline std::vector<float> bf16_logits(size_t n, Rng& rng, float scale = 3.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(bell(rng, scale)));
  return v;
}

// (n,) logits rounded to multiples of `step`: a few dozen values, each shared by many ids, so that top-k
// and top-p boundaries fall inside groups of ties and lowest-id-first decides. Small negatives round to
// -0.0, which must tie with +0.0.
inline std::vector<float> quantised_logits(size_t n, Rng& rng, float scale = 2.0f, float step = 0.5f) {
  std::vector<float> v(n);
  for (float& x : v) x = std::round(bell(rng, scale) / step) * step;
  return v;
}

// The settings grid, one row each: greedy (also with top-k/top-p, which it ignores, and at a temperature
// below 1e-5, which samples greedily); temperature only
// (also top_k = vocab, which is off); top-k only, k in {1, 2, 50, vocab - 1}; top-p only, p in {0.01,
// 0.5, 0.9, 0.999}; both. Seeds and steps differ from row to row.
inline std::vector<SamplingRow> settings_grid(int vocab, Rng& rng) {
  std::vector<SamplingRow> rows;
  auto add = [&](float temperature, int top_k, float top_p) {
    rows.push_back({temperature, top_k, top_p, rng.next(), rng.next() % 4096});
  };
  add(0.0f, 0, 1.0f);
  add(0.0f, 50, 0.9f);
  add(1e-10f, 50, 0.9f);  // below 1e-5: greedy too (samples_greedily)
  add(0.7f, 0, 1.0f);
  add(1.3f, vocab, 1.0f);
  for (float temperature : {0.6f, 1.0f}) {
    for (int k : {1, 2, 50, vocab - 1}) add(temperature, k, 1.0f);
    for (float p : {0.01f, 0.5f, 0.9f, 0.999f}) add(temperature, 0, p);
  }
  for (int k : {2, 50, vocab - 1})
    for (float p : {0.5f, 0.9f, 0.999f}) add(0.8f, k, p);
  add(1.0f, vocab, 0.5f);  // top_k = vocab is off: top-p alone
  return rows;
}

inline std::string describe(const SamplingRow& row) {
  return "temperature " + std::to_string(row.temperature) + ", top_k " + std::to_string(row.top_k) + ", top_p " +
         std::to_string(row.top_p) + ", seed " + std::to_string(row.seed) + ", step " + std::to_string(row.step);
}

// The ids sample_row_cpu draws from, sorted by id: a stable sort by descending logit, the first top_k,
// then the shortest prefix whose renormalised probabilities reach top_p (sample_row_cpu's code,
// restated). Every id when neither top-k nor top-p is on.
inline std::vector<int> kept_by_definition(const float* logits, int vocab, const SamplingRow& row) {
  std::vector<int> ids(size_t(vocab), 0);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  if (row.top_k > 0 && row.top_k < vocab) ids.resize(size_t(row.top_k));
  if (row.top_p < 1.0f) {
    const double max_logit = logits[ids[0]] / row.temperature;
    std::vector<double> p(ids.size());
    double total = 0;
    for (size_t i = 0; i < ids.size(); i++) total += p[i] = std::exp(double(logits[ids[i]]) / row.temperature - max_logit);
    double cumulative = 0;
    size_t keep = ids.size();
    for (size_t i = 0; i < ids.size(); i++) {
      cumulative += p[i] / total;
      if (cumulative >= row.top_p) {
        keep = i + 1;
        break;
      }
    }
    ids.resize(keep);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The ids a KeptSet keeps, sorted by id: keys above the threshold, and the first `ties` equal to it.
inline std::vector<int> kept_ids(const float* logits, int vocab, KeptSet kept) {
  std::vector<int> ids;
  uint32_t rank = 0;
  for (int i = 0; i < vocab; i++) {
    const uint32_t key = logit_key(logits[i]);
    if (key > kept.threshold || (key == kept.threshold && rank++ < kept.ties)) ids.push_back(i);
  }
  return ids;
}

}  // namespace nanovllm::test
