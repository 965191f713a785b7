// The cuBLAS projection against the CPU reference, with bf16 and fp32 outputs.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include "06_tensor_parallel/linear.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

TEST(Ch06_LinearCuda, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  cublasHandle_t handle;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  struct Shape { int n, in, out; };
  for (Shape s : {Shape{1, 64, 512}, Shape{37, 96, 288}, Shape{256, 1024, 4096}, Shape{5, 3072, 1024}}) {
    std::vector<float> x = random_bf16_values(size_t(s.n) * s.in, rng);
    std::vector<float> w = random_bf16_values(size_t(s.out) * s.in, rng, 1.0f / std::sqrt(float(s.in)));
    std::vector<float> want(size_t(s.n) * s.out);
    linear_cpu(want.data(), x.data(), w.data(), s.n, s.in, s.out);
    DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y(want.size());
    DeviceArray<float> d_y32(want.size());
    d_y.poison(), d_y32.poison();
    linear_cuda(handle, d_y.ptr, false, d_x.ptr, d_w.ptr, s.n, s.in, s.out);
    linear_cuda(handle, d_y32.ptr, true, d_x.ptr, d_w.ptr, s.n, s.in, s.out);
    EXPECT_LE(rel_error(to_float(d_y.get()), want), 1e-2) << s.n << "x" << s.in << "x" << s.out;
    EXPECT_LE(rel_error(d_y32.get(), want), 1e-4) << "fp32 out " << s.n << "x" << s.in << "x" << s.out;
  }
  cublasDestroy(handle);
}

#else
TEST(Ch06_LinearCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
