// The CUDA backend's step upload (Backend::upload_async): from a pinned Buffer, which the CUDA runtime
// must report as page-locked, and safe to overwrite once wait_for_upload_async() has returned; the same
// for a graph that pulls its inputs itself and pushes its tokens (pull_async, push_tokens_async). Then the
// edges between a step's kernels (cuda_utils.h): each kernel still reads its input whole when the one
// before it was let in early; blocks asking for one_block_per_sm_smem_bytes never share an SM, and which
// grids one_block_per_sm_launch_bytes asks those bytes for, and the opt-in allow_one_block_per_sm makes for them.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "01_sequence/base/cuda_utils.h"
#include "04_model_runner/backend.h"
#include "04_model_runner/layers.h"
#include "06_tensor_parallel/linear.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

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
// graph_edges_test.cu: out = value after a spin, launched the ordinary way; out = in, launched overlapped;
// dst = src after a spin, launched overlapped and letting the next kernel start at once.
void slow_fill_cuda(float* out, int n, float value, long long delay_cycles, cudaStream_t stream);
void overlapped_copy_cuda(float* out, const float* in, int n, cudaStream_t stream);
void late_copy_cuda(bf16* dst, const bf16* src, int64_t n, long long delay_cycles, cudaStream_t stream);
void record_residency_cuda(int blocks, int smem_bytes, int* sm_of_block, long long* begin, long long* end,
                           long long delay_cycles, cudaStream_t stream);
const void* opt_in_probe_kernel_address();  // a kernel never launched, for its attributes
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

// A CUDA graph's own transfers (Backend::pull_async, push_tokens_async): at each replay the graph reads
// the ranges of the pinned mirror into the device buffer (and nothing outside them), and writes the tokens
// to the slot the mirror names. Each replay waits behind ~100 µs of spin, so the pull runs well after the
// host queued it: wait_for_upload_async() must hold the host until the pull has read the mirror (the host
// then overwrites it with -1s, which a late pull would copy), and wait_for_download_async(slot) until the
// tokens are there.
TEST(Ch04_BackendCuda, AGraphPullsItsRangesAndPushesItsTokensAtEachReplay) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Backend> backend = make_cuda_backend(0);
  const cudaStream_t stream = static_cast<cudaStream_t>(backend->stream());
  const int64_t words = 16384, stride = 128, num_tokens = 100;
  const int64_t token_word = 2048, slot_word = 15000;  // where the tokens and the slot are, in words
  // Four ranges, 40,412 bytes: more than one round of the pull's block (32 KiB).
  const std::vector<Backend::ByteRange> ranges = {{0, 400}, {4096, 8}, {4 * token_word, 40000}, {4 * slot_word, 4}};
  Buffer mirror(Device::CPU, size_t(words) * 4, /*pinned=*/true), device(Device::CUDA, size_t(words) * 4);
  Buffer tokens(Device::CPU, size_t(2 * stride) * 4, /*pinned=*/true), spin(Device::CUDA, 4096);
  const Tensor dst(device.data(), DType::U8, Device::CUDA, {words * 4});
  const Tensor src(static_cast<int32_t*>(device.data()) + token_word, DType::I32, Device::CUDA, {num_tokens});
  const Tensor slot(static_cast<int32_t*>(device.data()) + slot_word, DType::I32, Device::CUDA, {1});
  backend->begin_capture();
  backend->pull_async(dst, mirror.data(), ranges);
  backend->push_tokens_async(tokens.data(), stride, src, slot);
  const int graph = backend->end_capture();

  std::vector<bool> pulled(static_cast<size_t>(words), false);
  for (const Backend::ByteRange& r : ranges)
    for (int64_t w = r.offset / 4; w < (r.offset + r.bytes) / 4; w++) pulled[size_t(w)] = true;
  int32_t* host = static_cast<int32_t*>(mirror.data());
  const int32_t* host_tokens = static_cast<const int32_t*>(tokens.data());
  CUDA_CHECK(cudaMemsetAsync(device.data(), 0x7f, device.bytes(), stream));  // 0x7f7f7f7f outside the ranges
  std::vector<int32_t> got(static_cast<size_t>(words));
  for (int replay = 0; replay < 4; replay++) {
    backend->wait_for_upload_async();
    for (int64_t w = 0; w < words; w++) host[w] = int32_t(w * 3 + replay);
    host[slot_word] = replay % 2;
    test::slow_fill_cuda(static_cast<float*>(spin.data()), 1, 1.0f, 200000, stream);  // ~100 µs
    backend->replay(graph);
    backend->record_download_async(replay % 2);
    backend->wait_for_upload_async();
    for (int64_t w = words - 1; w >= 0; w--) host[w] = -1;
    backend->wait_for_download_async(replay % 2);
    int wrong_tokens = 0;
    for (int64_t i = 0; i < num_tokens; i++) wrong_tokens += host_tokens[(replay % 2) * stride + i] != int32_t((token_word + i) * 3 + replay);
    EXPECT_EQ(wrong_tokens, 0) << "replay " << replay << ": tokens in slot " << replay % 2;
    backend->download(got.data(), Tensor(device.data(), DType::I32, Device::CUDA, {words}));
    int wrong_in = 0, wrong_out = 0;
    for (int64_t w = 0; w < words; w++) {
      if (w == slot_word) continue;
      if (pulled[size_t(w)]) wrong_in += got[size_t(w)] != int32_t(w * 3 + replay);
      else wrong_out += got[size_t(w)] != 0x7f7f7f7f;
    }
    EXPECT_EQ(wrong_in, 0) << "replay " << replay << ": words of the ranges not pulled (or pulled after the host's -1s)";
    EXPECT_EQ(wrong_out, 0) << "replay " << replay << ": words outside the ranges written";
    EXPECT_EQ(got[size_t(slot_word)], replay % 2);
  }
}

// A layer's chain at its tightest: the projection before a norm ends late (a kernel that lets the norm start,
// then spins ~100 µs before writing the norm's input over NaN), add_rmsnorm lets the projection after it
// start before its own wait (cuda_utils.h, "a norm lets the next kernel in first"), and that projection (v2
// at one row, v5 at 4, v6 at 16) asks for its weights at once. Each must still see its input whole: the
// norm's output and the residual against add_rmsnorm_cpu, the projection's against linear_cpu of it.
TEST(Ch04_BackendCuda, AProjectionLetInBeforeTheNormWaitsStillReadsTheNormOfTheLateInput) {
  SKIP_WITHOUT_GPU();
  const int hidden = 1024, out = 2048;
  const long long delay_cycles = 200000;  // ~100 µs at 2 GHz
  CudaContext ctx;
  const cudaStream_t stream = ctx.stream;
  CudaLinear linear(ctx.cublas, stream, ctx.workspace.ptr, ctx.workspace.n);
  std::mt19937 rng(11);
  const std::vector<float> w_norm = random_bf16_values(size_t(hidden), rng);
  const std::vector<float> W = random_bf16_values(size_t(out) * hidden, rng, 1.0f / std::sqrt(float(hidden)));
  DeviceArray<bf16> d_w_norm(to_bf16(w_norm)), d_W(to_bf16(W));
  for (int n : {1, 4, 16}) {
    const std::vector<float> x = random_bf16_values(size_t(n) * hidden, rng, 3.0f);
    const std::vector<float> res = random_bf16_values(size_t(n) * hidden, rng, 3.0f);
    std::vector<float> res_want = res, normed_want(x.size()), y_want(size_t(n) * out);
    add_rmsnorm_cpu(normed_want.data(), res_want.data(), x.data(), w_norm.data(), n, hidden, 1e-6f);
    std::vector<float> normed_rounded = to_float(to_bf16(normed_want));  // as the GPU stores it
    linear_cpu(y_want.data(), normed_rounded.data(), W.data(), n, hidden, out);
    DeviceArray<bf16> d_src(to_bf16(x)), d_x(x.size()), d_res(to_bf16(res)), d_normed(x.size()), d_y(y_want.size());
    d_x.poison(), d_normed.poison(), d_y.poison();
    CUDA_CHECK(cudaDeviceSynchronize());  // the uploads and poison, on the legacy stream, before `stream`
    test::late_copy_cuda(d_x.ptr, d_src.ptr, int64_t(x.size()), delay_cycles, stream);
    add_rmsnorm_cuda(d_normed.ptr, d_res.ptr, d_x.ptr, d_w_norm.ptr, n, hidden, 1e-6f, stream);
    linear.run(d_y.ptr, false, d_normed.ptr, d_W.ptr, n, hidden, out);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_LE(rel_error(to_float(d_normed.get()), normed_want), 1e-2) << n << " rows: the norm";
    EXPECT_LE(rel_error(to_float(d_res.get()), res_want), 1e-2) << n << " rows: the residual";
    EXPECT_LE(rel_error(to_float(d_y.get()), y_want), 1e-2) << n << " rows: the projection after the norm";
  }
}

// one_block_per_sm_smem_bytes (cuda_utils.h): a grid of twice as many blocks as SMs, each spinning ~20 µs. Asking
// for those bytes, no two blocks are ever on one SM at once (the grid runs in two waves); asking for nothing, the
// same grid fits at once, two blocks an SM, so some SM holds two blocks together: the control, which shows that
// the first launch could have broken the rule and did not.
TEST(Ch04_BackendCuda, BlocksAskingForOneBlockPerSmSharedMemoryNeverShareAnSm) {
  SKIP_WITHOUT_GPU();
  const int blocks = 2 * multiprocessor_count();
  const long long delay_cycles = 40000;  // ~20 µs at 2 GHz
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceArray<int> d_sm(static_cast<size_t>(blocks));
  DeviceArray<long long> d_begin(static_cast<size_t>(blocks)), d_end(static_cast<size_t>(blocks));
  // The largest number of this grid's blocks that were on one SM at the same time.
  auto most_on_one_sm = [&](int smem_bytes) {
    test::record_residency_cuda(blocks, smem_bytes, d_sm.ptr, d_begin.ptr, d_end.ptr, delay_cycles, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<int> sm = d_sm.get();
    const std::vector<long long> begin = d_begin.get(), end = d_end.get();
    int most = 0;
    for (int a = 0; a < blocks; a++) {
      const size_t i = size_t(a);
      int together = 0;  // blocks on a's SM running as a starts, a included
      for (size_t j = 0; j < size_t(blocks); j++)
        together += sm[j] == sm[i] && begin[j] <= begin[i] && begin[i] < end[j];
      most = std::max(most, together);
    }
    return most;
  };
  EXPECT_EQ(most_on_one_sm(one_block_per_sm_smem_bytes()), 1) << "blocks asking for one_block_per_sm_smem_bytes()";
  EXPECT_GE(most_on_one_sm(0), 2) << "the control: blocks asking for no shared memory";
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// one_block_per_sm_launch_bytes (cuda_utils.h), the rule decode attention and o_proj's merge launch by, against
// the device's own figures asked of the runtime here: a grid that fits the SMs asks for at least half an SM's
// shared memory (and for what its blocks use, if more); one block more, and it asks only for what it uses.
TEST(Ch04_BackendCuda, LaunchBytesHoldAGridToOneBlockAnSmOnlyWhereItFits) {
  SKIP_WITHOUT_GPU();
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int sms = prop.multiProcessorCount, half_sm = int(prop.sharedMemPerMultiprocessor / 2);
  ASSERT_EQ(multiprocessor_count(), sms);
  EXPECT_GT(one_block_per_sm_smem_bytes(), half_sm);
  EXPECT_LE(one_block_per_sm_smem_bytes(), half_sm + 1024);
  for (const int used : {0, 40000, half_sm + 4096}) {
    EXPECT_EQ(one_block_per_sm_launch_bytes(sms, used), std::max(used, one_block_per_sm_smem_bytes())) << used;
    EXPECT_EQ(one_block_per_sm_launch_bytes(1, used), std::max(used, one_block_per_sm_smem_bytes())) << used;
    EXPECT_EQ(one_block_per_sm_launch_bytes(sms + 1, used), used) << used;
  }
}

// allow_one_block_per_sm (cuda_utils.h), the opt-in beside those launches, read back from the runtime: it allows
// the larger of the kernel's own bytes and one_block_per_sm_smem_bytes(), and only on its first call on a device
// for the same `once` (the launch sites call it on every eager launch, with the same bytes).
TEST(Ch04_BackendCuda, AllowOneBlockPerSmOptsInToTheLargerSizeOncePerDevice) {
  SKIP_WITHOUT_GPU();
  const void* kernel = test::opt_in_probe_kernel_address();
  auto allowed = [&] {
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    return attributes.maxDynamicSharedSizeBytes;
  };
  const int spread = one_block_per_sm_smem_bytes();
  PerDeviceOnce once;
  allow_one_block_per_sm(once, kernel, 0);
  EXPECT_EQ(allowed(), spread) << "a kernel using no shared memory";
  allow_one_block_per_sm(once, kernel, spread + 4096);
  EXPECT_EQ(allowed(), spread) << "the same `once` again: nothing set";
  PerDeviceOnce another;
  allow_one_block_per_sm(another, kernel, spread + 4096);
  EXPECT_EQ(allowed(), spread + 4096) << "a kernel using more than the spread bytes";
}

#else
TEST(Ch04_BackendCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
