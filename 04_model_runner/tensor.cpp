// tensor.cpp: Buffer (host or GPU memory), Tensor views, and the Arena that carves one into the other.
#include "04_model_runner/tensor.h"

#include <cstdlib>

#ifdef NANOVLLM_CUDA
#include <cuda_runtime.h>
#endif

namespace nanovllm {

Buffer::Buffer(Device device, size_t bytes, bool pinned) : bytes_(bytes), device_(device), pinned_(pinned) {
  if (pinned && device != Device::CPU) fail("internal: only host memory can be pinned");
  if (bytes == 0) return;
  if (pinned) {
#ifdef NANOVLLM_CUDA
    // Portable: pinned for every GPU's context, whichever device is current. Mapped: kernels may read and
    // write it through the same pointer (a CUDA graph's own transfers, Backend::pull_async).
    cudaError_t err = cudaHostAlloc(&data_, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) {
      data_ = nullptr;
      (void)cudaGetLastError();
      fail("cannot allocate ", bytes >> 20, " MiB of pinned host memory (", cudaGetErrorString(err), ")");
    }
    return;
#else
    fail("internal: pinned host memory needs a build with CUDA");
#endif
  }
  if (device == Device::CPU) {
    data_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);  // a multiple of the alignment
    if (!data_) fail("out of host memory allocating ", bytes >> 20, " MiB");
    return;
  }
#ifdef NANOVLLM_CUDA
  cudaError_t err = cudaMalloc(&data_, bytes);
  if (err != cudaSuccess) {
    data_ = nullptr;
    (void)cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
    fail("out of GPU memory allocating ", bytes >> 20, " MiB (", cudaGetErrorString(err), ")");
  }
#else
  fail("this build has no CUDA support (it was built without nvcc)");
#endif
}

void Buffer::release() {
  if (!data_) return;
  if (pinned_) {
#ifdef NANOVLLM_CUDA
    cudaFreeHost(data_);
#endif
  } else if (device_ == Device::CPU) {
    std::free(data_);
  } else {
#ifdef NANOVLLM_CUDA
    cudaFree(data_);
#endif
  }
  data_ = nullptr;
  bytes_ = 0;
}

Buffer::~Buffer() { release(); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    pinned_ = other.pinned_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Tensor::Tensor(void* d, DType t, Device dev, std::initializer_list<int64_t> dims) : data(d), dtype(t), device(dev) {
  if (dims.size() > 4) fail("tensors have at most 4 dimensions");
  for (int64_t n : dims) shape[ndim++] = n;
}

int64_t Tensor::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t count) const {
  Tensor t = *this;
  t.data = static_cast<char*>(data) + size_t(begin * row_size()) * dtype_size(dtype);
  t.shape[0] = count;
  return t;
}

Tensor Arena::take(DType dtype, std::initializer_list<int64_t> dims) {
  Tensor t(nullptr, dtype, device_, dims);
  const size_t bytes = aligned(t.nbytes());
  if (!measuring_) {
    if (used_ + bytes > buffer_.bytes()) fail("internal: the arena's layout changed between its two passes");
    t.data = static_cast<char*>(buffer_.data()) + used_;
  }
  used_ += bytes;
  return t;
}

}  // namespace nanovllm
