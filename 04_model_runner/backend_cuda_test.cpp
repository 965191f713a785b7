// The CUDA backend's step upload (Backend::upload_async): from a pinned Buffer, which the CUDA runtime
// must report as page-locked, and safe to overwrite once wait_for_upload_async() has returned.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <memory>
#include <vector>

#include "04_model_runner/backend.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;

TEST(Ch04_BackendCuda, PinnedUploadAsyncIsPageLockedAndWaitedForBeforeReuse) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Backend> backend = make_cuda_backend(0);
  const int64_t n = int64_t(16) << 20;  // 64 MiB of int32: a DMA of a millisecond or more
  Buffer pinned(Device::CPU, size_t(n) * 4, /*pinned=*/true), pageable(Device::CPU, 4096);
  cudaPointerAttributes attr;
  CUDA_CHECK(cudaPointerGetAttributes(&attr, pinned.data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "pinned host memory";
  CUDA_CHECK(cudaPointerGetAttributes(&attr, pageable.data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeUnregistered) << "ordinary host memory";

  Buffer device(Device::CUDA, size_t(n) * 4);
  const Tensor dst(device.data(), DType::I32, Device::CUDA, {n});
  int32_t* host = static_cast<int32_t*>(pinned.data());
  std::vector<int32_t> got(static_cast<size_t>(n));
  for (int round = 0; round < 3; round++) {
    for (int64_t i = 0; i < n; i++) host[i] = int32_t(i * 7 + round);
    backend->upload_async(dst, host);
    backend->wait_for_upload_async();
    // Overwrite from the end, where a copy still running would read last: had the wait returned early,
    // the device would get some of these -1s.
    for (int64_t i = n - 1; i >= 0; i--) host[i] = -1;
    backend->download(got.data(), dst);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += got[size_t(i)] != int32_t(i * 7 + round);
    ASSERT_EQ(wrong, 0) << "round " << round;
  }
}

#else
TEST(Ch04_BackendCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
