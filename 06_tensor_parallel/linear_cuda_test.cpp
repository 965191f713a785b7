// The CUDA projection, every version (linear.h), against the CPU reference linear_cpu on random bf16
// inputs, with bf16 and fp32 outputs. Outputs are poisoned first, and one row past the output too, which
// must still hold the poison afterwards. Tolerance: relative error by norm <= 1e-2 for bf16 outputs (one
// bf16 rounding is ~4e-3), 1e-4 for fp32 outputs (fp32 accumulation in another order).
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "06_tensor_parallel/linear.h"
#include "07_sampler/sampler_top_k_top_p.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

struct Shape { int n, in, out; };

std::string name(Shape s) { return std::to_string(s.n) + "x" + std::to_string(s.in) + "->" + std::to_string(s.out); }

// v rounded to bf16 and back, as a kernel stores it.
std::vector<float> round_bf16(const std::vector<float>& v) { return to_float(to_bf16(v)); }

// act (n, inter) = silu(gate) * up, gate_up (n, 2 * inter) = [gate | up] per row: silu_and_mul_cpu of
// 04_model_runner, written out (chapter 06 does not link 04).
std::vector<float> silu_and_mul(const std::vector<float>& gate_up, int n, int inter) {
  std::vector<float> act(size_t(n) * inter);
  for (int m = 0; m < n; m++)
    for (int j = 0; j < inter; j++) {
      const float g = gate_up[size_t(m) * 2 * inter + j], u = gate_up[size_t(m) * 2 * inter + inter + j];
      act[size_t(m) * inter + j] = g / (1.0f + std::exp(-g)) * u;
    }
  return act;
}

// y = x W^T by `project(y, y_is_fp32, x, W, shape)`, both output dtypes, against linear_cpu.
using Project = std::function<void(void* y, bool y_is_fp32, const bf16* x, const bf16* W, Shape s)>;
void expect_matches_cpu(const Project& project, Shape s, std::mt19937& rng, const std::string& what) {
  std::vector<float> x = random_bf16_values(size_t(s.n) * s.in, rng);
  std::vector<float> w = random_bf16_values(size_t(s.out) * s.in, rng, 1.0f / std::sqrt(float(s.in)));
  std::vector<float> want(size_t(s.n) * s.out);
  linear_cpu(want.data(), x.data(), w.data(), s.n, s.in, s.out);
  DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y(want.size() + size_t(s.out));  // + a guard row
  DeviceArray<float> d_y32(want.size() + size_t(s.out));
  d_y.poison(), d_y32.poison();
  // The uploads and the poison were queued on the legacy default stream; the projection may run on a
  // non-blocking stream, which does not wait for it.
  CUDA_CHECK(cudaDeviceSynchronize());
  project(d_y.ptr, false, d_x.ptr, d_w.ptr, s);
  project(d_y32.ptr, true, d_x.ptr, d_w.ptr, s);
  std::vector<float> got = to_float(d_y.get()), got32 = d_y32.get();
  for (size_t i = want.size(); i < got.size(); i++) {
    ASSERT_TRUE(std::isnan(got[i])) << what << " " << name(s) << ": wrote past its output (bf16), element " << i;
    ASSERT_TRUE(std::isnan(got32[i])) << what << " " << name(s) << ": wrote past its output (fp32), element " << i;
  }
  got.resize(want.size()), got32.resize(want.size());
  EXPECT_LE(rel_error(got, want), 1e-2) << what << " " << name(s) << ", bf16 out";
  EXPECT_LE(rel_error(got32, want), 1e-4) << what << " " << name(s) << ", fp32 out";
}

// The MLP's gate_up with its activation in the ending: y (n, out / 2) bf16 = silu(gate) * up by `silu_project`,
// against the spec (linear_cpu, rounded to bf16 as the GPU stores it, then silu_and_mul) and against
// `project`, the same kernel's plain projection, with the activation applied on the CPU: the same gate and
// up bits, so only the exponential (__expf on the GPU) and the final rounding may differ, by one bf16 step.
using SiluProject = std::function<void(bf16* y, const bf16* x, const bf16* W, Shape s)>;
// The shapes every SiLU ending is tested on, at n rows: Qwen3-0.6B's gate_up, a tiny model's, ragged halves
// (33 and 145 features: a last tile, warp or block past the last feature; for v6 a gate box that runs into
// the up rows, and an up box past W's end).
std::vector<Shape> silu_shapes(int n) { return {Shape{n, 1024, 6144}, Shape{n, 64, 256}, Shape{n, 200, 66}, Shape{n, 96, 290}}; }
void expect_silu_matches(const SiluProject& silu_project, const Project& project, Shape s, cudaStream_t stream,
                         std::mt19937& rng, const std::string& label) {
  const int inter = s.out / 2;
  const std::string what = label + " " + name(s);
  std::vector<float> x = random_bf16_values(size_t(s.n) * s.in, rng);
  std::vector<float> w = random_bf16_values(size_t(s.out) * s.in, rng, 2.0f / std::sqrt(float(s.in)));
  std::vector<float> gate_up(size_t(s.n) * s.out);
  linear_cpu(gate_up.data(), x.data(), w.data(), s.n, s.in, s.out);
  const std::vector<float> want = round_bf16(silu_and_mul(round_bf16(gate_up), s.n, inter));
  DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y(want.size() + size_t(inter)), d_gate_up(size_t(s.n) * s.out);
  d_y.poison();  // + a guard row, which must stay NaN
  CUDA_CHECK(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
  silu_project(d_y.ptr, d_x.ptr, d_w.ptr, s);
  project(d_gate_up.ptr, false, d_x.ptr, d_w.ptr, s);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> got = to_float(d_y.get());
  for (size_t i = want.size(); i < got.size(); i++)
    ASSERT_TRUE(std::isnan(got[i])) << what << ": wrote past its output, element " << i;
  got.resize(want.size());
  EXPECT_LE(rel_error(got, want), 1e-2) << what;
  const std::vector<float> own = round_bf16(silu_and_mul(to_float(d_gate_up.get()), s.n, inter));
  int off = 0;
  for (size_t i = 0; i < own.size(); i++)
    if (std::fabs(got[i] - own[i]) > std::fabs(own[i]) * (1.0f / 128) + 1e-30f) off++;
  EXPECT_EQ(off, 0) << what << ": outputs more than one bf16 step from its own projection + SiLU";
}

}  // namespace

TEST(Ch06_LinearCuda, MatchesCpu) {  // v1, cublasGemmEx
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  CudaContext ctx;
  const Project v1 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_cuda(ctx.cublas, y, fp32, x, W, s.n, s.in, s.out);
  };
  for (Shape s : {Shape{1, 64, 512}, Shape{37, 96, 288}, Shape{256, 1024, 4096}, Shape{5, 3072, 1024}})
    expect_matches_cpu(v1, s, rng, "v1");
}

// qkv before decode attention (kSpareSmsBeforeAttention): cuBLAS on fewer SMs gives the same product, and the
// handle's target, which cuBLAS keeps from call to call, is the call's own: the next plain call has every SM.
TEST(Ch06_LinearCuda, SpareSmsKeepTheProductAndLeaveNothingBehind) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(19);
  CudaContext ctx;
  const int sms = multiprocessor_count();
  EXPECT_EQ(CudaLinear::sm_target(0), 0);
  EXPECT_EQ(CudaLinear::sm_target(kSpareSmsBeforeAttention),
            sms > 2 * kSpareSmsBeforeAttention ? sms - kSpareSmsBeforeAttention : 0);
  EXPECT_EQ(CudaLinear::sm_target(sms), 0);  // never the whole GPU spared
  CudaLinear linear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n);
  int target = -1;
  // 64 and 256 rows of Qwen3-0.6B's qkv run on cuBLAS (v1) in the default version; 5 rows do not (v5).
  for (int n : {64, 256, 5}) {
    const Project spared = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
      linear.run(y, fp32, x, W, s.n, s.in, s.out, kSpareSmsBeforeAttention);
    };
    expect_matches_cpu(spared, Shape{n, 1024, 4096}, rng, "spare SMs, " + std::to_string(n) + " rows");
    if (n == 5) continue;
    ASSERT_EQ(cublasGetSmCountTarget(ctx.cublas, &target), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(target, CudaLinear::sm_target(kSpareSmsBeforeAttention)) << n;
    const Project plain = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
      linear.run(y, fp32, x, W, s.n, s.in, s.out);
    };
    expect_matches_cpu(plain, Shape{n, 1024, 4096}, rng, "every SM, " + std::to_string(n) + " rows");
    ASSERT_EQ(cublasGetSmCountTarget(ctx.cublas, &target), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(target, 0) << n;
  }
}

TEST(Ch06_LinearCuda, GemvRefusesWhatItCannotDo) {  // host logic only: no GPU needed
  alignas(16) static bf16 buffer[64];
  EXPECT_TRUE(linear_gemv_fits(buffer, buffer, 1, 1024));
  EXPECT_TRUE(linear_gemv_fits(buffer, buffer, kGemvMaxRows, 8));
  EXPECT_FALSE(linear_gemv_fits(buffer, buffer, 0, 1024));
  EXPECT_FALSE(linear_gemv_fits(buffer, buffer, kGemvMaxRows + 1, 1024));
  EXPECT_FALSE(linear_gemv_fits(buffer, buffer, 4, 100));       // rows of 100 bf16: not whole 16-byte chunks
  EXPECT_FALSE(linear_gemv_fits(buffer + 1, buffer, 4, 1024));  // x 2 bytes off alignment
  EXPECT_FALSE(linear_gemv_fits(buffer, buffer + 4, 4, 1024));  // W 8 bytes off
}

TEST(Ch06_LinearCuda, GemvMatchesCpuUpTo16Rows) {  // v2
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Project v2 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_gemv_cuda(y, fp32, x, W, s.n, s.in, s.out, stream);
  };
  // Qwen3-0.6B's qkv, o_proj and down_proj (the last two split over 2 and 3 warps); rows of 96 and 200 bf16
  // (12 and 25 chunks: lanes idle); 290 outputs (the last block's last warps have none), 33 and 20,011 (the
  // last warp's second row is past the end); a wide one like the LM head; 513 chunks over 4 splits: three
  // of 129 (two rounds, the second one chunk) and the last of 126 (one round).
  for (int n : {1, 2, 3, 8, 16})
    for (Shape s : {Shape{n, 1024, 4096}, Shape{n, 2048, 1024}, Shape{n, 3072, 1024}, Shape{n, 96, 290},
                    Shape{n, 200, 33}, Shape{n, 1024, 20011}, Shape{n, 4104, 35}})
      expect_matches_cpu(v2, s, rng, "v2");
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(Ch06_LinearCuda, SplitKSplitsForOccupancyWithinTheWorkspace) {  // host logic only: no GPU needed
  const size_t big = size_t(32) << 20;
  EXPECT_EQ(linear_split_k_splits(256, 1024, 6144, big), 1);   // 4 x 96 = 384 tiles: enough already
  EXPECT_EQ(linear_split_k_splits(256, 2048, 1024, big), 5);   // 64 tiles -> ceil(264 / 64) = 5 splits
  EXPECT_EQ(linear_split_k_splits(1, 1024, 1024, big), 8);     // 16 tiles, at most 1024 / 128 splits
  EXPECT_EQ(linear_split_k_splits(256, 96, 1024, big), 1);     // too shallow to split
  EXPECT_EQ(linear_split_k_splits(256, 2048, 1024, size_t(3) * 256 * 1024 * 4), 3);  // partials must fit
  EXPECT_EQ(linear_split_k_depth(2048, 5), 448);  // ceil(2048 / 5) = 410 -> 7 stages
  EXPECT_EQ(linear_split_k_depth(1024, 5), 256);  // 4 splits of 256 and an empty fifth
  EXPECT_EQ(linear_split_k_depth(1160, 9), 192);  // ceil(1160 / 9) = 129 -> 3 stages (not 128: 9 x 128 < 1160)
  // Every in_feature in some split, each a whole number of stages, at every split count the plan can pick.
  for (int in : {96, 200, 1024, 1160, 2048, 2056, 3072, 4104})
    for (int splits = 1; splits <= 16; splits++) {
      const int depth = linear_split_k_depth(in, splits);
      EXPECT_EQ(depth % 64, 0) << in << " over " << splits;
      EXPECT_GE(int64_t(depth) * splits, in) << in << " over " << splits;
    }
  alignas(16) static bf16 buffer[64];
  EXPECT_TRUE(linear_split_k_fits(buffer, buffer, 300, 1024));
  EXPECT_FALSE(linear_split_k_fits(buffer, buffer, 4, 100));
  EXPECT_FALSE(linear_split_k_fits(buffer + 1, buffer, 4, 1024));
}

TEST(Ch06_LinearCuda, SplitKMatchesCpu) {  // v4
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  CudaContext ctx;
  const Project v4 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_split_k_cuda(y, fp32, x, W, s.n, s.in, s.out, ctx.workspace.ptr, ctx.workspace.n, ctx.stream);
  };
  // Qwen3-0.6B's four layer projections at decode batches (split or not); ragged rows, outputs and
  // in_features (96 = one and a half stages, 200 = 25 chunks; 1,160 over 9 splits of 192, the seventh
  // 8 in_features, the last two empty); one row; more rows than one tile column.
  for (int n : {1, 2, 17, 64, 256, 300})
    for (Shape s : {Shape{n, 1024, 4096}, Shape{n, 2048, 1024}, Shape{n, 3072, 1024}, Shape{n, 1024, 6144},
                    Shape{n, 96, 290}, Shape{n, 200, 33}, Shape{n, 1160, 1024}})
      expect_matches_cpu(v4, s, rng, "v4 (" + std::to_string(linear_split_k_splits(s.n, s.in, s.out, ctx.workspace.n)) + " splits)");
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

TEST(Ch06_LinearCuda, GemvMmaMatchesCpuUpTo16Rows) {  // v5
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  CudaContext ctx;
  const Project v5 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_gemv_mma_cuda(y, fp32, x, W, s.n, s.in, s.out, ctx.stream);
  };
  // One and two x tiles (n <= 8, n <= 16), ragged n; Qwen3-0.6B's four projections (8, 16 and 24 warps a
  // block, each one round); in_features short of a round (96: three of one warp's four 32-wide blocks; 200:
  // 25 chunks, not a multiple of 32); 290 and 33 outputs (the last group of 16 is partial); a wide one like
  // the LM head; 4,104 in_features, more than 24 warps take in one round (every warp loops twice).
  for (int n : {1, 2, 3, 8, 9, 16})
    for (Shape s : {Shape{n, 1024, 4096}, Shape{n, 2048, 1024}, Shape{n, 3072, 1024}, Shape{n, 96, 290},
                    Shape{n, 200, 33}, Shape{n, 1024, 20011}, Shape{n, 4104, 35}})
      expect_matches_cpu(v5, s, rng, "v5 (" + std::to_string(linear_gemv_mma_warps(s.in)) + " warps)");
  EXPECT_EQ(linear_gemv_mma_warps(1024), 8);   // a round: 8 warps x 4 blocks of 32 in_features
  EXPECT_EQ(linear_gemv_mma_warps(3072), 24);
  EXPECT_EQ(linear_gemv_mma_warps(96), 1);
  EXPECT_EQ(linear_gemv_mma_warps(4104), 24);  // capped: rounds past 3,072 in_features loop
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

TEST(Ch06_LinearCuda, WgmmaPlansTallTilesAndClusterSplits) {  // host logic only: no GPU needed
  auto expect_plan = [](int n, int in, int out, int warpgroups, int block_out, int splits, int k_tiles_per_split,
                        int blocks_per_sm = 1, int sms = 132) {
    // As many clusters at once as `sms` SMs hold with blocks_per_sm blocks each.
    const LinearWgmmaPlan p =
        linear_wgmma_plan(n, in, out, sms, [&](const LinearWgmmaPlan& q) { return sms * blocks_per_sm / q.splits; });
    EXPECT_EQ(p.warpgroups, warpgroups) << n << "x" << in << "->" << out;
    EXPECT_EQ(p.block_out, block_out) << n << "x" << in << "->" << out;
    EXPECT_EQ(p.splits, splits) << n << "x" << in << "->" << out;
    EXPECT_EQ(p.k_tiles_per_split, k_tiles_per_split) << n << "x" << in << "->" << out;
  };
  expect_plan(16, 1024, 4096, 1, 128, 4, 4);  // qkv: 32 tiles of 128; 5 splits would not fit one wave (26
                                              // clusters), 4 give 128 blocks of 4 stages
  expect_plan(16, 2048, 1024, 1, 64, 8, 4);   // o_proj: 8 tiles of 128 are too few, 16 of 64; 8 splits at most
  // Above 48 rows: 2 warpgroups up to 128 rows, then row tiles of one; 96 blocks (288 for more than 2,048
  // outputs), at most 6 splits.
  expect_plan(64, 2048, 1024, 1, 64, 6, 6);   // o_proj: 16 tiles, 6 splits of 32 stages (the last one short)
  expect_plan(128, 3072, 1024, 2, 64, 6, 8);  // down_proj: 2 warpgroups, 48 stages over 6 splits
  expect_plan(192, 3072, 1024, 1, 128, 4, 12); // 3 row tiles x 8 of 128 outputs: 24 tiles, 4 splits
  expect_plan(256, 3072, 1024, 1, 128, 3, 16); // 4 row tiles: 32 tiles, 3 splits
  expect_plan(100, 1024, 6144, 2, 64, 1, 16); // gate_up: 96 tiles of 64; 2 splits would not fit one wave
  expect_plan(64, 1024, 6144, 1, 64, 3, 6, 3);   // 3 blocks an SM: 3 splits (288 blocks), the last one short
  expect_plan(128, 1024, 6144, 2, 64, 2, 8, 2);  // 2 blocks an SM: 3 splits would not fit one wave, 2 do
  expect_plan(300, 1024, 4096, 1, 128, 1, 16); // 5 row tiles x 32: no split
  expect_plan(64, 96, 290, 1, 64, 1, 2);      // two stages: too shallow to split
  expect_plan(16, 1024, 151936, 1, 128, 1, 16);  // the LM head: 1,187 tiles, no split
  // A GPU of 66 SMs: half the blocks. o_proj's 16 tiles: 4 splits (5 would not fit one wave) where 132 SMs
  // take 8; above 48 rows 48 blocks instead of 96: 3 splits of 11 stages instead of 6 of 6.
  expect_plan(16, 2048, 1024, 1, 64, 4, 8, 1, 66);
  expect_plan(64, 2048, 1024, 1, 64, 3, 11, 1, 66);
}

TEST(Ch06_LinearCuda, WgmmaMatchesCpu) {  // v6
  SKIP_WITHOUT_GPU();
  if (!linear_wgmma_available()) GTEST_SKIP() << "v6 needs compute capability 9.0 and code built for sm_90a";
  std::mt19937 rng(14);
  CudaContext ctx;
  const Project v6 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_wgmma_cuda(y, fp32, x, W, s.n, s.in, s.out, ctx.stream);
  };
  // 1 and 2 warpgroups, ragged rows and 3 to 5 row tiles (129-300); Qwen3-0.6B's four projections (64 or 128
  // outputs a block, split over a cluster or not); in_features of one and a half stages (96) and of 25
  // chunks (200, split in 2 with 33 outputs: ragged columns in the cluster's sum); a wide one like the LM
  // head.
  for (int n : {9, 17, 64, 65, 129, 256, 300})
    for (Shape s : {Shape{n, 1024, 4096}, Shape{n, 2048, 1024}, Shape{n, 3072, 1024}, Shape{n, 1024, 6144},
                    Shape{n, 96, 290}, Shape{n, 200, 33}})
      expect_matches_cpu(v6, s, rng, "v6");
  for (int n : {9, 40})
    expect_matches_cpu(v6, Shape{n, 1024, 20011}, rng, "v6");
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

// v6 with its split-K sum left to the norm after it (linear version 8): each split's fp32 product in its own
// slice, (splits, n, out), nothing past them; their sum in split order (from +0.0f, from -0.0f for one split),
// rounded to bf16, is v6's own bf16 output bit for bit. The narrow projections of Qwen3-0.6B (o_proj,
// down_proj) over v6's rows, split over 2-8 blocks, and ragged shapes (200 -> 33 in 2 splits, 96 -> 290 in one).
TEST(Ch06_LinearCuda, WgmmaPartialsAddUpToItsProduct) {
  SKIP_WITHOUT_GPU();
  if (!linear_wgmma_available()) GTEST_SKIP() << "v6 needs compute capability 9.0 and code built for sm_90a";
  std::mt19937 rng(23);
  CudaContext ctx;
  for (int n : {9, 16, 48, 64, 65, 129, 192})
    for (Shape s : {Shape{n, 2048, 1024}, Shape{n, 3072, 1024}, Shape{n, 200, 33}, Shape{n, 96, 290}}) {
      const size_t size = size_t(s.n) * s.out;
      std::vector<float> x = random_bf16_values(size_t(s.n) * s.in, rng);
      std::vector<float> w = random_bf16_values(size_t(s.out) * s.in, rng, 1.0f / std::sqrt(float(s.in)));
      DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y(size);
      DeviceArray<float> d_partials(size * kWgmmaMaxSplits + 1);  // + a guard element
      d_partials.poison();
      CUDA_CHECK(cudaDeviceSynchronize());
      linear_wgmma_cuda(d_y.ptr, false, d_x.ptr, d_w.ptr, s.n, s.in, s.out, ctx.stream);
      const int splits = linear_wgmma_partials_cuda(d_partials.ptr, d_x.ptr, d_w.ptr, s.n, s.in, s.out, ctx.stream);
      CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
      ASSERT_GE(splits, 1) << name(s);
      ASSERT_LE(splits, kWgmmaMaxSplits) << name(s);
      if (s.in >= 2048) {
        EXPECT_GE(splits, 2) << name(s) << ": the split path is what this test is for";
      }
      const std::vector<float> partials = d_partials.get(), y = to_float(d_y.get());
      for (size_t e = size * size_t(splits); e < partials.size(); e++)
        ASSERT_TRUE(std::isnan(partials[e])) << name(s) << ": wrote past its " << splits << " slices, element " << e;
      std::vector<float> sum(size);
      for (size_t e = 0; e < size; e++) {
        float acc = splits == 1 ? -0.0f : 0.0f;
        for (int p = 0; p < splits; p++) acc += partials[size_t(p) * size + e];
        sum[e] = bf16_to_float(float_to_bf16(acc));
      }
      EXPECT_EQ(sum, y) << name(s) << ", " << splits << " splits";
    }
}

// Where CudaLinear hands the norm after a projection its partials (run_partials, the default version 8): the
// narrow projections from kWgmmaPartialsMinRows to kWgmmaPartialsMaxRows rows, nowhere else, never with version 6;
// where it does not, it queues nothing (the guard stays untouched) and the caller runs the projection.
TEST(Ch06_LinearCuda, PartialsOnlyWhereVersion8RunsThem) {
  SKIP_WITHOUT_GPU();
  if (!linear_wgmma_available()) GTEST_SKIP() << "v6 needs compute capability 9.0 and code built for sm_90a";
  static_assert(kLinearVersionDefault == 8, "the default leaves the narrow projections' sum to the norm");
  std::mt19937 rng(29);
  CudaContext ctx;
  struct Case {
    int version, n, in, out;
    bool partials;
  };
  const int lo = kWgmmaPartialsMinRows, hi = kWgmmaPartialsMaxRows;
  for (const Case& c : {Case{8, lo - 1, 2048, 1024, false}, Case{8, lo, 2048, 1024, true},
                        Case{8, hi, 3072, 1024, true}, Case{8, hi + 1, 3072, 1024, false},
                        Case{8, 64, 1024, kWgmmaNarrowOut + 64, false}, Case{6, 64, 2048, 1024, false}}) {
    const std::string what = "version " + std::to_string(c.version) + ", " + name(Shape{c.n, c.in, c.out});
    CudaLinear linear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n, c.version);
    const size_t size = size_t(c.n) * c.out;
    DeviceArray<bf16> d_x(to_bf16(random_bf16_values(size_t(c.n) * c.in, rng))), d_y(size);
    DeviceArray<bf16> d_w(to_bf16(random_bf16_values(size_t(c.out) * c.in, rng, 1.0f / std::sqrt(float(c.in)))));
    DeviceArray<float> d_partials(size * kWgmmaMaxSplits);
    d_partials.poison();
    CUDA_CHECK(cudaDeviceSynchronize());
    const int splits = linear.run_partials(d_partials.ptr, d_x.ptr, d_w.ptr, c.n, c.in, c.out);
    linear.run(d_y.ptr, false, d_x.ptr, d_w.ptr, c.n, c.in, c.out);
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    const std::vector<float> partials = d_partials.get(), y = to_float(d_y.get());
    if (!c.partials) {
      EXPECT_EQ(splits, 0) << what;
      for (size_t e = 0; e < partials.size(); e++) ASSERT_TRUE(std::isnan(partials[e])) << what << ": wrote " << e;
      continue;
    }
    ASSERT_GE(splits, 2) << what;  // Qwen3-0.6B's narrow shapes split over in_features at these rows
    for (size_t e = 0; e < size; e++) {
      float acc = 0.0f;
      for (int p = 0; p < splits; p++) acc += partials[size_t(p) * size + e];
      ASSERT_EQ(bf16_to_float(float_to_bf16(acc)), y[e]) << what << ": element " << e;
    }
  }
}

TEST(Ch06_LinearCuda, WgmmaAnyValidPlanMatchesCpu) {  // v6 with plans of one's own (the plan sweep's)
  SKIP_WITHOUT_GPU();
  if (!linear_wgmma_available()) GTEST_SKIP() << "v6 needs compute capability 9.0 and code built for sm_90a";
  std::mt19937 rng(17);
  CudaContext ctx;
  auto plan = [](int warpgroups, int block_out, int splits, int k_tiles_per_split) {
    LinearWgmmaPlan p;
    p.warpgroups = warpgroups, p.block_out = block_out, p.splits = splits, p.k_tiles_per_split = k_tiles_per_split;
    return p;
  };
  // o_proj and down_proj's shapes at 65 and 129 rows (ragged row tiles) under plans the default never
  // picks there: 1 to 4 warpgroups, both block widths, 1 to 8 splits, the last split short.
  for (int n : {65, 129})
    for (Shape s : {Shape{n, 2048, 1024}, Shape{n, 3072, 1024}})
      for (LinearWgmmaPlan p : {plan(1, 64, 6, 6), plan(2, 128, 2, 24), plan(4, 64, 8, 6), plan(1, 128, 4, 12),
                                plan(2, 64, 1, 48)}) {
        p.k_tiles_per_split = std::min(p.k_tiles_per_split, s.in / 64);
        p.splits = (s.in / 64 + p.k_tiles_per_split - 1) / p.k_tiles_per_split;
        const Project v6 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape t) {
          linear_wgmma_cuda(y, fp32, x, W, t.n, t.in, t.out, p, ctx.stream);
        };
        expect_matches_cpu(v6, s, rng, "v6 with " + std::to_string(p.warpgroups) + " warpgroups, " +
                                           std::to_string(p.block_out) + " outputs, " + std::to_string(p.splits) + " splits");
      }
  // Plans that leave stages out, leave a split empty or exceed a cluster are refused.
  DeviceArray<bf16> x{size_t(65) * 2048}, W{size_t(1024) * 2048}, y{size_t(65) * 1024};
  for (LinearWgmmaPlan p : {plan(1, 64, 4, 6), plan(1, 64, 6, 8), plan(1, 64, 9, 4), plan(3, 64, 4, 8)})
    EXPECT_THROW(linear_wgmma_cuda(y.ptr, false, x.ptr, W.ptr, 65, 2048, 1024, p, ctx.stream), Error)
        << p.warpgroups << " warpgroups, " << p.splits << " splits of " << p.k_tiles_per_split;
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

TEST(Ch06_LinearCuda, WgmmaWithSiluMatchesCpuAndItsOwnProjection) {  // v6, the MLP's activation in its ending
  SKIP_WITHOUT_GPU();
  if (!linear_wgmma_available()) GTEST_SKIP() << "v6 needs compute capability 9.0 and code built for sm_90a";
  std::mt19937 rng(16);
  CudaContext ctx;
  const SiluProject v6_silu = [&](bf16* y, const bf16* x, const bf16* W, Shape s) {
    linear_wgmma_silu_cuda(y, x, W, s.n, s.in, s.out, ctx.stream);
  };
  const Project v6 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_wgmma_cuda(y, fp32, x, W, s.n, s.in, s.out, ctx.stream);
  };
  // Qwen3-0.6B's gate_up split over a cluster or not, by rows; the tiny model's in one stage.
  for (int n : {9, 17, 40, 48, 64, 129})
    for (Shape s : silu_shapes(n)) expect_silu_matches(v6_silu, v6, s, ctx.stream, rng, "v6 + silu");
}

// v6 with the sampler in its ending. Truths: its logits (all_logits) against linear_cpu, and its tokens
// against 07_sampler's CPU reference over those same logits (sample_row_cpu; sample_row_top_k_top_p_cpu for
// the rows sample_top_k_top_p_cuda samples), exactly. Rows: greedy, three temperatures, top-k, top-p, and a
// row whose input holds +Inf (its logits are not finite: token -1). Then without all_logits: the same
// tokens, logits written for the top-k and top-p rows only; then the next token's draws, which find the
// per-row keys zeroed by the call before.
TEST(Ch06_LinearCuda, SampleInTheEndingMatchesCpuOverItsOwnLogits) {
  SKIP_WITHOUT_GPU();
  if (!linear_wgmma_available()) GTEST_SKIP() << "v6 needs compute capability 9.0 and code built for sm_90a";
  std::mt19937 rng(18);
  CudaContext ctx;
  for (Shape s : {Shape{9, 1024, 20011}, Shape{64, 1024, 3000}, Shape{65, 200, 4096}, Shape{128, 96, 1000},
                  Shape{1, 1024, 5003}}) {
    const std::string what = "v6 + sampling " + name(s);
    std::vector<float> x = random_bf16_values(size_t(s.n) * s.in, rng);
    if (s.n > 2) x[size_t(2) * s.in + 5] = INFINITY;  // row 2: non-finite logits
    std::vector<float> w = random_bf16_values(size_t(s.out) * s.in, rng, 2.0f / std::sqrt(float(s.in)));
    std::vector<SamplingRow> rows(size_t(s.n));
    for (int r = 0; r < s.n; r++) {
      const float temperatures[4] = {0.0f, 0.6f, 1.0f, 1.5f};
      rows[size_t(r)] = SamplingRow{temperatures[r % 4], r % 7 == 3 ? 20 : 0, r % 7 == 5 ? 0.8f : 1.0f,
                                    uint64_t(1000 + r), uint64_t(40 + r)};
    }
    DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w));
    DeviceArray<float> d_logits(size_t(s.n) * s.out);
    DeviceArray<SamplingRow> d_rows(rows);
    DeviceArray<int32_t> d_tokens(size_t(s.n));
    DeviceArray<unsigned long long> d_keys(size_t(s.n));
    DeviceArray<int> d_broken(size_t(s.n));
    CUDA_CHECK(cudaMemset(d_keys.ptr, 0, sizeof(unsigned long long) * s.n));
    CUDA_CHECK(cudaMemset(d_broken.ptr, 0, sizeof(int) * s.n));
    CUDA_CHECK(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
    const auto sample = [&](bool all_logits) {
      linear_sample_cuda(d_tokens.ptr, d_logits.ptr, d_x.ptr, d_w.ptr, s.n, s.in, s.out, d_rows.ptr, d_keys.ptr,
                         d_broken.ptr, all_logits, ctx.stream);
      CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
      return d_tokens.get();
    };
    const auto cpu_tokens = [&](const std::vector<float>& logits) {
      std::vector<int32_t> tokens(size_t(s.n));
      for (int r = 0; r < s.n; r++) {
        const float* row = logits.data() + size_t(r) * s.out;
        tokens[size_t(r)] = is_top_k_top_p_row(rows[size_t(r)], s.out) ? sample_row_top_k_top_p_cpu(row, s.out, rows[size_t(r)])
                                                                       : sample_row_cpu(row, s.out, rows[size_t(r)]);
      }
      return tokens;
    };
    const std::vector<int32_t> tokens = sample(true);
    const std::vector<float> logits = d_logits.get();
    std::vector<float> want(logits.size());
    linear_cpu(want.data(), x.data(), w.data(), s.n, s.in, s.out);
    std::vector<float> finite_got, finite_want;  // the rows without the +Inf input
    for (int r = 0; r < s.n; r++)
      if (r != 2 || s.n <= 2)
        for (int j = 0; j < s.out; j++)
          finite_got.push_back(logits[size_t(r) * s.out + j]), finite_want.push_back(want[size_t(r) * s.out + j]);
    EXPECT_LE(rel_error(finite_got, finite_want), 1e-4) << what << ": logits";
    EXPECT_EQ(tokens, cpu_tokens(logits)) << what << ": tokens against the CPU sampler over the same logits";
    if (s.n > 2) {
      EXPECT_EQ(tokens[2], -1) << what << ": a row of non-finite logits";
    }

    d_logits.poison();
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(sample(false), tokens) << what << ": without all_logits";
    const std::vector<float> some = d_logits.get();
    for (int r = 0; r < s.n; r++) {
      const bool written = is_top_k_top_p_row(rows[size_t(r)], s.out);
      for (int j = 0; j < s.out; j += 97) {
        const float got = some[size_t(r) * s.out + j], full = logits[size_t(r) * s.out + j];
        if (written) {
          EXPECT_TRUE(got == full || (std::isnan(got) && std::isnan(full))) << what << ": row " << r << " entry " << j;
        } else {
          EXPECT_TRUE(std::isnan(got)) << what << ": logits written for row " << r << ", which needs none";
        }
      }
    }
    for (SamplingRow& row : rows) row.step++;
    CUDA_CHECK(cudaMemcpy(d_rows.ptr, rows.data(), sizeof(SamplingRow) * rows.size(), cudaMemcpyHostToDevice));
    EXPECT_EQ(sample(false), cpu_tokens(logits)) << what << ": the next token's draws";
  }
  EXPECT_FALSE(linear_sample_fits(nullptr, nullptr, kWgmmaSampleMaxRows + 1, 1024));
  DeviceArray<bf16> x{size_t(129) * 1024}, W{size_t(1000) * 1024};
  EXPECT_THROW(linear_sample_cuda(nullptr, nullptr, x.ptr, W.ptr, 129, 1024, 1000, nullptr, nullptr, nullptr, false,
                                  ctx.stream), Error);
}

TEST(Ch06_LinearCuda, GemvWithSiluMatchesCpuAndItsOwnProjection) {  // v2 and v5, the activation in the ending
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  CudaContext ctx;
  const SiluProject v2_silu = [&](bf16* y, const bf16* x, const bf16* W, Shape s) {
    linear_gemv_silu_cuda(y, x, W, s.n, s.in, s.out, ctx.stream);
  };
  const Project v2 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_gemv_cuda(y, fp32, x, W, s.n, s.in, s.out, ctx.stream);
  };
  const SiluProject v5_silu = [&](bf16* y, const bf16* x, const bf16* W, Shape s) {
    ASSERT_TRUE(linear_gemv_mma_silu_cuda(y, x, W, s.n, s.in, s.out, ctx.stream)) << name(s);
  };
  const Project v5 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    linear_gemv_mma_cuda(y, fp32, x, W, s.n, s.in, s.out, ctx.stream);
  };
  for (int n : {1, 2, 3, 8, 16}) {
    for (Shape s : silu_shapes(n)) {
      expect_silu_matches(v2_silu, v2, s, ctx.stream, rng, "v2 + silu");
      expect_silu_matches(v5_silu, v5, s, ctx.stream, rng, "v5 + silu");
    }
    for (Shape s : {Shape{n, 2056, 66}, Shape{n, 4104, 34}}) {  // v2: 3 and 4 splits; v5: 17 and 24 warps
      expect_silu_matches(v2_silu, v2, s, ctx.stream, rng, "v2 + silu");
      expect_silu_matches(v5_silu, v5, s, ctx.stream, rng, "v5 + silu");
    }
  }
  DeviceArray<bf16> x{size_t(4) * 4096}, W{size_t(256) * 4096}, y{size_t(4) * 128};
  // An odd out_features has no halves.
  EXPECT_THROW(linear_gemv_silu_cuda(y.ptr, x.ptr, W.ptr, 4, 4096, 255, ctx.stream), Error);
  EXPECT_FALSE(linear_gemv_mma_silu_cuda(y.ptr, x.ptr, W.ptr, 4, 4096, 255, ctx.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

// At one row gate_up's GEMV with its activation lets down_proj in at its start (linear_gemv.cu), before its own
// wait, so down_proj's blocks may be loading their weights while the kernel before gate_up still runs. Here
// that kernel is a long projection (65,536 inputs, 128 MB of weights) writing gate_up's input, and the three
// run back to back on one stream, every intermediate poisoned (NaN) before each round: down_proj's output must
// be the CPU's composition, which it is not if down_proj read the activations before gate_up had written them.
TEST(Ch06_LinearCuda, DownProjLetInEarlyStillReadsGateUpsActivations) {  // v2
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  CudaContext ctx;
  const int long_in = 65536, hidden = 1024, inter = 3072;
  const std::vector<float> x0 = random_bf16_values(size_t(long_in), rng);
  const std::vector<float> w0 = random_bf16_values(size_t(hidden) * long_in, rng, 1.0f / std::sqrt(float(long_in)));
  const std::vector<float> w1 = random_bf16_values(size_t(2 * inter) * hidden, rng, 2.0f / std::sqrt(float(hidden)));
  const std::vector<float> w2 = random_bf16_values(size_t(hidden) * inter, rng, 1.0f / std::sqrt(float(inter)));
  std::vector<float> x(size_t(hidden), 0.0f), gate_up(size_t(2 * inter), 0.0f), want(size_t(hidden), 0.0f);
  linear_cpu(x.data(), x0.data(), w0.data(), 1, long_in, hidden);
  x = round_bf16(x);
  linear_cpu(gate_up.data(), x.data(), w1.data(), 1, hidden, 2 * inter);
  const std::vector<float> act = round_bf16(silu_and_mul(round_bf16(gate_up), 1, inter));
  linear_cpu(want.data(), act.data(), w2.data(), 1, inter, hidden);
  DeviceArray<bf16> d_x0(to_bf16(x0)), d_w0(to_bf16(w0)), d_w1(to_bf16(w1)), d_w2(to_bf16(w2));
  DeviceArray<bf16> d_x{size_t(hidden)}, d_act{size_t(inter)};
  DeviceArray<float> d_y{size_t(hidden)};
  for (int round = 0; round < 3; round++) {
    d_x.poison(), d_act.poison(), d_y.poison();
    CUDA_CHECK(cudaDeviceSynchronize());  // the uploads and the poison ran on the legacy stream
    linear_gemv_cuda(d_x.ptr, false, d_x0.ptr, d_w0.ptr, 1, long_in, hidden, ctx.stream);
    linear_gemv_silu_cuda(d_act.ptr, d_x.ptr, d_w1.ptr, 1, hidden, 2 * inter, ctx.stream);
    linear_gemv_cuda(d_y.ptr, true, d_act.ptr, d_w2.ptr, 1, inter, hidden, ctx.stream);
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    EXPECT_LE(rel_error(d_y.get(), want), 1e-2) << "round " << round;
  }
}

TEST(Ch06_LinearCuda, PrefetchPlansABlockPerSmWithinItsSharedMemory) {  // host logic only: no GPU needed
  auto expect_plan = [](int n, int in, int out, int blocks, int warps, int rows_per_warp) {
    const LinearPrefetchPlan p = linear_prefetch_plan(n, in, out, 132);
    EXPECT_EQ(p.blocks, blocks) << n << "x" << in << "->" << out;
    EXPECT_EQ(p.warps, warps) << n << "x" << in << "->" << out;
    EXPECT_EQ(p.rows_per_warp, rows_per_warp) << n << "x" << in << "->" << out;
    if (blocks > 0) {  // the weight rows, the input rows, a barrier per warp
      EXPECT_EQ(p.smem_bytes, (warps * rows_per_warp + n) * in * 2 + warps * 8) << n << "x" << in << "->" << out;
    }
  };
  expect_plan(1, 1024, 4096, 128, 8, 4);    // qkv: 32 rows a block (64 KB)
  expect_plan(1, 1024, 6144, 128, 8, 6);    // gate_up: ceil(6144 / 132) = 47 rows, 48 planned (96 KB)
  expect_plan(1, 3072, 1024, 128, 8, 1);    // down_proj: 8 rows of 6 KB
  expect_plan(4, 2048, 6144, 384, 8, 2);    // 6 rows a warp would take 208 KB, 3 take 112 KB + 64 bytes
  expect_plan(1, 96, 50, 50, 1, 1);         // fewer rows than SMs: a row a block
  expect_plan(1, 16384, 1024, 512, 2, 1);   // a row of 32 KB: two warps a block within 112 KB
  expect_plan(1, 30000, 1024, 1024, 1, 1);  // a row and x take 117 KB: one row a block, alone on its SM
  expect_plan(1, 60000, 8, 0, 0, 0);        // 234 KB: does not fit
}

TEST(Ch06_LinearCuda, PrefetchMatchesCpuWithItsFusions) {  // v7
  SKIP_WITHOUT_GPU();
  if (!linear_prefetch_available()) GTEST_SKIP() << "v7 needs compute capability 9.0 or later";
  std::mt19937 rng(15);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const float eps = 1e-6f;
  // Qwen3-0.6B's four projections; ragged ones (fewer rows than SMs; a last block whose last warps have no
  // row; 3 warps a block).
  for (int n : {1, 2, 3, 4})
    for (Shape s : {Shape{n, 1024, 4096}, Shape{n, 2048, 1024}, Shape{n, 1024, 6144}, Shape{n, 3072, 1024},
                    Shape{n, 96, 50}, Shape{n, 200, 1003}, Shape{n, 4096, 300}})
      for (LinearInput input : {LinearInput::Plain, LinearInput::RmsNorm, LinearInput::SiluAndMul})
        for (bool add : {false, true}) {
          const std::string what = "v7 input " + std::to_string(int(input)) + (add ? " add " : " ") + name(s);
          // The spec: the separate operations on the CPU, each output rounded to bf16 as the GPU stores it.
          const int x_cols = input == LinearInput::SiluAndMul ? 2 * s.in : s.in;
          std::vector<float> x = random_bf16_values(size_t(s.n) * x_cols, rng);
          std::vector<float> norm = random_bf16_values(size_t(s.in), rng);
          std::vector<float> w = random_bf16_values(size_t(s.out) * s.in, rng, 1.0f / std::sqrt(float(s.in)));
          std::vector<float> y0 = random_bf16_values(size_t(s.n) * s.out, rng);
          // (04_model_runner's rmsnorm_cpu and silu_and_mul_cpu, written out: chapter 06 does not link 04.)
          std::vector<float> in_rows(size_t(s.n) * s.in);
          for (int m = 0; m < s.n; m++) {
            const float* row = x.data() + size_t(m) * x_cols;
            double sum_sq = 0;
            for (int k = 0; k < s.in; k++) sum_sq += double(row[k]) * row[k];
            const float inv_rms = float(1.0 / std::sqrt(sum_sq / s.in + eps));
            for (int k = 0; k < s.in; k++) {
              float& v = in_rows[size_t(m) * s.in + k];
              if (input == LinearInput::Plain) v = row[k];
              if (input == LinearInput::RmsNorm) v = row[k] * inv_rms * norm[size_t(k)];
              if (input == LinearInput::SiluAndMul) v = row[k] / (1.0f + std::exp(-row[k])) * row[k + s.in];
            }
          }
          in_rows = round_bf16(in_rows);
          std::vector<float> want(size_t(s.n) * s.out);
          linear_cpu(want.data(), in_rows.data(), w.data(), s.n, s.in, s.out);
          if (add) {
            want = round_bf16(want);
            for (size_t i = 0; i < want.size(); i++) want[i] += y0[i];
          }
          std::vector<float> y_init = y0;
          y_init.resize(want.size() + size_t(s.out), std::nanf(""));  // + a guard row, which must stay NaN
          DeviceArray<bf16> d_x(to_bf16(x)), d_norm(to_bf16(norm)), d_w(to_bf16(w)), d_y(to_bf16(y_init));
          CUDA_CHECK(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
          const LinearFusion fusion{input, d_norm.ptr, eps, add};
          ASSERT_TRUE(linear_prefetch_fits(d_x.ptr, d_w.ptr, s.n, s.in, s.out)) << what;
          linear_prefetch_cuda(d_y.ptr, d_x.ptr, d_w.ptr, s.n, s.in, s.out, fusion, stream);
          CUDA_CHECK(cudaStreamSynchronize(stream));
          std::vector<float> got = to_float(d_y.get());
          for (size_t i = want.size(); i < got.size(); i++)
            ASSERT_TRUE(std::isnan(got[i])) << what << ": wrote past its output, element " << i;
          got.resize(want.size());
          EXPECT_LE(rel_error(got, want), 1e-2) << what;
        }
  // Refused: more rows than it has accumulators for, and in_features whose row does not fit.
  DeviceArray<bf16> d_big(size_t(8) * 60000);
  EXPECT_FALSE(linear_prefetch_fits(d_big.ptr, d_big.ptr, kPrefetchMaxRows + 1, 1024, 1024));
  EXPECT_FALSE(linear_prefetch_fits(d_big.ptr, d_big.ptr, 1, 60000, 8));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(Ch06_LinearCuda, CublasLtMatchesCpuAndRepeatsItsChoice) {  // v3
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  CudaContext ctx;
  CublasLtLinear lt(ctx.stream, ctx.workspace.ptr, ctx.workspace.n);
  // bf16 output must find an algorithm. For fp32 output (the logits) cuBLASLt may offer none; CudaLinear
  // then runs v1, and so does this test, saying so.
  int fp32_fallbacks = 0;
  const Project v3 = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    if (lt.run(y, fp32, x, W, s.n, s.in, s.out)) return;
    ASSERT_TRUE(fp32) << "no cuBLASLt algorithm for " << name(s) << " with bf16 output";
    fp32_fallbacks++;
    linear_cuda(ctx.cublas, y, fp32, x, W, s.n, s.in, s.out);
  };
  for (int n : {17, 64, 256, 300})
    for (Shape s : {Shape{n, 1024, 4096}, Shape{n, 2048, 1024}, Shape{n, 3072, 1024}, Shape{n, 96, 288}})
      expect_matches_cpu(v3, s, rng, "v3");
  if (fp32_fallbacks > 0)
    std::printf("note: cuBLASLt offered no algorithm for fp32 output in %d of 16 shapes (v1 ran)\n", fp32_fallbacks);

  // The second run of a shape uses the chosen algorithm: nothing new is chosen, and the bits repeat.
  const size_t chosen = CublasLtLinear::chosen_shapes();
  const Shape s{64, 1024, 4096};
  std::vector<float> x = random_bf16_values(size_t(s.n) * s.in, rng), w = random_bf16_values(size_t(s.out) * s.in, rng);
  DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_a(size_t(s.n) * s.out), d_b(size_t(s.n) * s.out);
  CUDA_CHECK(cudaDeviceSynchronize());
  v3(d_a.ptr, false, d_x.ptr, d_w.ptr, s);
  v3(d_b.ptr, false, d_x.ptr, d_w.ptr, s);
  EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen);
  EXPECT_EQ(to_float(d_a.get()), to_float(d_b.get()));
}

TEST(Ch06_LinearCuda, EveryVersionThroughCudaLinear) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  CudaContext ctx;
  for (int version = kLinearVersionMin; version <= kLinearVersionMax; version++) {
    CudaLinear linear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n, version);
    const Project run = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
      linear.run(y, fp32, x, W, s.n, s.in, s.out);
    };
    // v2's row; then v1, v3, v4, v5 or v6 by version; above kTunedMaxRows, v3's bucket from version 2 on
    for (int n : {1, 5, 16, 17, 64, 600})
      expect_matches_cpu(run, Shape{n, 1024, 1536}, rng, "version " + std::to_string(version));
  }
  // A version that does not exist is refused when the backend is built, not at the first projection.
  for (int version : {kLinearVersionMin - 1, kLinearVersionMax + 1})
    EXPECT_THROW(CudaLinear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n, version), Error) << version;
}

TEST(Ch06_LinearCuda, CaptureNeverTimesAndReplaysTheChosenAlgorithm) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  CudaContext ctx;
  CudaLinear linear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n, /*version=*/3);
  // A shape of its own (no other test chooses for it): warmed up eagerly at n = 48 (v3 chooses), then
  // captured at n = 48 (the choice), n = 80 (new in capture: v1) and n = 1 (v2, kGemvFasterRows).
  const int in = 512, out = 768;
  const std::vector<int> rows = {48, 80, kGemvFasterRows};
  std::vector<std::vector<float>> want;
  std::vector<std::unique_ptr<DeviceArray<bf16>>> xs, ys;
  DeviceArray<bf16> d_w(to_bf16(random_bf16_values(size_t(out) * in, rng, 1.0f / std::sqrt(float(in)))));
  std::vector<float> w = to_float(d_w.get());
  for (int n : rows) {
    std::vector<float> x = random_bf16_values(size_t(n) * in, rng);
    want.emplace_back(size_t(n) * out);
    linear_cpu(want.back().data(), x.data(), w.data(), n, in, out);
    xs.push_back(std::make_unique<DeviceArray<bf16>>(to_bf16(x)));
    ys.push_back(std::make_unique<DeviceArray<bf16>>(size_t(n) * out));
  }
  CUDA_CHECK(cudaDeviceSynchronize());  // the uploads (legacy stream) before ctx.stream (non-blocking) reads them
  linear.run(ys[0]->ptr, false, xs[0]->ptr, d_w.ptr, rows[0], in, out);  // eager: times and chooses
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  const size_t chosen = CublasLtLinear::chosen_shapes();

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
  for (size_t i = 0; i < rows.size(); i++) linear.run(ys[i]->ptr, false, xs[i]->ptr, d_w.ptr, rows[i], in, out);
  CUDA_CHECK(cudaStreamEndCapture(ctx.stream, &graph));  // fails if anything synchronised inside
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen) << "nothing may be chosen (timed) during a capture";
  for (auto& y : ys) y->poison();
  CUDA_CHECK(cudaDeviceSynchronize());  // the poison first
  CUDA_CHECK(cudaGraphLaunch(exec, ctx.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  for (size_t i = 0; i < rows.size(); i++)
    EXPECT_LE(rel_error(to_float(ys[i]->get()), want[i]), 1e-2) << "replayed n = " << rows[i];
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));

  linear.run(ys[1]->ptr, false, xs[1]->ptr, d_w.ptr, rows[1], in, out);  // n = 80 eagerly: now it is chosen
  EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen + 1);
}

TEST(Ch06_LinearCuda, PrefillRowsShareOneChoicePerPowerOfTwo) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  CudaContext ctx;
  CublasLtLinear lt(ctx.stream, ctx.workspace.ptr, ctx.workspace.n);
  // bf16 output must run the bucket's algorithm (run() returns false where v1 would run instead); fp32
  // output may find none, and then v1 runs, as in CudaLinear.
  const Project above_tuned = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
    if (lt.run(y, fp32, x, W, s.n, s.in, s.out)) return;
    ASSERT_TRUE(fp32) << "the bucket's algorithm did not run for " << name(s) << " with bf16 output";
    linear_cuda(ctx.cublas, y, fp32, x, W, s.n, s.in, s.out);
  };
  const int in = 256, out = 320;  // a shape of its own: no other test chooses for it
  const size_t before = CublasLtLinear::chosen_shapes();
  expect_matches_cpu(above_tuned, Shape{600, in, out}, rng, "bucket 1024");
  const size_t first = CublasLtLinear::chosen_shapes();
  EXPECT_EQ(first, before + 2) << "one choice for bf16 output and one for fp32";
  for (int n : {513, 777, 1024}) expect_matches_cpu(above_tuned, Shape{n, in, out}, rng, "bucket 1024");
  EXPECT_EQ(CublasLtLinear::chosen_shapes(), first) << "the rows of a bucket share its choice";
  expect_matches_cpu(above_tuned, Shape{1025, in, out}, rng, "bucket 2048");
  EXPECT_EQ(CublasLtLinear::chosen_shapes(), first + 2);

  // Through CudaLinear: from version 2 on, prefill rows take the bucket's choice; version 1 asks cuBLAS.
  for (int version : {1, kLinearVersionDefault}) {
    CudaLinear linear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n, version);
    const size_t chosen = CublasLtLinear::chosen_shapes();
    expect_matches_cpu([&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
                         linear.run(y, fp32, x, W, s.n, s.in, s.out);
                       },
                       Shape{3000, in, out}, rng, "version " + std::to_string(version));
    EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen + (version == 1 ? 0 : 2)) << "version " << version;
  }
}

TEST(Ch06_LinearCuda, WideOutputsTakeTheTimedChoice) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  CudaContext ctx;
  // An LM head's shape (more outputs than kTunedWideOut), at rows where v1 would run: from version 2 on
  // CudaLinear times cuBLASLt's candidates once per 16 rows (v3's choice); version 1 asks cuBLAS. A shape
  // of its own (no other test chooses for it); 17 and 32 rows share one choice.
  const int in = 128, out = kTunedWideOut + 64;
  for (int version : {1, kLinearVersionDefault}) {
    CudaLinear linear(ctx.cublas, ctx.stream, ctx.workspace.ptr, ctx.workspace.n, version);
    const Project run = [&](void* y, bool fp32, const bf16* x, const bf16* W, Shape s) {
      linear.run(y, fp32, x, W, s.n, s.in, s.out);
    };
    const size_t chosen = CublasLtLinear::chosen_shapes();
    expect_matches_cpu(run, Shape{17, in, out}, rng, "version " + std::to_string(version));
    EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen + (version == 1 ? 0 : 2)) << "version " << version;
    expect_matches_cpu(run, Shape{32, in, out}, rng, "version " + std::to_string(version));
    EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen + (version == 1 ? 0 : 2)) << "the rows of 17-32 share one";
    if (version != 1) {
      EXPECT_TRUE(CublasLtLinear::has_choice(17, in, out, true));
      EXPECT_TRUE(CublasLtLinear::has_choice(17, in, out, false));
    }
  }
}

#else
TEST(Ch06_LinearCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
