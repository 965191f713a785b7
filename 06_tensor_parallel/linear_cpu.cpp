// linear_cpu.cpp: the reference matrix product, spread over the CPU's cores by output rows.
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

}  // namespace nanovllm
