// The GPU sampler picks the same tokens as the CPU sampler from the same logits and random streams.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <algorithm>

#include "07_sampler/sampler.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

TEST(Ch07_SamplerCuda, SameTokensAsCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  for (int vocab : {512, 1000, 151936}) {
    const int rows = 64;
    std::vector<float> logits = random_bf16_values(size_t(rows) * vocab, rng, 3.0f);
    std::vector<SamplingRow> settings(rows);
    for (int b = 0; b < rows; b++) {
      float temperature = b % 4 == 0 ? 0.0f : 0.3f + 0.1f * float(b % 9);
      settings[b] = {temperature, 0, 1.0f, uint64_t(rng()), uint64_t(b * 7)};
    }
    // A tie: the lowest index must win on both.
    logits[5] = logits[9] = 100.0f;
    std::vector<int32_t> want(rows);
    sample_cpu(want.data(), logits.data(), rows, vocab, settings.data());
    EXPECT_EQ(want[0], 5);
    DeviceArray<float> d_logits(logits);
    DeviceArray<SamplingRow> d_rows(settings);
    DeviceArray<int32_t> d_tokens{static_cast<size_t>(rows)};
    d_tokens.poison();
    sample_cuda(d_tokens.ptr, d_logits.ptr, rows, vocab, d_rows.ptr, 0);
    EXPECT_EQ(d_tokens.get(), want) << "vocab " << vocab;
  }
}

TEST(Ch07_SamplerCuda, TinyTemperaturesGiveTheArgmax) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const int rows = 8, vocab = 151936;
  std::vector<float> logits = random_bf16_values(size_t(rows) * vocab, rng, 3.0f);
  std::vector<SamplingRow> settings(rows);
  std::vector<int32_t> want(rows);
  for (int b = 0; b < rows; b++) {
    settings[b] = {b % 2 ? 1e-40f : 1e-10f, 0, 1.0f, uint64_t(rng()), uint64_t(b)};
    const float* row = logits.data() + size_t(b) * vocab;
    want[b] = int32_t(std::max_element(row, row + vocab) - row);
  }
  DeviceArray<float> d_logits(logits);
  DeviceArray<SamplingRow> d_rows(settings);
  DeviceArray<int32_t> d_tokens{static_cast<size_t>(rows)};
  d_tokens.poison();
  sample_cuda(d_tokens.ptr, d_logits.ptr, rows, vocab, d_rows.ptr, 0);
  EXPECT_EQ(d_tokens.get(), want);
}

TEST(Ch07_SamplerCuda, NonFiniteLogitsGiveNoToken) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  const int rows = 6, vocab = 5000;
  std::vector<float> logits = random_bf16_values(size_t(rows) * vocab, rng, 3.0f);
  logits[size_t(0) * vocab + 4321] = NAN;        // one NaN
  logits[size_t(1) * vocab + 17] = INFINITY;     // one +Inf
  for (int i = 0; i < vocab; i++) logits[size_t(2) * vocab + i] = -INFINITY;  // nothing but -Inf
  logits[size_t(3) * vocab + 5] = -INFINITY;     // a masked entry: fine
  std::vector<SamplingRow> settings(rows);
  for (int b = 0; b < rows; b++) settings[b] = {b % 2 ? 0.7f : 0.0f, 0, 1.0f, uint64_t(rng()), uint64_t(b)};
  std::vector<int32_t> want(rows);
  sample_cpu(want.data(), logits.data(), rows, vocab, settings.data());
  EXPECT_EQ(want[0], -1);
  EXPECT_EQ(want[1], -1);
  EXPECT_EQ(want[2], -1);
  EXPECT_GE(want[3], 0);
  DeviceArray<float> d_logits(logits);
  DeviceArray<SamplingRow> d_rows(settings);
  DeviceArray<int32_t> d_tokens{static_cast<size_t>(rows)};
  d_tokens.poison();
  sample_cuda(d_tokens.ptr, d_logits.ptr, rows, vocab, d_rows.ptr, 0);
  EXPECT_EQ(d_tokens.get(), want);
}

#else
TEST(Ch07_SamplerCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
