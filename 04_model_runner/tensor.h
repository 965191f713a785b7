// tensor.h: memory on a device (Buffer, which owns it) and typed views of it (Tensor, which does not).
//
// The engine allocates everything up front (weights, KV cache, activations, step inputs) and then only
// passes views around, so pointers stay fixed for the whole run; that is also what CUDA graphs need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "01_sequence/base/common.h"
#include "04_model_runner/checkpoint/dtype.h"

namespace nanovllm {

enum class Device { CPU, CUDA };

// Bytes owned on one device: malloc'd host memory or cudaMalloc'd GPU memory. Move-only.
// `pinned` host memory (cudaHostAlloc, CUDA builds only) is page-locked: the GPU copies from it by DMA,
// asynchronously, where a copy from ordinary (pageable) memory first goes through a bounce buffer of the
// driver and returns only when the host side is done. It is also mapped: a kernel may read or write it
// through the same pointer, over PCIe.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes, bool pinned = false);  // throws Error when out of memory
  ~Buffer();
  Buffer(Buffer&& other) noexcept { *this = static_cast<Buffer&&>(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
  bool pinned_ = false;
};

// A contiguous, row-major view: up to 4 dimensions of one dtype on one device.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* data, DType dtype, Device device, std::initializer_list<int64_t> dims);

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t rows() const { return shape[0]; }
  int64_t row_size() const { return rows() ? numel() / rows() : 0; }  // elements per row
  // Rows [begin, begin + count) of the first dimension.
  Tensor slice_rows(int64_t begin, int64_t count) const;

  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Carves tensors out of one Buffer, each aligned to 256 bytes (what cuBLAS and vector loads like).
// A layout is written once, as a function that takes its tensors from an Arena; carve() runs it twice:
// first on a measuring Arena (no memory: it only adds up sizes), then on one Buffer of exactly that size.
//
//   Buffer storage = Arena::carve(device, [&](Arena& a) { x = a.take(DType::F32, {T, H}); ... });
class Arena {
 public:
  template <class Layout>
  static Buffer carve(Device device, Layout&& layout, bool pinned = false) {
    Arena measure(device, 0, /*measuring=*/true, pinned);
    layout(measure);
    Arena arena(device, measure.used_, false, pinned);
    layout(arena);
    return std::move(arena.buffer_);
  }

  Tensor take(DType dtype, std::initializer_list<int64_t> dims);

 private:
  Arena(Device device, size_t bytes, bool measuring, bool pinned)
      : buffer_(measuring ? Buffer() : Buffer(device, bytes, pinned)), device_(device), measuring_(measuring) {}
  static size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

  Buffer buffer_;
  Device device_;
  bool measuring_;
  size_t used_ = 0;
};

}  // namespace nanovllm
