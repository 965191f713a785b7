// linear_cpu.cpp: the reference matrix product, spread over the CPU's cores by output features (W's rows,
// y's columns).
#include <algorithm>
#include <thread>
#include <vector>

#include "06_tensor_parallel/linear.h"

namespace nanovllm {

namespace {

// y[i, o_begin:o_end] for every row i: each dot product reads one row of x and one row of W, both
// contiguous. Eight partial sums let the compiler keep several multiply-adds in flight.
void linear_rows(float* y, const float* x, const float* W, int n, int in, int out, int o_begin, int o_end) {
  for (int i = 0; i < n; i++) {
    const float* xi = x + int64_t(i) * in;
    for (int o = o_begin; o < o_end; o++) {
      const float* wo = W + int64_t(o) * in;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int k = 0;
      for (; k + 8 <= in; k += 8)
        for (int u = 0; u < 8; u++) acc[u] += xi[k + u] * wo[k + u];
      float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (; k < in; k++) sum += xi[k] * wo[k];
      y[int64_t(i) * out + o] = sum;
    }
  }
}

}  // namespace

void linear_cpu(float* y, const float* x, const float* W, int n, int in_features, int out_features) {
  // Threads only pay off for real work; the tiny test models stay single-threaded.
  const double flops = 2.0 * n * in_features * out_features;
  int threads = flops < 4e6 ? 1 : int(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  if (threads == 1) {
    linear_rows(y, x, W, n, in_features, out_features, 0, out_features);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    int begin = int(int64_t(out_features) * t / threads), end = int(int64_t(out_features) * (t + 1) / threads);
    pool.emplace_back(linear_rows, y, x, W, n, in_features, out_features, begin, end);
  }
  for (auto& th : pool) th.join();
}

TensorParallelLayout tensor_parallel_layout(int num_heads, int num_kv_heads, int intermediate_size, int64_t vocab_size,
                                            int tp_size) {
  TensorParallelLayout t;
  t.tp_size = tp_size;
  t.num_kv_heads = num_kv_heads;
  if (num_heads % tp_size != 0)
    fail("num_attention_heads (", num_heads, ") is not divisible by tensor_parallel_size ", tp_size);
  if (intermediate_size % tp_size != 0)
    fail("intermediate_size (", intermediate_size, ") is not divisible by tensor_parallel_size ", tp_size);
  if (num_kv_heads % tp_size != 0 && tp_size % num_kv_heads != 0)
    fail("num_key_value_heads (", num_kv_heads, ") and tensor_parallel_size ", tp_size,
         " do not divide one another: the KV heads can be neither split nor replicated evenly");
  t.heads_per_rank = num_heads / tp_size;
  t.kv_heads_per_rank = std::max(1, num_kv_heads / tp_size);
  t.intermediate_per_rank = intermediate_size / tp_size;
  t.vocab_per_rank = (vocab_size + tp_size - 1) / tp_size;
  return t;
}

}  // namespace nanovllm
