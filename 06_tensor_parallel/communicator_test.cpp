// The CPU collectives against a plain sum: N ranks as N threads, odd sizes, many calls in a row (a fast
// rank must never read a slow rank's previous round), and gather's column layout with a padded width.
#include "06_tensor_parallel/communicator.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/test_util.h"

using namespace nanovllm;

namespace {

// Runs body(rank) on world_size threads at once and waits for all of them.
template <class F>
void on_ranks(int world_size, F body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; r++) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace

TEST(Ch06_Communicator, AllReduceIsThePlainSumOnEveryRank) {
  for (int world : {1, 2, 3, 4}) {
    test::Rng rng(static_cast<uint64_t>(world));
    const std::vector<int64_t> sizes = {1, 7, 8, 1000, 4097};
    // inputs[call][rank]: fresh values for every call.
    std::vector<std::vector<std::vector<float>>> inputs;
    for (int64_t n : sizes) {
      inputs.emplace_back();
      for (int r = 0; r < world; r++) inputs.back().push_back(test::random_vector(size_t(n), rng));
    }
    std::vector<std::vector<std::vector<float>>> results = inputs;
    CpuCommunicator comm(world);
    on_ranks(world, [&](int rank) {
      for (size_t call = 0; call < sizes.size(); call++) comm.all_reduce(rank, results[call][size_t(rank)].data(), sizes[call]);
    });
    for (size_t call = 0; call < sizes.size(); call++) {
      for (int64_t i = 0; i < sizes[call]; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) want += inputs[call][size_t(r)][size_t(i)];  // rank order
        for (int r = 0; r < world; r++)
          ASSERT_EQ(results[call][size_t(r)][size_t(i)], want) << "world " << world << " call " << call << " rank " << r;
      }
    }
  }
}

TEST(Ch06_Communicator, ManyCallsInARowNeverMixRounds) {
  const int world = 3, calls = 300;
  CpuCommunicator comm(world);
  // Call c on rank r reduces the value (c + 1) * (r + 1) in every element: the sum is 6 (c + 1).
  std::vector<int> bad(world, 0);
  on_ranks(world, [&](int rank) {
    std::vector<float> x(37);
    for (int c = 0; c < calls; c++) {
      std::fill(x.begin(), x.end(), float((c + 1) * (rank + 1)));
      comm.all_reduce(rank, x.data(), int64_t(x.size()));
      for (float v : x) bad[size_t(rank)] += v != float(6 * (c + 1));
    }
  });
  for (int r = 0; r < world; r++) EXPECT_EQ(bad[size_t(r)], 0) << "rank " << r;
}

TEST(Ch06_Communicator, GatherPlacesShardsSideBySideAndCutsThePadding) {
  // A vocabulary of 10 over 4 ranks: shards of 3 columns, the last one padded by 2.
  const int world = 4, rows = 2, shard_cols = 3, out_cols = 10;
  CpuCommunicator comm(world);
  std::vector<float> out(size_t(rows) * out_cols, -1.0f);
  on_ranks(world, [&](int rank) {
    std::vector<float> shard(size_t(rows) * shard_cols);
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < shard_cols; j++) shard[size_t(i) * shard_cols + j] = float(100 * i + rank * shard_cols + j);
    comm.gather(rank, shard.data(), rows, shard_cols, rank == 0 ? out.data() : nullptr, out_cols);
  });
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < out_cols; j++) EXPECT_EQ(out[size_t(i) * out_cols + j], float(100 * i + j)) << i << "," << j;
}
