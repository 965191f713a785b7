// Tests for the pieces of the GPU top-k/top-p sampler and for its algorithm, run on the CPU
// (sampler_top_k_top_p.h, sampler_top_k_top_p_cpu.cpp): no GPU needed.
//
//   Pieces      logit_key preserves the order of floats (-0 and +0 tie) and inverts; logit_mass, the
//               top-p target and select_digit give known answers
//   Algorithm   the header's worked example; the kept set equals sample_row_cpu's (a stable sort) for
//               random, bf16 and heavily tied logits over a grid of settings; its token equals
//               sample_row_cpu's; ties at the boundary are kept lowest id first; non-finite rows give -1
#include "07_sampler/sampler_top_k_top_p.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "07_sampler/sampler_test_inputs.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

KeptSet kept_of(const std::vector<float>& logits, const SamplingRow& row) {
  return top_k_top_p_kept_cpu(logits.data(), int(logits.size()), row);
}

std::vector<int> kept_ids_of(const std::vector<float>& logits, const SamplingRow& row) {
  return kept_ids(logits.data(), int(logits.size()), kept_of(logits, row));
}

std::vector<int> definition(const std::vector<float>& logits, const SamplingRow& row) {
  return kept_by_definition(logits.data(), int(logits.size()), row);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Pieces

TEST(Ch07_TopKTopPPieces, KeysKeepTheOrderOfFloats) {
  const float denorm = std::numeric_limits<float>::denorm_min();
  const std::vector<float> ascending = {-kInf, -FLT_MAX, -1e10f, -3.0f, -1.0000001f, -1.0f, -FLT_MIN, -denorm,
                                        0.0f,  denorm,   FLT_MIN, 0.5f,  1.0f,        1.0000001f, 3.0f, FLT_MAX, kInf};
  for (size_t i = 0; i + 1 < ascending.size(); i++)
    EXPECT_LT(logit_key(ascending[i]), logit_key(ascending[i + 1])) << ascending[i] << " < " << ascending[i + 1];
  for (float x : ascending) EXPECT_EQ(key_logit(logit_key(x)), x) << x;
  // -0 and +0 compare equal, so they share a key (and -0 comes back as +0).
  EXPECT_EQ(logit_key(-0.0f), logit_key(0.0f));
  EXPECT_FALSE(std::signbit(key_logit(logit_key(-0.0f))));
  // The values in the header comment.
  EXPECT_EQ(logit_key(-kInf), 0x007fffffu);
  EXPECT_EQ(logit_key(-1.0f), 0x407fffffu);
  EXPECT_EQ(logit_key(0.0f), 0x80000000u);
  EXPECT_EQ(logit_key(0.5f), 0xbf000000u);
  EXPECT_EQ(logit_key(1.0f), 0xbf800000u);
  EXPECT_EQ(logit_key(3.0f), 0xc0400000u);
  EXPECT_EQ(logit_key(kInf), 0xff800000u);
  // Digits and prefixes.
  EXPECT_EQ(key_digit(0xc0400000u, 24), 0xc0);
  EXPECT_EQ(key_digit(0xc0400000u, 16), 0x40);
  EXPECT_TRUE(key_matches(0x12345678u, 0, 24));  // no digit chosen yet: everything matches
  EXPECT_TRUE(key_matches(0x12345678u, 0x12000000u, 16));
  EXPECT_FALSE(key_matches(0x12345678u, 0x13000000u, 16));
  EXPECT_TRUE(key_matches(0x12345678u, 0x12345600u, 0));
  EXPECT_FALSE(key_matches(0x12345678u, 0x12345700u, 0));
}

TEST(Ch07_TopKTopPPieces, MassIsFixedPointProbabilityRelativeToTheMaximum) {
  const Mass one = Mass(1) << kMassBits;
  EXPECT_EQ(logit_mass(2.5f, 2.5f, 0.7f), one);
  EXPECT_EQ(logit_mass(-kInf, 2.5f, 0.7f), 0u);
  EXPECT_NEAR(double(logit_mass(2.5f - 0.7f * float(M_LN2), 2.5f, 0.7f)) / double(one), 0.5, 1e-7);  // ln 2 * T lower: half
  EXPECT_EQ(logit_mass(-30.0f, 2.0f, 1.0f), Mass(std::exp(-32.0) * 17592186044416.0 + 0.5));  // round(e^-32 2^44)
  EXPECT_EQ(logit_mass(-100.0f, 0.0f, 1.0f), 0u);                                          // below 2^-45
  Mass previous = 0;
  for (float x = -40; x <= 0; x += 0.25f) {
    EXPECT_GE(logit_mass(x, 0.0f, 1.0f), previous) << x;
    previous = logit_mass(x, 0.0f, 1.0f);
  }
}

TEST(Ch07_TopKTopPPieces, TopPTargetIsTheCeilingAndAtLeastOne) {
  EXPECT_EQ(top_p_target(0.5f, 1000), 500u);
  EXPECT_EQ(top_p_target(0.5f, 1001), 501u);        // 500.5 -> 501
  EXPECT_EQ(top_p_target(0.25f, Mass(1) << 54), Mass(1) << 52);
  EXPECT_EQ(top_p_target(1e-30f, Mass(1) << 44), 1u);  // tiny top_p still keeps the first token
  EXPECT_EQ(top_p_target(0.0f, 12345), 1u);
  EXPECT_LE(top_p_target(0.99999994f, Mass(1) << 62), Mass(1) << 62);  // the largest float below 1
}

TEST(Ch07_TopKTopPPieces, SelectDigitKnownAnswers) {
  // The header comment's example: bins 255..250 hold 0, 0, 3, 4, 0, 1; want 5 -> digit 252, 2 left.
  uint32_t hist[kRadixBins] = {};
  hist[253] = 3, hist[252] = 4, hist[250] = 1;
  DigitChoice c = select_digit<uint32_t>(hist, 0, kRadixBins, 5);
  EXPECT_EQ(c.digit, 252);
  EXPECT_EQ(c.remaining, 2u);
  c = select_digit<uint32_t>(hist, 0, kRadixBins, 3);  // exactly the first non-empty bin
  EXPECT_EQ(c.digit, 253);
  EXPECT_EQ(c.remaining, 3u);
  c = select_digit<uint32_t>(hist, 0, kRadixBins, 8);  // everything: the last non-empty bin
  EXPECT_EQ(c.digit, 250);
  EXPECT_EQ(c.remaining, 1u);
  c = select_digit<uint32_t>(hist, 248, 8, 8);  // a lane's 8 bins, as warp 0 uses it
  EXPECT_EQ(c.digit, 250);
  uint32_t low[kRadixBins] = {};
  low[0] = 7;
  c = select_digit<uint32_t>(low, 0, kRadixBins, 7);  // bin 0
  EXPECT_EQ(c.digit, 0);
  EXPECT_EQ(c.remaining, 7u);
}

TEST(Ch07_TopKTopPPieces, WhichRowsTheKernelSamples) {
  EXPECT_FALSE(is_top_k_top_p_row({0.0f, 5, 0.5f, 0, 0}, 100));   // greedy ignores top-k and top-p
  EXPECT_FALSE(is_top_k_top_p_row({1e-6f, 5, 0.5f, 0, 0}, 100));  // so do temperatures below 1e-5
  EXPECT_TRUE(is_top_k_top_p_row({1e-5f, 5, 0.5f, 0, 0}, 100));
  EXPECT_FALSE(is_top_k_top_p_row({1.0f, 0, 1.0f, 0, 0}, 100));   // temperature only
  EXPECT_FALSE(is_top_k_top_p_row({1.0f, 100, 1.0f, 0, 0}, 100)); // top_k >= vocab is off
  EXPECT_FALSE(is_top_k_top_p_row({1.0f, 500, 1.0f, 0, 0}, 100));
  EXPECT_TRUE(is_top_k_top_p_row({1.0f, 99, 1.0f, 0, 0}, 100));
  EXPECT_TRUE(is_top_k_top_p_row({1.0f, 0, 0.99f, 0, 0}, 100));
  EXPECT_TRUE(is_top_k_top_p_row({1.0f, 100, 0.99f, 0, 0}, 100));
}

// ---------------------------------------------------------------------------------------------------
// The algorithm

TEST(Ch07_TopKTopP, WorkedExampleOfTheKernelComment) {
  const std::vector<float> logits = {2.0f, 0.5f, 3.0f, 0.5f, -1.0f, 0.5f, 1.0f, 3.0f};
  KeptSet kept = kept_of(logits, {1.0f, 5, 1.0f, 0, 0});
  EXPECT_EQ(kept.threshold, logit_key(0.5f));  // top-k 5: threshold 0.5, one of its three ties
  EXPECT_EQ(kept.ties, 1u);
  EXPECT_EQ(kept_ids(logits.data(), 8, kept), (std::vector<int>{0, 1, 2, 6, 7}));
  kept = kept_of(logits, {1.0f, 5, 0.8f, 0, 0});
  EXPECT_EQ(kept.threshold, logit_key(2.0f));  // then top-p 0.8: threshold 2.0, one tie
  EXPECT_EQ(kept.ties, 1u);
  EXPECT_EQ(kept_ids(logits.data(), 8, kept), (std::vector<int>{0, 2, 7}));
  EXPECT_EQ(kept_ids(logits.data(), 8, kept), definition(logits, {1.0f, 5, 0.8f, 0, 0}));
}

TEST(Ch07_TopKTopP, KeptSetIsTheDefinitionsOverASettingsGrid) {
  // Every row of the grid, on logits without ties (uniform), with a few (bf16) and with many (quantised,
  // including -0.0 and +0.0), at three vocabulary sizes (5003: not a multiple of 32 or of 1024).
  Rng rng(7000);
  for (int vocab : {1000, 5003, 151936}) {
    const int trials = vocab > 10000 ? 1 : 4;
    for (int trial = 0; trial < trials; trial++) {
      for (int kind = 0; kind < 3; kind++) {
        std::vector<float> logits = kind == 0   ? std::vector<float>(size_t(vocab))
                                    : kind == 1 ? bf16_logits(size_t(vocab), rng)
                                                : quantised_logits(size_t(vocab), rng);
        if (kind == 0)
          for (float& x : logits) x = rng.uniform(-8, 8);
        for (const SamplingRow& row : settings_grid(vocab, rng)) {
          if (!is_top_k_top_p_row(row, vocab)) continue;
          ASSERT_EQ(kept_ids_of(logits, row), definition(logits, row))
              << "vocab " << vocab << ", kind " << kind << ", trial " << trial << ", " << describe(row);
        }
      }
    }
  }
}

TEST(Ch07_TopKTopP, SameTokenAsSampleRowCpu) {
  Rng rng(7001);
  for (int vocab : {1000, 5003}) {
    for (int trial = 0; trial < 4; trial++) {
      const std::vector<float> logits = trial % 2 ? bf16_logits(size_t(vocab), rng) : quantised_logits(size_t(vocab), rng);
      for (SamplingRow row : settings_grid(vocab, rng)) {
        if (!is_top_k_top_p_row(row, vocab)) continue;
        for (int draw = 0; draw < 8; draw++, row.step++)
          ASSERT_EQ(sample_row_top_k_top_p_cpu(logits.data(), vocab, row), sample_row_cpu(logits.data(), vocab, row))
              << "vocab " << vocab << ", trial " << trial << ", " << describe(row);
      }
    }
  }
}

TEST(Ch07_TopKTopP, TiedScoresGoToTheFirstCandidateScanned) {
  // Gumbel-max compares scores logit / T + noise in float, and an exact tie is rare but reachable: token
  // 0's logit is chosen (at T = 1, seed 7, step 3) so that its score equals token 1's bit for bit. The
  // first candidate scanned keeps a tie: a row without top-k or top-p scans ids in order (the lower id
  // wins); a filtered row scans its candidates most likely first (the larger logit wins), which is the
  // kernel's rule too (the larger logit, then the lower id).
  const uint64_t seed = 7, step = 3;
  const float g0 = gumbel_noise(seed, step, 0), g1 = gumbel_noise(seed, step, 1);
  const float target = 1.0f + g1;
  float a = target - g0;
  for (int i = 0; i < 64 && a + g0 != target; i++)  // the floats around it, until the sum rounds to target
    a = std::nextafter(a, a + g0 < target ? INFINITY : -INFINITY);
  ASSERT_EQ(a + g0, target) << "no exact tie near " << a;
  ASSERT_LT(a, 1.0f) << "token 1 must be the more likely, for the filtered row's order";
  const std::vector<float> logits = {a, 1.0f, -100.0f};
  SamplingRow row{1.0f, 0, 1.0f, seed, step};
  EXPECT_EQ(sample_row_cpu(logits.data(), 3, row), 0) << "unfiltered: ids in order, the lower wins";
  row.top_k = 2;
  EXPECT_EQ(sample_row_cpu(logits.data(), 3, row), 1) << "filtered: most likely first, the larger logit wins";
  EXPECT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 3, row), 1) << "the kernel's algorithm";
}

// The other half of the rule above: with the larger logit at the lower id, an exact tie of scores stays with it (the
// larger key first, sampler_top_k_top_p_cpu.cpp), not with the later id scanned. A (seed, step) where token 1's noise
// is the larger lets token 1's logit a < 1 tie token 0's score 1 + g0 bit for bit.
TEST(Ch07_TopKTopP, TiedScoresStayWithTheLargerLogitAtTheLowerId) {
  const uint64_t seed = 7;
  bool found = false;
  for (uint64_t step = 0; step < 64 && !found; step++) {
    const float g0 = gumbel_noise(seed, step, 0), g1 = gumbel_noise(seed, step, 1);
    if (!(g1 > g0)) continue;
    const float target = 1.0f + g0;
    float a = target - g1;
    for (int i = 0; i < 64 && a + g1 != target; i++) a = std::nextafter(a, a + g1 < target ? INFINITY : -INFINITY);
    if (a + g1 != target || !(a < 1.0f)) continue;
    found = true;
    const std::vector<float> logits = {1.0f, a, -100.0f};
    const SamplingRow row{1.0f, 2, 1.0f, seed, step};
    EXPECT_EQ(sample_row_cpu(logits.data(), 3, row), 0) << "the definition: most likely first, step " << step;
    EXPECT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 3, row), 0) << "the kernel's algorithm, step " << step;
  }
  ASSERT_TRUE(found) << "no exact tie with the larger noise at id 1";
}

// Masses are relative to the largest logit wherever it is, id 0 included: with id 0 far the most likely (8 above the
// other 999 at T = 0.5, probability 1 / (1 + 999 e^-16) > 0.9999), top_p 0.9 keeps it alone and it is always drawn.
TEST(Ch07_TopKTopP, TheLargestLogitAtIdZeroIsWhereTheMassesStart) {
  std::vector<float> logits(1000, 0.0f);
  logits[0] = 8.0f;
  SamplingRow row{0.5f, 0, 0.9f, 3, 0};
  EXPECT_EQ(kept_ids_of(logits, row), std::vector<int>{0});
  EXPECT_EQ(definition(logits, row), std::vector<int>{0});
  for (row.step = 0; row.step < 16; row.step++) EXPECT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 1000, row), 0);
}

TEST(Ch07_TopKTopP, TopPReachedExactlyKeepsNoMore) {
  // Two equal logits: the first candidate (the lower id) has probability exactly 0.5, so top_p 0.5 is
  // reached by it alone and the other is never drawn; just above 0.5 both are kept.
  const std::vector<float> logits = {0.0f, 0.0f};
  SamplingRow row{1.0f, 0, 0.5f, 11, 0};
  int ones = 0;
  for (row.step = 0; row.step < 1000; row.step++) {
    ASSERT_EQ(sample_row_cpu(logits.data(), 2, row), 0) << "step " << row.step;
    ASSERT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 2, row), 0) << "step " << row.step;
  }
  row.top_p = 0.51f;
  for (row.step = 0; row.step < 1000; row.step++) ones += sample_row_cpu(logits.data(), 2, row);
  EXPECT_GT(ones, 400);
  EXPECT_LT(ones, 600);
}

TEST(Ch07_TopKTopP, BoundaryTiesKeepTheLowestIds) {
  // Three logits at 1, the other 997 at 0. top_k 10: the three, and ids 0..6 of the zeros.
  std::vector<float> logits(1000, 0.0f);
  logits[100] = logits[500] = logits[900] = 1.0f;
  logits[3] = -0.0f;  // ties with +0.0
  EXPECT_EQ(kept_ids_of(logits, {1.0f, 10, 1.0f, 0, 0}), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 100, 500, 900}));
  // top_p 0.02 at T = 1: the mass is 3 + 997 e^-1 = 369.77, 0.02 of it 7.40, reached after the three and
  // ceil((7.40 - 3) / e^-1) = 12 zeros: ids 0..11.
  std::vector<int> want = {100, 500, 900};
  for (int i = 0; i < 12; i++) want.push_back(i);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(kept_ids_of(logits, {1.0f, 0, 0.02f, 0, 0}), want);
  EXPECT_EQ(definition(logits, {1.0f, 0, 0.02f, 0, 0}), want);
  // Both: top_k 10 then top_p 0.9 of (3 + 7 e^-1 = 5.58): 5.02, 3 + 6 e^-1 = 5.21 reaches it: 6 zeros.
  want = {0, 1, 2, 3, 4, 5, 100, 500, 900};
  EXPECT_EQ(kept_ids_of(logits, {1.0f, 10, 0.9f, 0, 0}), want);
  EXPECT_EQ(definition(logits, {1.0f, 10, 0.9f, 0, 0}), want);
}

TEST(Ch07_TopKTopP, TopPCutsAFlatRowInIdOrder) {
  // 1024 equal logits, top_p 0.25: the first 256 ids (1/1024 sums exactly in binary on both sides).
  const std::vector<float> logits(1024, 0.5f);
  const KeptSet kept = kept_of(logits, {1.0f, 0, 0.25f, 0, 0});
  EXPECT_EQ(kept.threshold, logit_key(0.5f));
  EXPECT_EQ(kept.ties, 256u);
  EXPECT_EQ(kept_ids(logits.data(), 1024, kept), definition(logits, {1.0f, 0, 0.25f, 0, 0}));
}

TEST(Ch07_TopKTopP, InfiniteAndNanRows) {
  std::vector<float> logits = {1.0f, -kInf, 3.0f, -kInf, 2.0f};
  const SamplingRow row{1.0f, 2, 0.9f, 5, 6};
  // -inf entries are ordinary (the least likely); a finite maximum is all that is needed.
  EXPECT_EQ(kept_ids_of(logits, {1.0f, 4, 1.0f, 0, 0}), (std::vector<int>{0, 1, 2, 4}));
  EXPECT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 5, row), sample_row_cpu(logits.data(), 5, row));
  logits[1] = std::nanf("");
  EXPECT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 5, row), -1);  // NaN anywhere
  logits[1] = kInf;
  EXPECT_EQ(sample_row_top_k_top_p_cpu(logits.data(), 5, row), -1);  // +inf maximum
  const std::vector<float> all_masked(5, -kInf);
  EXPECT_EQ(sample_row_top_k_top_p_cpu(all_masked.data(), 5, row), -1);  // no finite logit
}
