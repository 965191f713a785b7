// The CPU collectives against a plain sum: N ranks as N threads, odd sizes, many calls in a row (a fast
// rank must never read a slow rank's previous round), gather's column layout with a padded width, and a shard
// buffer rewritten as soon as gather returns. Then
// the failure paths of the CPU side of tensor parallelism: the barrier's abort and RankThreads' rethrow.
#include "06_tensor_parallel/communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "06_tensor_parallel/rank_threads.h"

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

// The sum starts from rank 0's value, not from 0.0f (communicator.cpp, as all_reduce_cpu): in IEEE arithmetic -0 + -0
// is -0, while 0 + -0 + -0 is +0. Every rank holding -0 must get -0 back, sign bit and all.
TEST(Ch06_Communicator, AllReduceOfNegativeZerosIsNegativeZero) {
  for (int world : {2, 3}) {
    CpuCommunicator comm(world);
    std::vector<std::vector<float>> x(size_t(world), std::vector<float>{-0.0f, -0.0f, 1.0f});
    on_ranks(world, [&](int rank) { comm.all_reduce(rank, x[size_t(rank)].data(), 3); });
    for (int r = 0; r < world; r++) {
      EXPECT_TRUE(x[size_t(r)][0] == 0.0f && std::signbit(x[size_t(r)][0])) << "world " << world << " rank " << r;
      EXPECT_TRUE(std::signbit(x[size_t(r)][1])) << "world " << world << " rank " << r;
      EXPECT_EQ(x[size_t(r)][2], float(world));
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

namespace {

// Each rank holds columns [rank * shard_cols, (rank + 1) * shard_cols) of a rows x out_cols matrix whose entry
// (i, j) is 100 i + j, padding past out_cols included; rank 0 gathers them and must get the matrix back whole.
void expect_gather_puts_shards_side_by_side(int world, int rows, int shard_cols, int out_cols) {
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

}  // namespace

TEST(Ch06_Communicator, GatherPlacesShardsSideBySideAndCutsThePadding) {
  // A vocabulary of 10 over 4 ranks: shards of 3 columns, the last one padded by 2.
  expect_gather_puts_shards_side_by_side(/*world=*/4, /*rows=*/2, /*shard_cols=*/3, /*out_cols=*/10);
}

// A vocabulary of 5 over 4 ranks: shards of ceil(5 / 4) = 2 columns, so rank 3's columns would start at 6, past
// the end. That rank holds only padding and adds nothing: out is the first 5 of the 8 columns side by side.
TEST(Ch06_Communicator, GatherSkipsARankWhoseShardIsAllPadding) {
  expect_gather_puts_shards_side_by_side(/*world=*/4, /*rows=*/3, /*shard_cols=*/2, /*out_cols=*/5);
}

// gather returns on a rank only once rank 0 has read every shard, so that a rank may write its next shard into the
// same buffer at once (communicator.h). Here every rank does: 200 gathers in a row from one reused buffer per rank,
// each call's entries (i, j) = (7 c + 3 i + j) mod 4096 for call c, and rank 0 checks each call's matrix. A gather that
// let a rank go as soon as the shards were published (before rank 0 had copied them) would mix in entries of the next
// call. The shards are wide (300 columns of 4 rows) so that rank 0's copy is slow enough for that to show.
TEST(Ch06_Communicator, ARankRewritesItsShardOnlyAfterRankZeroHasReadIt) {
  const int world = 3, rows = 4, shard_cols = 300, out_cols = 850, calls = 200;
  const auto entry = [](int c, int i, int j) { return float((7 * c + 3 * i + j) % 4096); };
  CpuCommunicator comm(world);
  std::vector<float> out(size_t(rows) * out_cols);
  int bad_calls = 0;  // written by rank 0 only
  on_ranks(world, [&](int rank) {
    std::vector<float> shard(size_t(rows) * shard_cols);  // reused by every call, as the engine's logits shard is
    for (int c = 0; c < calls; c++) {
      for (int i = 0; i < rows; i++)
        for (int j = 0; j < shard_cols; j++) shard[size_t(i) * shard_cols + j] = entry(c, i, rank * shard_cols + j);
      comm.gather(rank, shard.data(), rows, shard_cols, rank == 0 ? out.data() : nullptr, out_cols);
      if (rank != 0) continue;
      bool ok = true;
      for (int i = 0; i < rows; i++)
        for (int j = 0; j < out_cols; j++) ok &= out[size_t(i) * out_cols + j] == entry(c, i, j);
      bad_calls += !ok;
    }
  });
  EXPECT_EQ(bad_calls, 0) << "of " << calls << " gathers, these read a shard its rank had already rewritten";
}

// A communicator of no ranks is refused: its barrier would wait for a count of 0 that no arrival ever reaches; a
// negative count gets the same error, not the vector's length_error.
TEST(Ch06_Communicator, AWorldOfNoRanksIsRefused) {
  EXPECT_EQ(test::error_of([] { CpuCommunicator comm(0); }), "a communicator needs at least one rank, got 0");
  EXPECT_EQ(test::error_of([] { CpuCommunicator comm(-1); }), "a communicator needs at least one rank, got -1");
}

// abort() makes every wait, now and later, throw (communicator.h). One thread waits twice on a barrier of two after
// the abort: if a wait after the abort still counted as an arrival, the second would complete the round and return.
TEST(Ch06_Communicator, AfterAnAbortEveryLaterWaitThrows) {
  Barrier barrier(2);
  barrier.abort();
  for (int i = 0; i < 2; i++)
    EXPECT_EQ(test::error_of([&] { barrier.wait(); }), "another tensor-parallel rank failed") << "wait " << i;
}

// A rank already waiting when another fails is let out with the error, not as if the round had completed (it would
// go on to read the failed rank's buffer). The pause lets the waiter reach wait() first; the expected error is the
// same whichever comes first.
TEST(Ch06_Communicator, AnAbortLetsAWaitingRankOutWithAnError) {
  Barrier barrier(2);
  std::string error = "the wait returned";
  std::thread waiter([&] { error = test::error_of([&] { barrier.wait(); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  barrier.abort();
  waiter.join();
  EXPECT_EQ(error, "another tensor-parallel rank failed");
}

// RankThreads::run rethrows a rank's failure (rank_threads.h), rank 0's (the caller's thread) as well as a worker's.
TEST(Ch06_RankThreads, AFailureOnAnyRankIsRethrownByRun) {
  RankThreads ranks(3);
  for (int failing = 0; failing < 3; failing++) {
    std::vector<int> ran(3, 0);
    const std::string error = test::error_of([&] {
      ranks.run([&](int rank) {
        ran[size_t(rank)]++;
        if (rank == failing) fail("rank ", rank, " failed");
      });
    });
    EXPECT_EQ(error, "rank " + std::to_string(failing) + " failed");
    EXPECT_EQ(ran, (std::vector<int>{1, 1, 1})) << "every rank ran the job once";
  }
}

// When several ranks fail, run() rethrows the first failure and on_failure runs once (rank_threads.h): the order is
// fixed here by rank 1 failing only after rank 0's failure was reported. The run after a failed one starts clean.
TEST(Ch06_RankThreads, TheFirstFailureIsRethrownAndReportedOnceAndTheNextRunStartsClean) {
  std::atomic<int> reported{0};
  RankThreads ranks(2, [&] { reported++; });
  const std::string error = test::error_of([&] {
    ranks.run([&](int rank) {
      if (rank == 0) fail("rank 0 failed first");
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);  // never hang the suite
      while (reported.load() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      fail("rank 1 failed second");
    });
  });
  EXPECT_EQ(error, "rank 0 failed first");
  EXPECT_EQ(reported.load(), 1);
  std::vector<int> ran(2, 0);
  EXPECT_EQ(test::error_of([&] { ranks.run([&](int rank) { ran[size_t(rank)]++; }); }), "");
  EXPECT_EQ(ran, (std::vector<int>{1, 1}));
  EXPECT_EQ(reported.load(), 1);
}
