// Tests for the reference sampler (sampler.h, sampler_cpu.cpp) against the math.
//
//   Greedy      the first index of the maximum; temperature 0 ignores top-k and top-p
//   Uniform     sampler_uniform strictly inside (0, 1), also at the hash's extreme outputs; uniform and
//               neighbour-independent by chi-square; deterministic
//   Sampling    a seeded row is reproducible (and independent of its batch position); token frequencies
//               match softmax(logits / T) for T = 1 and 0.6
//   Top-k/top-p the support is exactly the k largest / the smallest prefix whose probability reaches p
//               (crossing token included), frequencies match the renormalised softmax over it; both
//               together (top-p after top-k, on the renormalised probabilities)
//
// Statistics. Draws are made independent by varying `step` (the counter of the counter-based RNG), so a
// test draws N tokens from one row of logits. Frequencies are judged by Pearson's chi-square against the
// exact probabilities (computed here in double), and a test fails when the p-value is below 1e-6. The
// draws are a fixed function of fixed seeds, so each test's outcome is deterministic; the threshold says
// how unlucky a correct sampler's fixed draws would have to be to fail (one chance in a million for each
// check: changing a seed or the hash will not make a correct sampler fail), while a wrong distribution is
// caught by a wide margin: with N = 200,000, a 5% relative error in a probability of 0.1 adds about 50 to
// the statistic, beyond the df = 7 threshold of ~40 (FrequenciesMatchSoftmax shows the other temperature's
// distribution rejected at p < 1e-100). Expected counts are >= 100 in every cell, so the chi-square
// approximation holds.
#include "07_sampler/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

using namespace nanovllm;

namespace {

constexpr double kAlpha = 1e-6;  // significance of every chi-square test
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------------
// Statistics helpers

// Q(a, x), the regularised upper incomplete gamma function (series below a + 1, Lentz's continued fraction
// above; Numerical Recipes 6.2). The chi-square p-value is Q(df / 2, stat / 2).
double gamma_q(double a, double x) {
  if (x <= 0) return 1;
  const double log_prefactor = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1 / a, sum = term;
    for (int n = 1; n < 10000 && term > sum * 1e-16; n++) sum += (term *= x / (a + n));
    return 1 - sum * std::exp(log_prefactor);
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 10000; i++) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::abs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::abs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    h *= d * c;
    if (std::abs(d * c - 1) < 1e-16) break;
  }
  return std::exp(log_prefactor) * h;
}

double chi_square_p_value(double stat, int df) { return gamma_q(df / 2.0, stat / 2.0); }

// softmax(logits / T) in double.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double max_logit = -INFINITY;
  for (float x : logits) max_logit = std::max(max_logit, x / temperature);
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); i++) total += (p[i] = std::exp(logits[i] / temperature - max_logit));
  for (double& x : p) x /= total;
  return p;
}

// `p` restricted to `support` and renormalised (zero elsewhere).
std::vector<double> restrict_to(const std::vector<double>& p, const std::set<int>& support) {
  std::vector<double> q(p.size(), 0.0);
  double total = 0;
  for (int i : support) total += p[i];
  for (int i : support) q[i] = p[i] / total;
  return q;
}

// Token counts of N draws from one row: steps first_step .. first_step + N - 1.
std::vector<int> draw_counts(const std::vector<float>& logits, SamplingRow row, int N, uint64_t first_step = 0) {
  std::vector<int> counts(logits.size(), 0);
  for (int n = 0; n < N; n++) {
    row.step = first_step + uint64_t(n);
    const int32_t token = sample_row_cpu(logits.data(), int(logits.size()), row);
    if (token < 0 || token >= int(logits.size())) {
      ADD_FAILURE() << "token " << token << " outside the vocabulary";
      break;
    }
    counts[token]++;
  }
  return counts;
}

std::set<int> observed(const std::vector<int>& counts) {
  std::set<int> s;
  for (size_t i = 0; i < counts.size(); i++)
    if (counts[i] > 0) s.insert(int(i));
  return s;
}

// Pearson's chi-square p-value of `counts` against probabilities `p` (cells with p = 0 must be empty:
// that is checked separately by the support tests, and here any count there gives p-value 0).
double p_value(const std::vector<int>& counts, const std::vector<double>& p) {
  double N = 0, stat = 0;
  for (int c : counts) N += c;
  int cells = 0;
  for (size_t i = 0; i < p.size(); i++) {
    if (p[i] == 0) {
      if (counts[i] > 0) return 0;
      continue;
    }
    const double expected = N * p[i];
    stat += (counts[i] - expected) * (counts[i] - expected) / expected;
    cells++;
  }
  return chi_square_p_value(stat, cells - 1);
}

std::string describe(const std::vector<int>& counts, const std::vector<double>& p) {
  double N = 0;
  for (int c : counts) N += c;
  std::string s;
  for (size_t i = 0; i < p.size(); i++)
    s += "  token " + std::to_string(i) + ": " + std::to_string(counts[i]) + " drawn, " + std::to_string(N * p[i]) +
         " expected\n";
  return s;
}

SamplingRow sampled(float temperature, int top_k = 0, float top_p = 1.0f, uint64_t seed = 1234) {
  return SamplingRow{temperature, top_k, top_p, seed, 0};
}

SamplingRow greedy_row() { return SamplingRow{0.0f, 0, 1.0f, 0, 0}; }

int32_t sample(const std::vector<float>& logits, const SamplingRow& row) {
  return sample_row_cpu(logits.data(), int(logits.size()), row);
}

// A fixed-seed generator for test inputs (not the sampler's).
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() { return mix64(state += 0x9e3779b97f4a7c15ull); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * (1.0f / 16777216.0f); }
  int below(int n) { return int(next() % uint64_t(n)); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------------
// The statistics helper itself

TEST(Ch07_Stats, ChiSquarePValueKnownAnswers) {
  // Textbook critical values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.4), and df = 2 where the
  // p-value is exactly exp(-stat / 2).
  EXPECT_NEAR(chi_square_p_value(3.841458820694124, 1), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_p_value(14.067140449340169, 7), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_p_value(29.588298445074, 10), 0.001, 1e-9);
  EXPECT_NEAR(chi_square_p_value(2 * std::log(1e6), 2) / 1e-6, 1.0, 1e-9);
  EXPECT_NEAR(chi_square_p_value(1.0, 4) / (1.5 * std::exp(-0.5)), 1.0, 1e-12);  // df 4: (1 + s/2) e^(-s/2)
}

// ---------------------------------------------------------------------------------------------------
// Greedy

TEST(Ch07_Greedy, FirstIndexOfTheMaximum) {
  EXPECT_EQ(sample({1, 5, 3, 5, -2}, greedy_row()), 1);      // tie: the lowest id, as torch.argmax
  EXPECT_EQ(sample({7, 7, 7}, greedy_row()), 0);
  EXPECT_EQ(sample({-5, -3, -3, -10}, greedy_row()), 1);     // all negative
  EXPECT_EQ(sample({-kInf, -kInf, 2}, greedy_row()), 2);     // masked entries, maximum last
  EXPECT_EQ(sample({0.5f}, greedy_row()), 0);                // vocab 1
  EXPECT_EQ(sample({1, 1.0000001f, 1}, greedy_row()), 1);    // one ulp decides
  Rng rng(700);
  std::vector<float> logits(1000);
  for (int trial = 0; trial < 20; trial++) {
    for (float& x : logits) x = rng.uniform(-10, 10);
    const int planted = rng.below(1000);
    logits[size_t(planted)] = 10.5f;
    if (trial % 2) logits[size_t(std::min(999, planted + 1 + rng.below(5)))] = 10.5f;  // a later tie
    EXPECT_EQ(sample(logits, greedy_row()), planted) << "trial " << trial;
  }
}

TEST(Ch07_Greedy, TemperatureZeroIgnoresTopKAndTopP) {
  // With temperature 0 the result is the argmax whatever top_k, top_p, seed and step say (negative
  // logits included: logits / 0 would make them all -inf).
  Rng rng(701);
  std::vector<float> logits(50);
  for (int trial = 0; trial < 200; trial++) {
    const float shift = trial % 2 ? -100.0f : 0.0f;
    for (float& x : logits) x = rng.uniform(-5, 5) + shift;
    const int expected = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const SamplingRow row{0.0f, rng.below(60), rng.uniform(0.01f, 1.0f), rng.next(), rng.next()};
    EXPECT_EQ(sample(logits, row), expected) << "trial " << trial << ", top_k " << row.top_k << ", top_p " << row.top_p;
  }
}

TEST(Ch07_Greedy, TinyTemperaturesGiveTheArgmax) {
  // As T -> 0, softmax(logits / T) concentrates on the argmax. logits / 1e-40 overflows to +-inf, and
  // the first positive logit won; below the threshold the sampler is greedy, whatever the filters.
  Rng rng(702);
  std::vector<float> logits(5000);
  for (float T : {1e-40f, 1e-30f, 1e-10f, 1e-6f}) {
    for (int trial = 0; trial < 20; trial++) {
      for (float& x : logits) x = rng.uniform(-20, 20);
      const int expected = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
      const SamplingRow row{T, trial % 3 == 1 ? 50 : 0, trial % 3 == 2 ? 0.9f : 1.0f, rng.next(), rng.next()};
      EXPECT_EQ(sample(logits, row), expected) << "T " << T << ", trial " << trial;
    }
  }
}

TEST(Ch07_Greedy, NonFiniteLogitsGiveNoToken) {
  // NaN logits came out as token 0 (NaN never compares greater) and +Inf won outright: both mean the
  // model's numbers broke, so every mode returns -1 and the engine fails the step. -Inf is a masked
  // entry, but a row with nothing else has no token either.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> broken = {
      {nan, 1, 2}, {1, 2, nan}, {nan, nan, nan}, {1, kInf, 2}, {-kInf, -kInf, -kInf}, {kInf, -kInf, nan}};
  const SamplingRow rows[] = {greedy_row(), sampled(1.0f), sampled(0.6f, 2), sampled(0.6f, 0, 0.5f), sampled(1e-30f)};
  for (size_t k = 0; k < broken.size(); k++)
    for (const SamplingRow& row : rows)
      EXPECT_EQ(sample(broken[k], row), -1) << "row " << k << ", temperature " << row.temperature;
  for (const SamplingRow& row : rows) EXPECT_EQ(sample({-kInf, 3, -kInf}, row), 1);
}

// ---------------------------------------------------------------------------------------------------
// The uniform numbers

TEST(Ch07_Uniform, StrictlyInsideZeroOneAtTheHashExtremes) {
  // (seed, step, index) triples found by search for which the entry's 23 bits of its pair's hash are all
  // ones or all zeros, for an even and an odd entry: the largest and the smallest u the function can
  // return. u = 1 would make the Gumbel noise -log(-log 1) = +inf, and u = 0 would make it -inf.
  struct Triple {
    uint64_t seed, step;
    uint32_t index;
    uint32_t bits;
  };
  for (Triple t : {Triple{0, 0, 3738306, 0x7fffff}, Triple{0, 0, 17709737, 0x7fffff}, Triple{0, 0, 19826502, 0},
                   Triple{1, 0, 8834965, 0}}) {
    SCOPED_TRACE("seed " + std::to_string(t.seed) + ", step " + std::to_string(t.step) + ", index " +
                 std::to_string(t.index));
    const uint64_t z = mix64(t.seed + 0x9e3779b97f4a7c15ull * (mix64(t.step) + t.index / 2 + 1));
    ASSERT_EQ(t.index % 2 == 0 ? z >> 41 : (z >> 18) & 0x7fffff, t.bits)
        << "the triple no longer reaches the extreme (the hash changed?)";
    const float u = sampler_uniform(t.seed, t.step, t.index);
    EXPECT_GT(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    EXPECT_TRUE(std::isfinite(gumbel_noise(t.seed, t.step, t.index))) << "u = " << u;
  }
}

TEST(Ch07_Uniform, StrictlyInsideZeroOneOverManyDraws) {
  float lo = 1, hi = 0;
  for (uint64_t seed : {0ull, 1ull, 0xdeadbeefull})
    for (uint64_t step = 0; step < 16; step++)
      for (uint32_t i = 0; i < 65536; i++) {
        const float u = sampler_uniform(seed, step, i);
        lo = std::min(lo, u);
        hi = std::max(hi, u);
      }
  EXPECT_GT(lo, 0.0f);
  EXPECT_LT(hi, 1.0f);
  EXPECT_LT(lo, 1e-4f);  // and they do fill the interval (3 * 2^20 draws)
  EXPECT_GT(hi, 1 - 1e-4f);
}

TEST(Ch07_Uniform, DeterministicAndSensitiveToEveryInput) {
  const float u = sampler_uniform(42, 7, 1000);
  EXPECT_EQ(u, sampler_uniform(42, 7, 1000));
  EXPECT_NE(u, sampler_uniform(43, 7, 1000));
  EXPECT_NE(u, sampler_uniform(42, 8, 1000));
  EXPECT_NE(u, sampler_uniform(42, 7, 1001));
  EXPECT_FLOAT_EQ(gumbel_noise(42, 7, 1000), -std::log(-std::log(u)));
}

TEST(Ch07_Uniform, ChiSquareOver1024Bins) {
  // 2^20 draws in 1024 equal bins (1024 expected per bin, df 1023), along each input in turn: the
  // vocabulary index (the draws of one row), the step (one token across a request) and the seed.
  const int bins = 1024, N = 1 << 20;
  const std::vector<double> p(bins, 1.0 / bins);
  auto check = [&](const char* what, auto u_of) {
    std::vector<int> counts(bins, 0);
    for (int n = 0; n < N; n++) counts[std::min(bins - 1, int(u_of(uint32_t(n)) * bins))]++;
    const double pv = p_value(counts, p);
    EXPECT_GT(pv, kAlpha) << "along " << what;
  };
  check("index", [](uint32_t n) { return sampler_uniform(99, 5, n); });
  check("step", [](uint32_t n) { return sampler_uniform(99, n, 17); });
  check("seed", [](uint32_t n) { return sampler_uniform(n, 5, 17); });
}

TEST(Ch07_Uniform, NeighboursAreIndependent) {
  // Pairs (u_i, u_i+1) of neighbouring indices, and of neighbouring steps, in a 32 x 32 grid: 2^19 pairs,
  // 512 expected per cell, df 1023. Gumbel-max needs the noise of different tokens independent.
  const int side = 32, N = 1 << 19;
  const std::vector<double> p(side * side, 1.0 / (side * side));
  auto cell = [&](float u) { return std::min(side - 1, int(u * side)); };
  std::vector<int> by_index(side * side, 0), by_step(side * side, 0);
  for (int n = 0; n < N; n++) {
    by_index[cell(sampler_uniform(3, 11, 2 * n)) * side + cell(sampler_uniform(3, 11, 2 * n + 1))]++;
    by_step[cell(sampler_uniform(3, 2 * n, 5)) * side + cell(sampler_uniform(3, 2 * n + 1, 5))]++;
  }
  EXPECT_GT(p_value(by_index, p), kAlpha);
  EXPECT_GT(p_value(by_step, p), kAlpha);
}

TEST(Ch07_Uniform, NoRepeatsAcrossInputGrids) {
  // 2^16 values from a grid of two inputs (the third fixed) repeat only by chance: with 2^23 possible
  // values, a pair collides with probability 2^-23, so about 2^31 / 2^23 = 256 repeated values are
  // expected (Poisson; 400 or more has probability ~1e-16). A hash that mixes two inputs only through
  // their sum (u(step, i) = u(step + 1, i - 1)) repeats ~60,000 times.
  auto repeats = [](auto u_of) {
    std::vector<float> values;
    for (uint32_t a = 0; a < 64; a++)
      for (uint32_t b = 0; b < 1024; b++) values.push_back(u_of(a, b));
    std::sort(values.begin(), values.end());
    return int(values.size() - size_t(std::unique(values.begin(), values.end()) - values.begin()));
  };
  EXPECT_LT(repeats([](uint32_t step, uint32_t i) { return sampler_uniform(8, step, i); }), 400) << "steps x indices";
  EXPECT_LT(repeats([](uint32_t seed, uint32_t i) { return sampler_uniform(seed, 3, i); }), 400) << "seeds x indices";
  EXPECT_LT(repeats([](uint32_t seed, uint32_t step) { return sampler_uniform(seed, step, 5); }), 400) << "seeds x steps";
}

// ---------------------------------------------------------------------------------------------------
// Sampling with temperature

TEST(Ch07_Sampling, NoTokenWinsThroughInfiniteNoise) {
  // At seed 0, step 1576915, token 4's 23 random bits are all ones (bits 41-63 of pair 2's hash, asserted
  // below with the hash written out, as StrictlyInsideZeroOneAtTheHashExtremes does): the largest u there is.
  // Token 4 has logit -30 against seven tokens at 0: its probability is e^-30 / 7 ~ 1e-14, so it must not be
  // drawn. If sampler_uniform returns 1.0 there, its Gumbel noise is +inf and it wins outright.
  const uint64_t seed = 0, step = 1576915;
  const uint32_t token = 4;
  ASSERT_EQ(mix64(seed + 0x9e3779b97f4a7c15ull * (mix64(step) + token / 2 + 1)) >> 41, 0x7fffffu)
      << "token " << token << " no longer reaches the extreme at this step (the hash changed?)";
  std::vector<float> logits(8, 0.0f);
  logits[token] = -30;
  SamplingRow row = sampled(1.0f, 0, 1.0f, seed);
  row.step = step;
  EXPECT_NE(sample(logits, row), int32_t(token));
}

TEST(Ch07_Sampling, SeededRowIsReproducible) {
  Rng rng(710);
  std::vector<float> logits(1000);
  for (float& x : logits) x = rng.uniform(-1, 1);  // nearly flat: two independent draws rarely agree
  const int V = int(logits.size());

  // Same seed and step: the same token, every time, and wherever the row sits in a batch.
  SamplingRow row = sampled(0.8f, 0, 1.0f, 555);
  std::vector<int32_t> first;
  for (uint64_t step = 0; step < 64; step++) {
    row.step = step;
    first.push_back(sample(logits, row));
    EXPECT_EQ(sample(logits, row), first.back());
  }
  std::vector<float> batch_logits;
  std::vector<SamplingRow> rows;
  for (int b = 0; b < 5; b++) {
    batch_logits.insert(batch_logits.end(), logits.begin(), logits.end());
    rows.push_back(b == 3 ? row : sampled(0.8f, 0, 1.0f, 1000 + b));
  }
  std::vector<int32_t> tokens(5);
  sample_cpu(tokens.data(), batch_logits.data(), 5, V, rows.data());
  EXPECT_EQ(tokens[3], first.back()) << "batch position 3";

  // Another step range, or another seed: draws that agree only by chance (p ~ 1/1000 per position for
  // these near-flat logits; 6 or more agreements out of 64 has probability ~1e-10).
  auto agreements = [&](uint64_t seed, uint64_t step0) {
    int same = 0;
    for (uint64_t step = 0; step < 64; step++) {
      SamplingRow other = sampled(0.8f, 0, 1.0f, seed);
      other.step = step0 + step;
      same += sample(logits, other) == first[step];
    }
    return same;
  };
  EXPECT_LE(agreements(555, 64), 5) << "steps 64..127 against steps 0..63";
  EXPECT_LE(agreements(556, 0), 5) << "seed 556 against seed 555";
}

TEST(Ch07_Sampling, BatchedEqualsRowByRow) {
  // sample_cpu is sample_row_cpu on row b's logits (offset b * vocab_size) with rows[b].
  Rng rng(711);
  const int B = 6, V = 37;
  std::vector<float> logits(size_t(B) * V);
  for (float& x : logits) x = rng.uniform(-3, 3);
  const std::vector<SamplingRow> rows = {greedy_row(), sampled(1.0f), sampled(0.6f, 5), sampled(0.9f, 0, 0.5f),
                                         sampled(1.3f, 10, 0.8f, 77), SamplingRow{0.7f, 0, 1.0f, 3, 99}};
  std::vector<int32_t> tokens(B, -1);
  sample_cpu(tokens.data(), logits.data(), B, V, rows.data());
  for (int b = 0; b < B; b++)
    EXPECT_EQ(tokens[b], sample_row_cpu(logits.data() + size_t(b) * V, V, rows[b])) << "row " << b;
  // Row 0 is greedy: the known answer.
  EXPECT_EQ(tokens[0], int(std::max_element(logits.begin(), logits.begin() + V) - logits.begin()));
}

TEST(Ch07_Sampling, FrequenciesMatchSoftmaxAtT1AndT06) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 1.5f, -2.0f};
  const int N = 200000;
  std::vector<std::vector<int>> counts;
  for (float T : {1.0f, 0.6f}) {
    SCOPED_TRACE("temperature " + std::to_string(T));
    const std::vector<double> p = softmax(logits, T);
    counts.push_back(draw_counts(logits, sampled(T), N));
    const double pv = p_value(counts.back(), p);
    EXPECT_GT(pv, kAlpha) << "chi-square p-value " << pv << "\n" << describe(counts.back(), p);
  }
  // The test can tell the temperatures apart: each run's counts are far from the other's distribution.
  EXPECT_LT(p_value(counts[0], softmax(logits, 0.6f)), 1e-100);
  EXPECT_LT(p_value(counts[1], softmax(logits, 1.0f)), 1e-100);
}

// ---------------------------------------------------------------------------------------------------
// Top-k

TEST(Ch07_TopK, KeepsExactlyTheKLargest) {
  // Distinct logits in a scrambled order; at top_k = 3 the support is ids {0, 3, 6} (logits 2.2, 3.1,
  // 1.9), never anything else, with the softmax renormalised over them.
  const std::vector<float> logits = {2.2f, -0.4f, 1.1f, 3.1f, 0.3f, -1.7f, 1.9f, 0.8f};
  const int N = 100000;
  for (float T : {1.0f, 0.6f}) {
    SCOPED_TRACE("temperature " + std::to_string(T));
    const std::vector<int> counts = draw_counts(logits, sampled(T, 3), N);
    EXPECT_EQ(observed(counts), (std::set<int>{0, 3, 6}));
    const std::vector<double> p = restrict_to(softmax(logits, T), {0, 3, 6});
    EXPECT_GT(p_value(counts, p), kAlpha) << describe(counts, p);
  }
  // top_k = 1 is greedy; top_k >= vocab is off (the same draws, token for token).
  EXPECT_EQ(observed(draw_counts(logits, sampled(1.0f, 1), 2000)), (std::set<int>{3}));
  for (int step = 0; step < 2000; step++) {
    SamplingRow off = sampled(1.0f), all = sampled(1.0f, 8), more = sampled(1.0f, 100);
    off.step = all.step = more.step = uint64_t(step);
    const int32_t token = sample(logits, off);
    ASSERT_EQ(sample(logits, all), token) << "top_k = vocab_size, step " << step;
    ASSERT_EQ(sample(logits, more), token) << "top_k > vocab_size, step " << step;
  }
}

TEST(Ch07_TopK, TiesAtTheBoundaryKeepTheLowestIds) {
  // Three tokens tie for the largest logit and only two fit: ids 1 and 2 stay, id 3 never appears, and
  // the two are equally likely.
  const std::vector<float> logits = {1, 3, 3, 3, 0};
  const std::vector<int> counts = draw_counts(logits, sampled(1.0f, 2), 40000);
  EXPECT_EQ(observed(counts), (std::set<int>{1, 2}));
  EXPECT_GT(p_value(counts, {0, 0.5, 0.5, 0, 0}), kAlpha) << describe(counts, {0, 0.5, 0.5, 0, 0});
  // The same in a row longer than 16: a sort of up to 16 elements is an insertion sort, stable whatever the
  // sort promises, so the row above cannot tell a stable sort from an unstable one. 20 ties at logit 3 on the
  // odd ids of 40 (the even ids at 0): top_k 2 keeps ids 1 and 3; so does top_p 0.08, as each tie has
  // probability e^3 / (20 e^3 + 20) = 0.0476, two of them 0.0953.
  std::vector<float> long_row(40, 0.0f);
  for (size_t i = 1; i < long_row.size(); i += 2) long_row[i] = 3;
  std::vector<double> two(long_row.size(), 0.0);
  two[1] = two[3] = 0.5;
  for (const SamplingRow& row : {sampled(1.0f, 2), sampled(1.0f, 0, 0.08f)}) {
    SCOPED_TRACE("top_k " + std::to_string(row.top_k) + ", top_p " + std::to_string(row.top_p));
    const std::vector<int> long_counts = draw_counts(long_row, row, 20000);
    EXPECT_EQ(observed(long_counts), (std::set<int>{1, 3}));
    EXPECT_GT(p_value(long_counts, two), kAlpha) << describe(long_counts, two);
  }
}

// ---------------------------------------------------------------------------------------------------
// Top-p

namespace {

// Probabilities 0.35, 0.25, 0.2, 0.1, 0.06, 0.04 (cumulative 0.35, 0.60, 0.80, 0.90, 0.96, 1) on the
// scrambled ids 3, 0, 5, 1, 4, 2: logits are their logs (temperature 1).
const std::vector<int> kRankToId = {3, 0, 5, 1, 4, 2};
const std::vector<double> kRankProb = {0.35, 0.25, 0.2, 0.1, 0.06, 0.04};

std::vector<float> top_p_logits() {
  std::vector<float> logits(6);
  for (int r = 0; r < 6; r++) logits[size_t(kRankToId[r])] = float(std::log(kRankProb[r]));
  return logits;
}

std::set<int> most_likely(int n) { return std::set<int>(kRankToId.begin(), kRankToId.begin() + n); }

}  // namespace

TEST(Ch07_TopP, KeepsTheSmallestPrefixThatReachesPCrossingTokenIncluded) {
  // Just below and just above each cumulative probability: below 0.60 the second token is the one that
  // crosses (kept), the third is not needed; above 0.60 the third crosses, and so on.
  const std::vector<float> logits = top_p_logits();
  const std::vector<double> p = softmax(logits, 1.0);
  struct Case {
    float top_p;
    int kept;
  };
  for (Case c : {Case{0.05f, 1}, Case{0.34f, 1}, Case{0.36f, 2}, Case{0.59f, 2}, Case{0.61f, 3}, Case{0.79f, 3},
                 Case{0.81f, 4}, Case{0.89f, 4}, Case{0.91f, 5}, Case{0.95f, 5}, Case{0.97f, 6}}) {
    SCOPED_TRACE("top_p " + std::to_string(c.top_p));
    // 20,000 draws: a kept token has probability >= 0.04 (so it is missing with probability < 1e-300).
    const std::vector<int> counts = draw_counts(logits, sampled(1.0f, 0, c.top_p), 20000);
    EXPECT_EQ(observed(counts), most_likely(c.kept));
    const std::vector<double> q = restrict_to(p, most_likely(c.kept));
    EXPECT_GT(p_value(counts, q), kAlpha) << describe(counts, q);
  }
}

TEST(Ch07_TopP, AppliesToTheTemperedDistribution) {
  // At T = 0.5 the probabilities are p^2 renormalised: 0.51, 0.26, 0.17, ... (cumulative 0.51, 0.77): with
  // top_p 0.7, T = 1 keeps three tokens (0.35, 0.60, 0.80) but T = 0.5 keeps two.
  const std::vector<float> logits = top_p_logits();
  const std::vector<int> t1 = draw_counts(logits, sampled(1.0f, 0, 0.7f), 20000);
  const std::vector<int> t05 = draw_counts(logits, sampled(0.5f, 0, 0.7f), 20000);
  EXPECT_EQ(observed(t1), most_likely(3));
  EXPECT_EQ(observed(t05), most_likely(2));
  const std::vector<double> q = restrict_to(softmax(logits, 0.5), most_likely(2));
  EXPECT_GT(p_value(t05, q), kAlpha) << describe(t05, q);
}

TEST(Ch07_TopKTopP, TopPCutsTheRenormalisedTopK) {
  // Probabilities 0.3, 0.25, 0.2, 0.15, 0.1 on ids 4, 1, 0, 3, 2.
  //   top_k 3, top_p 0.6: over the top 3, 0.4, 0.33, 0.27 (cumulative 0.4, 0.73): two tokens. (Top-p on
  //                       the whole distribution would keep three: 0.3, 0.55, 0.75.)
  //   top_k 4, top_p 0.5: 0.33, 0.28, ... (cumulative 0.33, 0.61): two tokens.
  //   top_k 2, top_p 0.99: top-k binds: two tokens.
  //   top_k 4, top_p 0.9: 0.33, 0.61, 0.83, 1.0: all four kept by top-k.
  const std::vector<int> rank_to_id = {4, 1, 0, 3, 2};
  const std::vector<double> rank_prob = {0.3, 0.25, 0.2, 0.15, 0.1};
  std::vector<float> logits(5);
  for (int r = 0; r < 5; r++) logits[size_t(rank_to_id[r])] = float(std::log(rank_prob[r]));
  const std::vector<double> p = softmax(logits, 1.0);
  struct Case {
    int top_k;
    float top_p;
    int kept;
  };
  for (Case c : {Case{3, 0.6f, 2}, Case{4, 0.5f, 2}, Case{2, 0.99f, 2}, Case{4, 0.9f, 4}, Case{0, 0.6f, 3}}) {
    SCOPED_TRACE("top_k " + std::to_string(c.top_k) + ", top_p " + std::to_string(c.top_p));
    const std::set<int> support(rank_to_id.begin(), rank_to_id.begin() + c.kept);
    const std::vector<int> counts = draw_counts(logits, sampled(1.0f, c.top_k, c.top_p), 20000);
    EXPECT_EQ(observed(counts), support);
    const std::vector<double> q = restrict_to(p, support);
    EXPECT_GT(p_value(counts, q), kAlpha) << describe(counts, q);
  }
}
