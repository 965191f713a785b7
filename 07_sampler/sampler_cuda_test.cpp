// The GPU sampler picks the same tokens as the CPU sampler from the same logits and random streams.
//
//   SameTokensAsCpu                    greedy and temperature rows (sample_kernel)
//   PruningNeverChangesTheToken        sample_kernel skipping the entries that cannot win against scoring
//                                      them all: flat rows, near ties, huge scores, masked entries
//   TopKTopPSameTokensAsCpu            a grid of settings (greedy, temperature, top-k, top-p, both) on bf16
//                                      and heavily tied logits, vocab 1000, 5003 and 151,936: every row
//   TopKTopPBoundaryTiesLowestIdsFirst, TopKTopPFlatRowsCutInIdOrder   ties at the cut, lowest ids kept
//   TopKTopPNonFiniteRowsGiveMinusOne  NaN anywhere or an infinite maximum: -1
//   TopKTopPInsideACudaGraph           captured once, replayed with new rows and logits; deterministic
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <algorithm>
#include <limits>
#include <string>

#include "07_sampler/sampler.h"
#include "07_sampler/sampler_test_inputs.h"
#include "07_sampler/sampler_top_k_top_p.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

TEST(Ch07_SamplerCuda, SameTokensAsCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  // 1001: rows that start off a 16-byte boundary (the pruned loop's scalar loads) and ragged chunk ends.
  for (int vocab : {512, 1000, 1001, 151936}) {
    const int rows = 64;
    std::vector<float> logits = random_bf16_values(size_t(rows) * vocab, rng, 3.0f);
    std::vector<SamplingRow> settings(rows);
    for (int b = 0; b < rows; b++) {
      float temperature = b % 4 == 0 ? 0.0f : 0.3f + 0.1f * float(b % 9);
      settings[b] = {temperature, 0, 1.0f, uint64_t(rng()), uint64_t(b * 7)};
    }
    // A tie: the lowest index must win on both; and one between the first and the last of a row's chunks
    // (at 64 rows the GPU splits each row over 5 blocks).
    logits[5] = logits[9] = 100.0f;
    logits[size_t(4) * vocab + 7] = logits[size_t(4) * vocab + vocab - 2] = 100.0f;
    std::vector<int32_t> want(rows);
    sample_cpu(want.data(), logits.data(), rows, vocab, settings.data());
    EXPECT_EQ(want[0], 5);
    EXPECT_EQ(want[4], 7);
    DeviceArray<float> d_logits(logits);
    DeviceArray<SamplingRow> d_rows(settings);
    DeviceArray<int32_t> d_tokens{static_cast<size_t>(rows)};
    d_tokens.poison();
    sample_cuda(d_tokens.ptr, d_logits.ptr, rows, vocab, d_rows.ptr, 0);
    EXPECT_EQ(d_tokens.get(), want) << "vocab " << vocab;
  }
}

TEST(Ch07_SamplerCuda, PruningNeverChangesTheToken) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const int vocab = 151936;
  for (int rows : {1, 64, 300}) {  // 8, 5 and 1 blocks per row
    std::vector<float> logits = random_bf16_values(size_t(rows) * vocab, rng, 3.0f);
    std::vector<SamplingRow> settings(rows);
    for (int b = 0; b < rows; b++) {
      float* row = logits.data() + size_t(b) * vocab;
      SamplingRow& s = settings[b];
      s = {0.3f + 0.1f * float(b % 9), 0, 1.0f, uint64_t(rng()), uint64_t(b * 3 + 1)};
      switch (b % 5) {
        case 0:  // random logits, as the model's
          break;
        case 1:  // flat: the noise alone decides
          std::fill(row, row + vocab, 1.5f);
          break;
        case 2: {  // two entries far above the rest whose scores tie to within rounding: j's logit is
                   // chosen so that l_j / T + g_j = l_i / T + g_i (the bar must not skip the later one)
          std::fill(row, row + vocab, -40.0f);
          const int i = int(rng() % uint32_t(vocab)), j = int(rng() % uint32_t(vocab));
          const float gi = gumbel_noise(s.seed, s.step, uint32_t(i)), gj = gumbel_noise(s.seed, s.step, uint32_t(j));
          row[i] = 5.0f;
          row[j] = s.temperature * (5.0f / s.temperature + gi - gj);
          break;
        }
        case 3:  // scores near 1e5: a bar's margin of 1e-4 |best| is 10 units here, an ulp 0.008
          s.temperature = 2e-5f;
          for (int v = 0; v < vocab; v++) row[v] *= 1.0f / 3.0f;
          break;
        case 4:  // most entries masked, the rest tied
          for (int v = 0; v < vocab; v++) row[v] = v % 97 == 0 ? 0.25f : -INFINITY;
          break;
      }
    }
    DeviceArray<float> d_logits(logits);
    DeviceArray<SamplingRow> d_rows(settings);
    DeviceArray<int32_t> pruned{static_cast<size_t>(rows)}, scored{static_cast<size_t>(rows)};
    pruned.poison();
    scored.poison();
    sample_cuda(pruned.ptr, d_logits.ptr, rows, vocab, d_rows.ptr, 0, true);
    sample_cuda(scored.ptr, d_logits.ptr, rows, vocab, d_rows.ptr, 0, false);
    const std::vector<int32_t> got = pruned.get(), want = scored.get();
    for (int b = 0; b < rows; b++) {
      EXPECT_GE(want[b], 0) << "row " << b;
      EXPECT_EQ(got[b], want[b]) << rows << " rows, row " << b << " (" << describe(settings[b]) << ")";
    }
    // And the CPU spec on the rows whose winner is not decided by a last-ulp difference of logf.
    for (int b = 0; b < rows; b++) {
      if (b % 5 == 2) continue;
      EXPECT_EQ(got[b], sample_row_cpu(logits.data() + size_t(b) * vocab, vocab, settings[b])) << "row " << b;
    }
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

namespace {

// tokens (rows.size(),) from sample_cuda (both kernels) on logits (rows.size(), vocab).
std::vector<int32_t> gpu_tokens(const std::vector<float>& logits, int vocab, const std::vector<SamplingRow>& rows) {
  DeviceArray<float> d_logits(logits);
  DeviceArray<SamplingRow> d_rows(rows);
  DeviceArray<int32_t> d_tokens{rows.size()};
  d_tokens.poison();
  sample_cuda(d_tokens.ptr, d_logits.ptr, int(rows.size()), vocab, d_rows.ptr, 0);
  return d_tokens.get();
}

// Expects got[b] == sample_row_cpu's token for every row b of logits (rows.size(), vocab). A mismatch
// also shows the CPU mirror's token (sample_row_top_k_top_p_cpu): if it equals the GPU's, the CPU mirror
// and the definition disagree (see the CPU tests); if it equals the CPU's, the kernel's parallel passes
// went wrong.
void expect_cpu_tokens(const std::vector<int32_t>& got, const std::vector<float>& logits, int vocab,
                       const std::vector<SamplingRow>& rows, const std::string& what) {
  int failures = 0;
  for (size_t b = 0; b < rows.size() && failures < 10; b++) {
    const float* row_logits = logits.data() + b * size_t(vocab);
    const int32_t want = sample_row_cpu(row_logits, vocab, rows[b]);
    if (got[b] == want) continue;
    failures++;
    ADD_FAILURE() << what << ", row " << b << " (" << describe(rows[b]) << "): GPU " << got[b] << ", CPU " << want
                  << ", CPU mirror of the kernel "
                  << (is_top_k_top_p_row(rows[b], vocab) ? std::to_string(sample_row_top_k_top_p_cpu(row_logits, vocab, rows[b]))
                                                         : std::string("(not a top-k/top-p row)"));
  }
}

}  // namespace

TEST(Ch07_SamplerCuda, TopKTopPSameTokensAsCpu) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  for (int vocab : {1000, 5003, 151936}) {
    for (int kind = 0; kind < 2; kind++) {  // bf16 logits (a few ties), quantised logits (many)
      std::vector<SamplingRow> rows = settings_grid(vocab, rng);
      if (vocab < 100000) {  // the grid again, other seeds and steps (not at 151,936: the CPU's sorts are slow)
        const std::vector<SamplingRow> more = settings_grid(vocab, rng);
        rows.insert(rows.end(), more.begin(), more.end());
      }
      std::vector<float> logits;
      for (size_t b = 0; b < rows.size(); b++) {
        const std::vector<float> row = kind == 0 ? bf16_logits(size_t(vocab), rng) : quantised_logits(size_t(vocab), rng);
        logits.insert(logits.end(), row.begin(), row.end());
      }
      const std::string what = "vocab " + std::to_string(vocab) + (kind == 0 ? ", bf16 logits" : ", quantised logits");
      const std::vector<int32_t> got = gpu_tokens(logits, vocab, rows);
      expect_cpu_tokens(got, logits, vocab, rows, what);
      EXPECT_EQ(gpu_tokens(logits, vocab, rows), got) << what << ": a second run differs";
    }
  }
}

TEST(Ch07_SamplerCuda, TopKTopPBoundaryTiesLowestIdsFirst) {
  SKIP_WITHOUT_GPU();
  // Three logits at 1 (ids 100, 500, 900), 997 at 0 (id 3 at -0.0, which ties with +0.0). top_k 10 keeps
  // ids 0..6 of the zeros; top_p 0.02 ids 0..11; both (top_k 10, top_p 0.9) ids 0..5 (the CPU test
  // Ch07_TopKTopP.BoundaryTiesKeepTheLowestIds works the numbers). 64 draws each (steps 0..63).
  const int vocab = 1000;
  std::vector<float> one(size_t(vocab), 0.0f);
  one[100] = one[500] = one[900] = 1.0f;
  one[3] = -0.0f;
  std::vector<SamplingRow> rows;
  std::vector<float> logits;
  for (SamplingRow setting : {SamplingRow{1.0f, 10, 1.0f, 77, 0}, SamplingRow{1.0f, 0, 0.02f, 78, 0},
                              SamplingRow{1.0f, 10, 0.9f, 79, 0}})
    for (uint64_t step = 0; step < 64; step++) {
      setting.step = step;
      rows.push_back(setting);
      logits.insert(logits.end(), one.begin(), one.end());
    }
  const std::vector<int32_t> got = gpu_tokens(logits, vocab, rows);
  expect_cpu_tokens(got, logits, vocab, rows, "boundary ties");
  int ties_drawn = 0;
  for (size_t b = 0; b < rows.size(); b++) {
    const std::vector<int> kept = kept_by_definition(one.data(), vocab, rows[b]);
    EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), got[b])) << "row " << b << ": token " << got[b];
    ties_drawn += got[b] < 12;
  }
  EXPECT_GT(ties_drawn, 20) << "the ties at the boundary are hardly ever drawn";
}

TEST(Ch07_SamplerCuda, TopKTopPFlatRowsCutInIdOrder) {
  SKIP_WITHOUT_GPU();
  // 1024 equal logits: top_p 0.25 keeps ids 0..255 (1/1024 sums exactly, on the CPU too), top_k 300 ids
  // 0..299. Every logit is a tie at the threshold, and each warp's chunk holds 32 of them: the ranks
  // cross warps.
  const int vocab = 1024;
  const std::vector<float> flat(size_t(vocab), 0.5f);
  std::vector<SamplingRow> rows;
  std::vector<float> logits;
  for (uint64_t step = 0; step < 128; step++) {
    rows.push_back(step % 2 ? SamplingRow{1.0f, 0, 0.25f, 5, step} : SamplingRow{1.0f, 300, 1.0f, 5, step});
    logits.insert(logits.end(), flat.begin(), flat.end());
  }
  const std::vector<int32_t> got = gpu_tokens(logits, vocab, rows);
  expect_cpu_tokens(got, logits, vocab, rows, "flat rows");
  for (size_t b = 0; b < rows.size(); b++) {
    EXPECT_GE(got[b], 0) << "row " << b;
    EXPECT_LT(got[b], rows[b].top_k ? 300 : 256) << "row " << b;
  }
}

TEST(Ch07_SamplerCuda, TopKTopPNonFiniteRowsGiveMinusOne) {
  SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  const int vocab = 5003;
  Rng rng(12);
  std::vector<float> logits = bf16_logits(size_t(4) * vocab, rng);
  logits[size_t(0) * vocab + 17] = std::nanf("");          // row 0: a NaN
  logits[size_t(1) * vocab + 4000] = inf;                  // row 1: +inf
  std::fill(logits.begin() + 2 * vocab, logits.begin() + 3 * vocab, -inf);  // row 2: every logit -inf
  for (int i = 0; i < vocab; i += 3) logits[size_t(3) * vocab + size_t(i)] = -inf;  // row 3: some -inf, fine
  const std::vector<SamplingRow> rows = {{1.0f, 50, 1.0f, 1, 2}, {0.7f, 0, 0.9f, 3, 4}, {1.0f, 5, 0.5f, 5, 6},
                                         {1.0f, vocab - 1, 0.999f, 7, 8}};
  const std::vector<int32_t> got = gpu_tokens(logits, vocab, rows);
  EXPECT_EQ(got[0], -1);
  EXPECT_EQ(got[1], -1);
  EXPECT_EQ(got[2], -1);
  EXPECT_EQ(got[3], sample_row_cpu(logits.data() + size_t(3) * vocab, vocab, rows[3]));
}

TEST(Ch07_SamplerCuda, TopKTopPInsideACudaGraph) {
  SKIP_WITHOUT_GPU();
  // As the model runner does: capture sample_cuda once on placeholder (greedy) rows, then replay the
  // graph after writing new rows and logits into the same buffers.
  const int vocab = 5003;
  Rng rng(13);
  std::vector<SamplingRow> rows = settings_grid(vocab, rng);
  const size_t n = rows.size();
  DeviceArray<float> d_logits{n * size_t(vocab)};
  DeviceArray<SamplingRow> d_rows(std::vector<SamplingRow>(n, SamplingRow{0.0f, 0, 1.0f, 0, 0}));
  DeviceArray<int32_t> d_tokens{n};
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  sample_cuda(d_tokens.ptr, d_logits.ptr, int(n), vocab, d_rows.ptr, stream);
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 2; round++) {
    if (round == 1) rows = settings_grid(vocab, rng);  // other seeds and steps
    const std::vector<float> logits = round == 0 ? bf16_logits(n * size_t(vocab), rng) : quantised_logits(n * size_t(vocab), rng);
    CUDA_CHECK(cudaMemcpy(d_logits.ptr, logits.data(), sizeof(float) * logits.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_rows.ptr, rows.data(), sizeof(SamplingRow) * n, cudaMemcpyHostToDevice));
    d_tokens.poison();
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<int32_t> got = d_tokens.get();
    expect_cpu_tokens(got, logits, vocab, rows, "graph replay " + std::to_string(round));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(d_tokens.get(), got) << "graph replay " << round << ": a second replay differs";
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

#else
TEST(Ch07_SamplerCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
