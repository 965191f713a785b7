// Tests for the CPU references of the collectives (all_reduce.h), the answers the CUDA kernels are held to.
//
//   AllReduceCpu   known answers: fp32 accumulation rounded once (not once per addition), rank order
//                  (fp32 addition is not associative, so the order is part of the answer), -0; and the
//                  inputs of the GPU tests (all_reduce_test_inputs.h): adding them in another order
//                  changes many sums, so those tests can see a wrong order
//   GatherCpu      the shards side by side, the padding cut at out_cols
#include "06_tensor_parallel/all_reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "01_sequence/base/bf16.h"
#include "06_tensor_parallel/all_reduce_test_inputs.h"

using namespace nanovllm;

namespace {

// The sum of one element per rank, as all_reduce_cpu computes it.
float reduce(const std::vector<float>& per_rank) {
  std::vector<uint16_t> bits;
  for (float v : per_rank) bits.push_back(float_to_bf16(v));
  std::vector<const uint16_t*> x;
  for (const uint16_t& b : bits) x.push_back(&b);
  uint16_t out = 0;
  all_reduce_cpu(&out, x.data(), int(x.size()), 1);
  return bf16_to_float(out);
}

}  // namespace

TEST(Ch06_AllReduceCpu, AddsInFp32AndRoundsOnce) {
  // 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly in fp32, a bf16 value. Rounding after each addition would lose
  // both halves: 1 + 2^-8 is a tie between 1 and 1 + 2^-7, and ties go to the even 1.
  EXPECT_EQ(reduce({1.0f, 0x1p-8f, 0x1p-8f}), 1.0f + 0x1p-7f);
  EXPECT_EQ(reduce({3.0f}), 3.0f);  // one rank: its own values
}

TEST(Ch06_AllReduceCpu, AddsInRankOrder) {
  // (1 + 2^-24) - 1: 1 + 2^-24 is a tie in fp32 and rounds to 1, so the sum is 0.
  EXPECT_EQ(reduce({1.0f, 0x1p-24f, -1.0f}), 0.0f);
  // (-1 + 2^-24) + 1: -1 + 2^-24 is exact in fp32, so the sum is 2^-24.
  EXPECT_EQ(reduce({-1.0f, 0x1p-24f, 1.0f}), 0x1p-24f);
  // Starting from rank 0's value, not from +0: -0 + -0 is -0.
  EXPECT_TRUE(std::signbit(reduce({-0.0f, -0.0f})));
}

TEST(Ch06_AllReduceCpu, TheTestInputsSeeTheOrder) {
  // The GPU tests compare bits with all_reduce_cpu on reduce_inputs: a kernel that added in another order
  // must fail them. Three plausible wrong orders, each must change many sums.
  test::Rng rng(31);
  const int64_t n = 10000;
  const std::vector<std::vector<uint16_t>> x = test::reduce_inputs(4, n, rng);
  const std::vector<uint16_t> want = test::reduce_reference(x);
  const std::vector<std::vector<uint16_t>> rotated = {x[1], x[2], x[3], x[0]};  // each rank starting with its own
  const std::vector<std::vector<uint16_t>> reversed = {x[3], x[2], x[1], x[0]};
  std::vector<std::vector<uint16_t>> orders = {test::reduce_reference(rotated), test::reduce_reference(reversed)};
  std::vector<uint16_t> pairwise(size_t(n), 0);  // (x0 + x1) + (x2 + x3)
  for (int64_t i = 0; i < n; i++) {
    auto f = [&](int r) { return bf16_to_float(x[size_t(r)][size_t(i)]); };
    pairwise[size_t(i)] = float_to_bf16((f(0) + f(1)) + (f(2) + f(3)));
  }
  orders.push_back(pairwise);
  for (size_t k = 0; k < orders.size(); k++) {
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) differ += orders[k][size_t(i)] != want[size_t(i)];
    EXPECT_GT(differ, n / 50) << "order " << k << " changes " << differ << " of " << n << " sums";
  }
}

TEST(Ch06_GatherCpu, ShardsSideBySideCutAtOutCols) {
  // 3 ranks, 2 rows, 2 columns per shard, 5 kept columns: rank 2's second column is padding. out has two guard
  // values after its 10: a gather that wrote the padding column too would put the last row's -1 past the end
  // (every earlier row's is overwritten by the row after it, so only the guard shows it).
  const std::vector<float> s0 = {1, 2, 3, 4}, s1 = {5, 6, 7, 8}, s2 = {9, -1, 10, -1};
  const float* shards[] = {s0.data(), s1.data(), s2.data()};
  std::vector<float> out(10 + 2, -7.0f);
  gather_cpu(out.data(), shards, 3, 2, 2, 5);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 5, 6, 9, 3, 4, 7, 8, 10, -7, -7}));
}
