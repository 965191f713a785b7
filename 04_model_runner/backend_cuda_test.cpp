// The CUDA backend's step upload (Backend::upload_async): from a pinned Buffer, which the CUDA runtime
// must report as page-locked, and safe to overwrite once wait_for_upload_async() has returned.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <memory>
#include <vector>

#include "01_sequence/base/cuda_utils.h"
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

namespace nanovllm::test {
// graph_edges_test.cu: out = value after a spin, launched the ordinary way; out = in, launched overlapped.
void slow_fill_cuda(float* out, int n, float value, long long delay_cycles, cudaStream_t stream);
void overlapped_copy_cuda(float* out, const float* in, int n, cudaStream_t stream);
}  // namespace nanovllm::test

// A graph of [slow fill (ordinary), copy (overlapped), copy (overlapped)]: start_successors_early moves the
// one edge out of the ordinary kernel, not the one between the two overlapped kernels, and the first copy
// still waits for the fill (~100 µs of spin), replay after replay.
TEST(Ch04_BackendCuda, OverlappedKernelsAfterAnOrdinaryOneStartEarlyAndStillWait) {
  SKIP_WITHOUT_GPU();
  const int n = 1 << 16;
  const long long delay_cycles = 200000;  // ~100 µs at 2 GHz
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Buffer a(Device::CUDA, n * sizeof(float)), b(Device::CUDA, n * sizeof(float)), c(Device::CUDA, n * sizeof(float));
  float* pa = static_cast<float*>(a.data());
  float* pb = static_cast<float*>(b.data());
  float* pc = static_cast<float*>(c.data());
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  test::slow_fill_cuda(pa, n, 3.0f, delay_cycles, stream);
  test::overlapped_copy_cuda(pb, pa, n, stream);
  test::overlapped_copy_cuda(pc, pb, n, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  // Without overlapped launches (before sm_90) the capture has no programmatic edge to move.
  EXPECT_EQ(start_successors_early(graph), overlapped_launch_supported() ? 1 : 0);
  EXPECT_EQ(start_successors_early(graph), 0);  // moved already; the copy-to-copy edge stays
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> got_b(n), got_c(n);
  for (int replay = 0; replay < 3; replay++) {
    for (const Buffer* buffer : {&a, &b, &c}) CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->bytes(), stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaMemcpyAsync(got_b.data(), pb, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(got_c.data(), pc, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += got_b[size_t(i)] != 3.0f || got_c[size_t(i)] != 3.0f;
    ASSERT_EQ(wrong, 0) << "replay " << replay << ": a copy read its input before the kernel that writes it ended";
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

#else
TEST(Ch04_BackendCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
