// Buffer, Tensor and Arena (tensor.h): the contracts the rest of the engine builds its memory on. Every
// activation, weight and KV cache is a view carved by an Arena, so a view that points at the wrong bytes, or a
// layout that is not aligned as the header promises, would show up only as wrong numbers far from here.
#include "04_model_runner/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "tests/test_util.h"

using namespace nanovllm;

TEST(Ch04_Tensor, ATensorHasAtMostFourDimensions) {
  // shape[] holds 4; a fifth dimension must be refused, not written past the array.
  EXPECT_EQ(test::error_of([] { Tensor(nullptr, DType::F32, Device::CPU, {1, 2, 3, 4}); }), "");
  EXPECT_EQ(test::error_of([] { Tensor(nullptr, DType::F32, Device::CPU, {1, 2, 3, 4, 5}); }),
            "tensors have at most 4 dimensions");
}

TEST(Ch04_Tensor, SliceRowsPointsAtItsFirstRowAndHasItsRowCount) {
  // A 4 x 3 fp32 tensor: row r starts r * 3 * 4 bytes in. Rows [1, 3) are a 2 x 3 view 12 bytes in.
  float storage[12] = {};
  const Tensor t(storage, DType::F32, Device::CPU, {4, 3});
  const Tensor s = t.slice_rows(1, 2);
  EXPECT_EQ(s.data, static_cast<void*>(storage + 3));
  EXPECT_EQ(s.ndim, 2);
  EXPECT_EQ(s.shape[0], 2);
  EXPECT_EQ(s.shape[1], 3);
  EXPECT_EQ(s.numel(), 6);
  EXPECT_EQ(s.nbytes(), 24u);
  // On a 3-d tensor a row is everything past the first dimension: 2 x 5 bf16 elements, 20 bytes.
  uint16_t bf16[3 * 2 * 5] = {};
  const Tensor cube(bf16, DType::BF16, Device::CPU, {3, 2, 5});
  EXPECT_EQ(cube.slice_rows(2, 1).data, static_cast<void*>(bf16 + 20));
  EXPECT_EQ(cube.slice_rows(2, 1).nbytes(), 20u);
}

TEST(Ch04_Tensor, ArenaAlignsEveryTensorTo256Bytes) {
  // tensor.h: the Arena carves tensors "each aligned to 256 bytes". 3 floats (12 bytes) take one 256-byte
  // slot, 100 floats (400 bytes) two, one int32 one; the buffer is exactly their sum, 1,024 bytes.
  Tensor a, b, c;
  Buffer storage = Arena::carve(Device::CPU, [&](Arena& arena) {
    a = arena.take(DType::F32, {3});
    b = arena.take(DType::F32, {100});
    c = arena.take(DType::I32, {1});
  });
  EXPECT_EQ(storage.bytes(), 256u + 512u + 256u);
  EXPECT_EQ(a.data, storage.data());
  EXPECT_EQ(static_cast<char*>(b.data) - static_cast<char*>(a.data), 256);
  EXPECT_EQ(static_cast<char*>(c.data) - static_cast<char*>(b.data), 512);
  for (const Tensor* t : {&a, &b, &c}) EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 256, 0u);
  EXPECT_EQ(b.shape[0], 100);
  EXPECT_EQ(c.dtype, DType::I32);
}

TEST(Ch04_Tensor, ArenaRefusesALayoutThatGrowsBetweenItsTwoPasses) {
  // carve() sizes the buffer on its first pass; a layout that takes more on the second would be handed
  // memory past the buffer's end. It must fail instead.
  int pass = 0;
  const std::string error = test::error_of([&] {
    Arena::carve(Device::CPU, [&](Arena& arena) { arena.take(DType::F32, {pass++ == 0 ? 1 : 1000}); });
  });
  EXPECT_EQ(error, "internal: the arena's layout changed between its two passes");
}

TEST(Ch04_Tensor, HostMemoryThatCannotBeHadIsAnError) {
  // 2^62 bytes is past any machine's address space: the allocation fails and Buffer says so, in MiB
  // (2^62 >> 20 = 2^42 = 4398046511104), instead of handing back a null buffer.
  EXPECT_EQ(test::error_of([] { Buffer(Device::CPU, size_t(1) << 62); }),
            "out of host memory allocating 4398046511104 MiB");
}

#ifndef NANOVLLM_CUDA
TEST(Ch04_Tensor, GpuMemoryInABuildWithoutCudaIsAnError) {
  // A CPU-only build cannot give GPU memory: asking is an error, not a null buffer the caller would write to.
  EXPECT_EQ(test::error_of([] { Buffer(Device::CUDA, 1024); }),
            "this build has no CUDA support (it was built without nvcc)");
}
#endif
