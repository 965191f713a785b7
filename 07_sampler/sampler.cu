// sampler.cu: argmax of (logits / T + Gumbel noise) per row, or of the logits alone when T = 0.
#include <climits>

#include "07_sampler/sampler.h"
#include "07_sampler/sampler_top_k_top_p.h"

namespace nanovllm {

namespace {

constexpr int kThreads = 1024;

// (score, index) pairs compare by score, then prefer the lower index (torch.argmax's first maximum).
__device__ bool better(float score, int index, float best_score, int best_index) {
  return score > best_score || (score == best_score && index < best_index);
}

__global__ void sample_kernel(int32_t* tokens, const float* logits, int vocab_size, const SamplingRow* rows) {
  wait_for_previous_kernel();  // launched overlapped: nothing the previous kernel writes is read before this
  allow_next_kernel();
  const SamplingRow row = rows[blockIdx.x];
  const float* l = logits + int64_t(blockIdx.x) * vocab_size;
  float best = -INFINITY;
  int best_index = INT_MAX;
  int non_finite = 0;  // a NaN or +Inf logit anywhere in the row makes the token -1 (as an all -Inf row)
  for (int i = threadIdx.x; i < vocab_size; i += kThreads) {
    non_finite |= isnan(l[i]) || l[i] == INFINITY;
    if (l[i] == -INFINITY) continue;  // masked: never a candidate (a row of nothing else gives -1)
    float score = samples_greedily(row.temperature) ? l[i]
                                                    : l[i] / row.temperature + gumbel_noise(row.seed, row.step, uint32_t(i));
    if (better(score, i, best, best_index)) best = score, best_index = i;
  }
  // Reduce over the warp, then over the warps.
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float s = __shfl_xor_sync(0xffffffffu, best, off);
    int i = __shfl_xor_sync(0xffffffffu, best_index, off);
    if (better(s, i, best, best_index)) best = s, best_index = i;
  }
  __shared__ float warp_best[kThreads / 32];
  __shared__ int warp_index[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best, warp_index[warp] = best_index;
  non_finite = __syncthreads_or(non_finite);  // every warp's candidate is written
  if (warp != 0) return;
  best = warp_best[lane], best_index = warp_index[lane];  // kThreads / 32 == 32 candidates, one per lane
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float s = __shfl_xor_sync(0xffffffffu, best, off);
    int i = __shfl_xor_sync(0xffffffffu, best_index, off);
    if (better(s, i, best, best_index)) best = s, best_index = i;
  }
  if (lane == 0) tokens[blockIdx.x] = non_finite || best_index == INT_MAX ? -1 : best_index;
}

}  // namespace

void sample_cuda(int32_t* tokens, const float* logits, int num_rows, int vocab_size, const SamplingRow* rows,
                 cudaStream_t stream) {
  if (num_rows == 0) return;
  launch_overlapped(sample_kernel, num_rows, kThreads, 0, stream, tokens, logits, vocab_size, rows);
  CUDA_CHECK_LAUNCH();
  // Rows with top-k or top-p: sample_top_k_top_p_kernel (sampler_top_k_top_p.cu) samples them again and
  // overwrites their tokens; on the same stream, it runs after sample_kernel. Which rows those are is only
  // known on the device (a CUDA graph replays with new rows), so both kernels get a block for every row and
  // the second one returns at once for the rows it does not own.
  sample_top_k_top_p_cuda(tokens, logits, num_rows, vocab_size, rows, stream);
}

}  // namespace nanovllm
