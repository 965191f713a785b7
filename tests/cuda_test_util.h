// cuda_test_util.h: helpers for the GPU tests: device arrays, a stream with a cuBLAS handle, bf16 rounding,
// error norms, and the skip when there is no GPU. Include only under #ifdef NANOVLLM_CUDA.
#pragma once

#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "01_sequence/base/cuda_utils.h"

namespace nanovllm::test {

// Skips the current test when no CUDA device is present (CI machines).
#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    if (!::nanovllm::cuda_device_present()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A device copy of a host vector, freed on destruction.
template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceArray(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, sizeof(T) * (count ? count : 1))); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> get() const {
    std::vector<T> host(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills with a NaN bit pattern, so that an element the kernel forgets to write is caught.
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xff, sizeof(T) * n)); }
};

// A stream, a 32 MiB workspace and a cuBLAS handle bound to both, as the CUDA backend sets them up.
struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  DeviceArray<char> workspace{size_t(32) << 20};
  CudaContext() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    EXPECT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
    cublasSetStream(cublas, stream);
    cublasSetWorkspace(cublas, workspace.ptr, workspace.n);
  }
  ~CudaContext() {
    cublasDestroy(cublas);
    cudaStreamDestroy(stream);
  }
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;
};

// Random floats already rounded to bf16, so that the CPU reference sees exactly what the GPU sees.
inline std::vector<float> random_bf16_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_float(float_to_bf16(normal(rng)));
  return v;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = __float2bfloat16(v[i]);  // round to nearest even, as float_to_bf16
  return out;
}

inline std::vector<float> to_float(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = __bfloat162float(v[i]);
  return out;
}

// ||got - want|| / ||want||; infinity if anything is NaN (a poisoned element never written).
inline double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += double(got[i] - want[i]) * (got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace nanovllm::test
