// bench's serving metrics (serving_metrics.h): the percentile against numpy.percentile's definition,
// worked by hand, and TTFT / TPOT of a few requests whose times are known.
#include "01_sequence/cli/serving_metrics.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace nanovllm;

TEST(Ch01_ServingMetrics, PercentileInterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], q): rank q / 100 * 3, interpolated between its neighbours.
  const std::vector<double> four = {4, 1, 3, 2};  // unsorted: the function sorts a copy
  EXPECT_DOUBLE_EQ(percentile(four, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile(four, 99), 3.97);  // rank 2.97: 3 + 0.97 * (4 - 3)
  EXPECT_DOUBLE_EQ(percentile(four, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(four, 100), 4);
  // 1..100: rank 98.01 for p99, so 99.01; the median of an even count is the mean of the middle two.
  std::vector<double> hundred;
  for (int i = 100; i >= 1; i--) hundred.push_back(i);
  EXPECT_NEAR(percentile(hundred, 99), 99.01, 1e-9);
  EXPECT_DOUBLE_EQ(percentile(hundred, 50), 50.5);
  // Three values: p99 is rank 1.98, 0.98 of the way from the middle one to the largest.
  EXPECT_NEAR(percentile({10, 0, 5}, 99), 9.9, 1e-12);
  EXPECT_DOUBLE_EQ(percentile({10, 0, 5}, 50), 5);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(Ch01_ServingMetrics, TtftAndTpotOfKnownRequests) {
  // r0 arrives at 0, first token at 0.1, 10 more tokens by 1.1: TTFT 0.1, TPOT 1.0 / 10 = 0.1.
  // r1 outputs one token at 0.3: TTFT 0.3, no TPOT (nothing after the first token).
  // r2 arrives late, at 0.5; first token at 0.7, 4 more by 1.7: TTFT 0.2, TPOT 1.0 / 4 = 0.25.
  const ServingMetrics m = serving_metrics({{0.0, 0.1, 1.1, 11}, {0.0, 0.3, 0.3, 1}, {0.5, 0.7, 1.7, 5}});
  EXPECT_EQ(m.requests, 3);
  EXPECT_NEAR(m.ttft_median, 0.2, 1e-12);              // of {0.1, 0.2, 0.3}
  EXPECT_NEAR(m.ttft_p99, 0.2 + 0.98 * 0.1, 1e-12);   // rank 1.98
  EXPECT_EQ(m.tpot_requests, 2);
  EXPECT_NEAR(m.tpot_median, 0.175, 1e-12);            // of {0.1, 0.25}
  EXPECT_NEAR(m.tpot_p99, 0.1 + 0.99 * 0.15, 1e-12);  // rank 0.99
  // No request of more than one token: no TPOT at all.
  const ServingMetrics one = serving_metrics({{0.0, 0.4, 0.4, 1}});
  EXPECT_EQ(one.tpot_requests, 0);
  EXPECT_TRUE(std::isnan(one.tpot_median));
  EXPECT_DOUBLE_EQ(one.ttft_p99, 0.4);
}
