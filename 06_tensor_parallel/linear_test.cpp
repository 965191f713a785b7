// Tests for linear_cpu and the tensor-parallel shard functions (linear.h).
//
//   LinearCpu  known answers (exact small integers, identity, the 8-wide loop's tail), then random
//              shapes against a float64 product: n = 1, in_features not a multiple of 8, and two shapes
//              past the 4e6-flop threshold where the work is split over threads
//   Sharding   for tp_size 1, 2, 4 and every rank: each shard holds exactly the rows / columns its
//              rank owns, and the shards put back together are the full weight, bit for bit (float and
//              raw bf16 elements); QKV and gate/up packing; a non-divisible size throws Error naming it
//   Sharded    column parallel: the ranks' outputs side by side = the full output; row parallel: the
//   matmul     ranks' partial outputs summed = the full output; a column-parallel gate/up followed by a
//              row-parallel down_proj = the full MLP with one sum at the end (Megatron's pairing)
//
// Tolerance: ||y - ref|| / ||ref|| <= 1e-5 over the output, and each element within
// 1e-5 * sum_k |x_k W_k| (the scale of a dot product's rounding error) of the float64 value.
#include "06_tensor_parallel/linear.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include <cmath>
#include <string>
#include <vector>

using namespace nanovllm;

namespace {

constexpr double kTol = 1e-5;

// Inputs: test::Rng (tests/test_util.h), a fixed-seed splitmix64 of our own.
using test::Rng;
using test::random_vector;

std::vector<float> linear(const std::vector<float>& x, const std::vector<float>& W, int n, int in, int out) {
  std::vector<float> y(size_t(n) * out, std::nanf(""));  // NaN: an output the code forgets to write shows
  linear_cpu(y.data(), x.data(), W.data(), n, in, out);
  return y;
}

// The float64 product and, per element, sum_k |x_k W_k|.
struct Reference {
  std::vector<double> y, magnitude;
};

Reference reference_linear(const std::vector<float>& x, const std::vector<float>& W, int n, int in, int out) {
  Reference r{std::vector<double>(size_t(n) * out), std::vector<double>(size_t(n) * out)};
  for (int i = 0; i < n; i++)
    for (int o = 0; o < out; o++) {
      double sum = 0, magnitude = 0;
      for (int k = 0; k < in; k++) {
        const double term = double(x[size_t(i) * in + k]) * double(W[size_t(o) * in + k]);
        sum += term;
        magnitude += std::abs(term);
      }
      r.y[size_t(i) * out + o] = sum;
      r.magnitude[size_t(i) * out + o] = magnitude;
    }
  return r;
}

void expect_close(const std::vector<float>& y, const Reference& ref) {
  ASSERT_EQ(y.size(), ref.y.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < y.size(); i++) {
    const double e = double(y[i]) - ref.y[i];
    diff += e * e;
    norm += ref.y[i] * ref.y[i];
    ASSERT_LE(std::abs(e), kTol * ref.magnitude[i]) << "element " << i << ": got " << y[i] << ", expected " << ref.y[i];
  }
  EXPECT_LE(std::sqrt(diff / norm), kTol);
}

template <class T>
std::vector<T> concat(const std::vector<std::vector<T>>& parts) {
  std::vector<T> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no Error thrown)";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// linear_cpu

TEST(Ch06_LinearCpu, SmallIntegerKnownAnswer) {
  // y = x W^T with W stored (out, in), as in PyTorch; every value is exact in fp32.
  const std::vector<float> x = {1, 2, 3,  //
                                -1, 0.5f, 4};
  const std::vector<float> W = {1, 0, -1,  //
                                2, 2, 2,   //
                                0.25f, -0.5f, 1};
  EXPECT_EQ(linear(x, W, 2, 3, 3), (std::vector<float>{-2, 12, 2.25f, -5, 7, 3.5f}));
}

TEST(Ch06_LinearCpu, IdentityAndTheTailOfTheEightWideLoop) {
  // in = 11 = 8 + 3: the unrolled loop and its tail. W = I gives x back; a row of ones over x_k = 2^k
  // sums every term exactly to 2^11 - 1, so a dropped or doubled term shows.
  const int d = 11;
  std::vector<float> x(d), I(size_t(d) * d, 0.0f), ones(d, 1.0f);
  for (int k = 0; k < d; k++) x[k] = std::ldexp(1.0f, k);
  for (int k = 0; k < d; k++) I[size_t(k) * d + k] = 1;
  EXPECT_EQ(linear(x, I, 1, d, d), x);
  EXPECT_EQ(linear(x, ones, 1, d, 1), (std::vector<float>{2047}));
  for (int in : {1, 7, 8, 9, 15, 16, 17}) {  // the same check at every tail length
    std::vector<float> xs(static_cast<size_t>(in)), row(static_cast<size_t>(in), 1.0f);
    for (int k = 0; k < in; k++) xs[k] = std::ldexp(1.0f, k);
    EXPECT_EQ(linear(xs, row, 1, in, 1), (std::vector<float>{float((1 << in) - 1)})) << "in_features " << in;
  }
}

TEST(Ch06_LinearCpu, RandomShapesAgainstFloat64) {
  struct Shape {
    int n, in, out;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 7, 5}, Shape{3, 13, 9}, Shape{2, 8, 8}, Shape{4, 64, 48}, Shape{5, 17, 33},
                  Shape{1, 1000, 3}, Shape{7, 129, 31}, Shape{16, 1024, 64}}) {
    SCOPED_TRACE("n " + std::to_string(s.n) + ", in " + std::to_string(s.in) + ", out " + std::to_string(s.out));
    Rng rng(600 + s.n * 1000 + s.in);
    std::vector<float> x = random_vector(size_t(s.n) * s.in, rng), W = random_vector(size_t(s.out) * s.in, rng);
    expect_close(linear(x, W, s.n, s.in, s.out), reference_linear(x, W, s.n, s.in, s.out));
  }
}

TEST(Ch06_LinearCpu, LargeShapesOnTheThreadedPath) {
  // Above 4e6 flops linear_cpu splits the output features over up to 16 threads; out_features prime,
  // so the split is ragged, and n = 1 (a decode step) included. NaN-filled y shows any unwritten range.
  struct Shape {
    int n, in, out;
  };
  for (Shape s : {Shape{8, 1030, 701}, Shape{1, 2051, 1499}}) {
    SCOPED_TRACE("n " + std::to_string(s.n) + ", in " + std::to_string(s.in) + ", out " + std::to_string(s.out));
    ASSERT_GT(2.0 * s.n * s.in * s.out, 4e6) << "the shape must take the threaded path";
    Rng rng(610 + s.n);
    std::vector<float> x = random_vector(size_t(s.n) * s.in, rng), W = random_vector(size_t(s.out) * s.in, rng);
    expect_close(linear(x, W, s.n, s.in, s.out), reference_linear(x, W, s.n, s.in, s.out));
  }
}

// ---------------------------------------------------------------------------------------------------
// Shards: contents and reassembly, bit-exact

namespace {

// A (rows, cols) matrix whose every element is distinct and says where it came from.
template <class T>
std::vector<T> numbered_matrix(int64_t rows, int64_t cols, int salt) {
  std::vector<T> w(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++) w[size_t(i)] = T(salt * 1000 + i);
  return w;
}

template <class T>
void check_shard_rows(int64_t rows, int64_t cols) {
  const std::vector<T> w = numbered_matrix<T>(rows, cols, 1);
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<T>> shards;
    const int64_t part = rows / tp;
    for (int rank = 0; rank < tp; rank++) {
      shards.push_back(shard_rows(w, rows, cols, rank, tp));
      ASSERT_EQ(int64_t(shards.back().size()), part * cols) << "tp " << tp << " rank " << rank;
      for (int64_t i = 0; i < part; i++)
        for (int64_t c = 0; c < cols; c++)
          ASSERT_EQ(shards.back()[size_t(i * cols + c)], w[size_t((rank * part + i) * cols + c)])
              << "tp " << tp << " rank " << rank << " row " << i << " column " << c;
    }
    EXPECT_EQ(concat(shards), w) << "row shards of tp " << tp << " stacked";
  }
}

template <class T>
void check_shard_cols(int64_t rows, int64_t cols) {
  const std::vector<T> w = numbered_matrix<T>(rows, cols, 2);
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<T>> shards;
    const int64_t part = cols / tp;
    for (int rank = 0; rank < tp; rank++) {
      shards.push_back(shard_cols(w, rows, cols, rank, tp));
      ASSERT_EQ(int64_t(shards.back().size()), rows * part);
    }
    // Row r of the full matrix = row r of shard 0, then row r of shard 1, ...
    std::vector<T> rebuilt;
    for (int64_t r = 0; r < rows; r++)
      for (int rank = 0; rank < tp; rank++)
        rebuilt.insert(rebuilt.end(), shards[rank].begin() + r * part, shards[rank].begin() + (r + 1) * part);
    EXPECT_EQ(rebuilt, w) << "column shards of tp " << tp << " side by side";
  }
}

}  // namespace

TEST(Ch06_Sharding, ShardRowsStackBackToTheWeight) {
  check_shard_rows<float>(12, 5);
  check_shard_rows<uint16_t>(8, 7);  // raw bf16 checkpoint elements
  check_shard_rows<float>(4, 1);     // one row per rank at tp 4 (a vocab-parallel corner case)
}

TEST(Ch06_Sharding, ShardColsSitBackSideBySide) {
  check_shard_cols<float>(5, 12);
  check_shard_cols<uint16_t>(7, 8);
  check_shard_cols<float>(3, 4);  // one column per rank at tp 4
}

TEST(Ch06_Sharding, QkvPackingIsQThenKThenVOfTheRanksHeads) {
  // 8 query heads, 4 KV heads, head_dim 3, hidden 10: q (24, 10), k (12, 10), v (12, 10).
  const int num_heads = 8, num_kv_heads = 4, head_dim = 3, hidden = 10;
  const int64_t q_rows = num_heads * head_dim, kv_rows = num_kv_heads * head_dim;
  const std::vector<float> q = numbered_matrix<float>(q_rows, hidden, 3), k = numbered_matrix<float>(kv_rows, hidden, 4),
                           v = numbered_matrix<float>(kv_rows, hidden, 5);
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const int64_t q_part = q_rows / tp * hidden, kv_part = kv_rows / tp * hidden;
    std::vector<std::vector<float>> qs, ks, vs;
    for (int rank = 0; rank < tp; rank++) {
      std::vector<float> packed = pack_row_shards<float>({&q, &k, &v}, {q_rows, kv_rows, kv_rows}, hidden, rank, tp);
      ASSERT_EQ(int64_t(packed.size()), q_part + 2 * kv_part);
      qs.emplace_back(packed.begin(), packed.begin() + q_part);
      ks.emplace_back(packed.begin() + q_part, packed.begin() + q_part + kv_part);
      vs.emplace_back(packed.begin() + q_part + kv_part, packed.end());
      // The rank's first q row is row 0 of its first head, head rank * num_heads / tp.
      EXPECT_EQ(packed[0], q[size_t(rank * (num_heads / tp) * head_dim * hidden)]);
      EXPECT_EQ(packed[size_t(q_part)], k[size_t(rank * (num_kv_heads / tp) * head_dim * hidden)]);
    }
    EXPECT_EQ(concat(qs), q);
    EXPECT_EQ(concat(ks), k);
    EXPECT_EQ(concat(vs), v);
  }
}

TEST(Ch06_Sharding, MergedGateUpPackingIsGateThenUp) {
  const int64_t intermediate = 16, hidden = 6;
  const std::vector<uint16_t> gate = numbered_matrix<uint16_t>(intermediate, hidden, 6),
                              up = numbered_matrix<uint16_t>(intermediate, hidden, 7);
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const int64_t part = intermediate / tp * hidden;
    std::vector<std::vector<uint16_t>> gates, ups;
    for (int rank = 0; rank < tp; rank++) {
      std::vector<uint16_t> packed =
          pack_row_shards<uint16_t>({&gate, &up}, {intermediate, intermediate}, hidden, rank, tp);
      ASSERT_EQ(int64_t(packed.size()), 2 * part);
      gates.emplace_back(packed.begin(), packed.begin() + part);
      ups.emplace_back(packed.begin() + part, packed.end());
    }
    EXPECT_EQ(concat(gates), gate);
    EXPECT_EQ(concat(ups), up);
  }
}

TEST(Ch06_Sharding, DivideReturnsThePerRankSize) {
  EXPECT_EQ(divide(12, 4, "rows"), 3);
  EXPECT_EQ(divide(12, 1, "rows"), 12);
  EXPECT_EQ(divide(151936, 2, "vocab_size"), 75968);
}

TEST(Ch06_Sharding, NonDivisibleSizeThrowsErrorNamingTheDimension) {
  EXPECT_THROW(divide(10, 4, "num_kv_heads"), Error);
  const std::string message = error_of([] { divide(10, 4, "num_kv_heads"); });
  EXPECT_NE(message.find("num_kv_heads"), std::string::npos) << message;
  EXPECT_NE(message.find("10"), std::string::npos) << message;
  EXPECT_NE(message.find("4"), std::string::npos) << message;

  const std::string rows = error_of([] {
    std::vector<float> w(30);
    shard_rows(w, 10, 3, 0, 4);
  });
  EXPECT_NE(rows.find("rows (10)"), std::string::npos) << rows;
  const std::string cols = error_of([] {
    std::vector<float> w(30);
    shard_cols(w, 3, 10, 1, 4);
  });
  EXPECT_NE(cols.find("columns (10)"), std::string::npos) << cols;
  const std::string packed = error_of([] {  // q divides, k (6 rows) does not at tp 4
    std::vector<float> q(8 * 2), k(6 * 2);
    pack_row_shards<float>({&q, &k}, {8, 6}, 2, 0, 4);
  });
  EXPECT_NE(packed.find("rows (6)"), std::string::npos) << packed;
}

// ---------------------------------------------------------------------------------------------------
// Sharded matmuls equal the full one

TEST(Ch06_ShardedMatmul, ColumnParallelOutputsSideBySideAreTheFullOutput) {
  const int n = 3, in = 37, out = 24;
  Rng rng(620);
  const std::vector<float> x = random_vector(size_t(n) * in, rng), W = random_vector(size_t(out) * in, rng);
  const Reference ref = reference_linear(x, W, n, in, out);
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const int part = out / tp;
    std::vector<float> y(size_t(n) * out, std::nanf(""));
    for (int rank = 0; rank < tp; rank++) {
      std::vector<float> y_rank = linear(x, shard_rows(W, out, in, rank, tp), n, in, part);  // (n, out / tp)
      for (int i = 0; i < n; i++)
        for (int j = 0; j < part; j++) y[size_t(i) * out + rank * part + j] = y_rank[size_t(i) * part + j];
    }
    expect_close(y, ref);
  }
}

TEST(Ch06_ShardedMatmul, RowParallelPartialOutputsSumToTheFullOutput) {
  // Each rank holds columns [rank * in/tp, ...) of W and the same slice of x (the previous
  // column-parallel layer's output); the all-reduce adds the partial products.
  const int n = 3, in = 36, out = 20;
  Rng rng(630);
  const std::vector<float> x = random_vector(size_t(n) * in, rng), W = random_vector(size_t(out) * in, rng);
  const Reference ref = reference_linear(x, W, n, in, out);
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    std::vector<float> y(size_t(n) * out, 0.0f);
    for (int rank = 0; rank < tp; rank++) {
      std::vector<float> partial = linear(shard_cols(x, n, in, rank, tp), shard_cols(W, out, in, rank, tp), n, in / tp, out);
      for (size_t i = 0; i < y.size(); i++) y[i] += partial[i];  // the all-reduce
    }
    expect_close(y, ref);
  }
}

TEST(Ch06_ShardedMatmul, QkvShardOutputsAreTheRanksHeads) {
  // x (2, 40) through the packed per-rank QKV weight: columns [q | k | v] of the rank's heads equal the
  // matching head columns of the full q, k and v projections.
  const int n = 2, hidden = 40, num_heads = 8, num_kv_heads = 4, head_dim = 4;
  const int q_rows = num_heads * head_dim, kv_rows = num_kv_heads * head_dim;
  Rng rng(640);
  const std::vector<float> x = random_vector(size_t(n) * hidden, rng), Wq = random_vector(size_t(q_rows) * hidden, rng),
                           Wk = random_vector(size_t(kv_rows) * hidden, rng),
                           Wv = random_vector(size_t(kv_rows) * hidden, rng);
  const Reference rq = reference_linear(x, Wq, n, hidden, q_rows), rk = reference_linear(x, Wk, n, hidden, kv_rows),
                  rv = reference_linear(x, Wv, n, hidden, kv_rows);
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const int qp = q_rows / tp, kp = kv_rows / tp, width = qp + 2 * kp;
    std::vector<float> q(size_t(n) * q_rows), k(size_t(n) * kv_rows), v(size_t(n) * kv_rows);
    for (int rank = 0; rank < tp; rank++) {
      std::vector<float> W = pack_row_shards<float>({&Wq, &Wk, &Wv}, {q_rows, kv_rows, kv_rows}, hidden, rank, tp);
      std::vector<float> y = linear(x, W, n, hidden, width);  // (n, qp + kp + kp)
      for (int i = 0; i < n; i++) {
        for (int j = 0; j < qp; j++) q[size_t(i) * q_rows + rank * qp + j] = y[size_t(i) * width + j];
        for (int j = 0; j < kp; j++) k[size_t(i) * kv_rows + rank * kp + j] = y[size_t(i) * width + qp + j];
        for (int j = 0; j < kp; j++) v[size_t(i) * kv_rows + rank * kp + j] = y[size_t(i) * width + qp + kp + j];
      }
    }
    expect_close(q, rq);
    expect_close(k, rk);
    expect_close(v, rv);
  }
}

TEST(Ch06_ShardedMatmul, ColumnThenRowParallelMlpNeedsOneSum) {
  // Qwen3's MLP, down(silu(gate x) * up x): gate/up column parallel, down_proj row parallel over the
  // same intermediate slice, so each rank runs the whole MLP on its slice and one all-reduce finishes it.
  const int n = 3, hidden = 24, inter = 32;
  Rng rng(650);
  const std::vector<float> x = random_vector(size_t(n) * hidden, rng), gate = random_vector(size_t(inter) * hidden, rng),
                           up = random_vector(size_t(inter) * hidden, rng), down = random_vector(size_t(hidden) * inter, rng);
  // The float64 MLP.
  std::vector<double> expected(size_t(n) * hidden, 0.0);
  for (int i = 0; i < n; i++) {
    std::vector<double> act(inter);
    for (int j = 0; j < inter; j++) {
      double g = 0, u = 0;
      for (int c = 0; c < hidden; c++) {
        g += double(x[size_t(i) * hidden + c]) * gate[size_t(j) * hidden + c];
        u += double(x[size_t(i) * hidden + c]) * up[size_t(j) * hidden + c];
      }
      act[j] = g / (1 + std::exp(-g)) * u;
    }
    for (int o = 0; o < hidden; o++)
      for (int j = 0; j < inter; j++) expected[size_t(i) * hidden + o] += act[j] * down[size_t(o) * inter + j];
  }
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const int part = inter / tp;
    std::vector<float> y(size_t(n) * hidden, 0.0f);
    for (int rank = 0; rank < tp; rank++) {
      std::vector<float> gu = linear(x, pack_row_shards<float>({&gate, &up}, {inter, inter}, hidden, rank, tp), n, hidden,
                                     2 * part);  // (n, [gate | up])
      std::vector<float> act(size_t(n) * part);
      for (int i = 0; i < n; i++)
        for (int j = 0; j < part; j++) {
          const float g = gu[size_t(i) * 2 * part + j], u = gu[size_t(i) * 2 * part + part + j];
          act[size_t(i) * part + j] = g / (1 + std::exp(-g)) * u;
        }
      std::vector<float> partial = linear(act, shard_cols(down, hidden, inter, rank, tp), n, part, hidden);
      for (size_t i = 0; i < y.size(); i++) y[i] += partial[i];
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < y.size(); i++) {
      diff += (y[i] - expected[i]) * (y[i] - expected[i]);
      norm += expected[i] * expected[i];
    }
    EXPECT_LE(std::sqrt(diff / norm), kTol);
  }
}

TEST(Ch06_Sharding, PaddedRowShardsCoverTheVocabularyAndPadWithZeros) {
  // 5 rows over 2 ranks: shards of 3 rows, the second holding rows 3, 4 and a zero row.
  const std::vector<int> w = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  EXPECT_EQ(shard_rows_padded(w, 5, 2, 0, 2), (std::vector<int>{1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(shard_rows_padded(w, 5, 2, 1, 2), (std::vector<int>{4, 4, 5, 5, 0, 0}));
  EXPECT_EQ(shard_rows_padded(w, 5, 2, 0, 1), w);  // one rank: the weight itself
}

// 5 rows over 4 ranks: shards of ceil(5 / 4) = 2 rows, so rank 3's would start at row 6, past the end (a tiny
// vocabulary, as in Ch06_Communicator.GatherSkipsARankWhoseShardIsAllPadding). Its shard is all padding, and rank
// 2's is row 4 and one zero row; stacked and cut at 5 rows, the shards are the weight again.
TEST(Ch06_Sharding, APaddedRowShardPastTheLastRowIsAllZeros) {
  const std::vector<int> w = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  const std::vector<std::vector<int>> want = {{1, 1, 2, 2}, {3, 3, 4, 4}, {5, 5, 0, 0}, {0, 0, 0, 0}};
  std::vector<std::vector<int>> shards;
  for (int rank = 0; rank < 4; rank++) {
    shards.push_back(shard_rows_padded(w, 5, 2, rank, 4));
    EXPECT_EQ(shards.back(), want[size_t(rank)]) << "rank " << rank;
  }
  std::vector<int> stacked = concat(shards);
  stacked.resize(w.size());
  EXPECT_EQ(stacked, w);
}

TEST(Ch06_Sharding, LayoutSplitsHeadsAndReplicatesKvHeadsBeyondTheirCount) {
  // Qwen3-0.6B: 16 query heads, 8 KV heads, MLP 3072, vocabulary 151,936.
  TensorParallelLayout t = tensor_parallel_layout(16, 8, 3072, 151936, 2);
  EXPECT_EQ(t.heads_per_rank, 8);
  EXPECT_EQ(t.kv_heads_per_rank, 4);
  EXPECT_EQ(t.first_kv_head(1), 4);
  EXPECT_EQ(t.vocab_per_rank, 75968);
  // MQA on 4 ranks: every rank holds the one KV head.
  t = tensor_parallel_layout(8, 1, 64, 1001, 4);
  EXPECT_EQ(t.kv_heads_per_rank, 1);
  for (int r = 0; r < 4; r++) EXPECT_EQ(t.first_kv_head(r), 0);
  EXPECT_EQ(t.vocab_per_rank, 251);  // 1001 padded to 1004
  // 2 KV heads on 4 ranks: heads 0, 0, 1, 1, matching the query heads each rank holds (GQA groups of 4).
  t = tensor_parallel_layout(8, 2, 64, 512, 4);
  EXPECT_EQ(t.first_kv_head(0), 0);
  EXPECT_EQ(t.first_kv_head(1), 0);
  EXPECT_EQ(t.first_kv_head(2), 1);
  EXPECT_EQ(t.first_kv_head(3), 1);
  for (int r = 0; r < 4; r++)  // rank r's query heads [2r, 2r + 2) read KV head (2r) / 4
    EXPECT_EQ((r * t.heads_per_rank) / (8 / 2), t.first_kv_head(r));
}

TEST(Ch06_Sharding, LayoutRefusesWhatCannotSplitNamingTheField) {
  EXPECT_EQ(test::error_of([] { tensor_parallel_layout(6, 2, 64, 1000, 4); }),
            "num_attention_heads (6) is not divisible by tensor_parallel_size 4");
  EXPECT_EQ(test::error_of([] { tensor_parallel_layout(8, 2, 100, 1000, 8); }),
            "intermediate_size (100) is not divisible by tensor_parallel_size 8");
  EXPECT_NE(test::error_of([] { tensor_parallel_layout(12, 3, 64, 1000, 2); }).find("num_key_value_heads (3)"),
            std::string::npos);
}
