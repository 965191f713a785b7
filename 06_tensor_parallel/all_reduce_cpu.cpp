// all_reduce_cpu.cpp: the references of the collectives, the answers the CUDA kernels must give bit for bit.
#include <algorithm>

#include "06_tensor_parallel/all_reduce.h"
#include "01_sequence/base/bf16.h"

namespace nanovllm {

void all_reduce_cpu(uint16_t* out, const uint16_t* const* x, int world, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float sum = bf16_to_float(x[0][i]);  // starting from rank 0's value, not 0.0f: -0 + -0 stays -0
    for (int r = 1; r < world; r++) sum += bf16_to_float(x[r][i]);
    out[i] = float_to_bf16(sum);
  }
}

void gather_cpu(float* out, const float* const* shards, int world, int rows, int shard_cols, int out_cols) {
  for (int row = 0; row < rows; row++)
    for (int r = 0; r < world; r++) {
      const int width = std::min(shard_cols, out_cols - r * shard_cols);  // the last shard is cut at out_cols
      for (int c = 0; c < width; c++)
        out[int64_t(row) * out_cols + r * shard_cols + c] = shards[r][int64_t(row) * shard_cols + c];
    }
}

}  // namespace nanovllm
