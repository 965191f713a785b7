// sampler.cu: argmax of (logits / T + Gumbel noise) per row, or of the logits alone when T = 0.
//
// The kernels, in the order a reader should take them (sample_row_cpu in sampler_cpu.cpp is the spec):
//   sample_kernel<false>    v0: every entry scored exactly, the CPU loop spread over a block's 1024 threads
//                           and over up to 8 blocks of a thread-block cluster per row
//   sample_kernel<true>     v1, the default: an entry whose score certainly falls below its warp's best skips
//                           the exact score (below_bar); the same tokens, 177 -> 72.7 µs a step at 256 rows
//                           (sampler.h)
//   tokens_from_keys_kernel the ending of sampling inside the LM head's GEMM (sample_tile.cuh)
// Rows asking for top-k or top-p are sampled again by sampler_top_k_top_p.cu.
#include <algorithm>
#include <climits>

#include <cooperative_groups.h>

#include "07_sampler/sample_tile.cuh"
#include "07_sampler/sampler.h"
#include "07_sampler/sampler_top_k_top_p.h"

namespace nanovllm {

namespace {

// The most threads a block may have, so 32 warps: the final reduction gives warp 0 one candidate a lane.
constexpr int kThreads = 1024;
static_assert(kThreads == 32 * 32, "warp 0 reduces one candidate per warp, one a lane");
constexpr int kMaxChunks = 8;  // blocks per row at most: the largest portable thread-block cluster

// The best (score, index) over the 32 lanes of a warp, in every lane.
__device__ void warp_best(float& best, int& best_index) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float s = __shfl_xor_sync(0xffffffffu, best, off);
    int i = __shfl_xor_sync(0xffffffffu, best_index, off);
    if (better(s, i, best, best_index)) best = s, best_index = i;
  }
}

// Grid (chunks, num_rows), 1024 threads; with chunks > 1 the chunks of a row are one thread-block cluster.
// Block (chunk, row) finds the best candidate of its chunk of the row (ceil(vocab_size / chunks) rounded up
// to a multiple of 4 entries, the last chunk the rest); the
// cluster's block 0 then reads every block's candidate from its shared memory (distributed shared memory,
// sm_90) and writes the row's token. One block per row would leave most of the GPU idle at small batches:
// at batch 1 a single SM would hash and log 151,936 entries.
//
// PRUNE: skip the exact score of the entries that cannot win (below_bar, sample_tile.cuh); the same token as
// without.
// The bar is the warp's: prune_bar of the best score any of its 32 lanes has so far. A per-lane bar would
// leave most iterations with some lane whose entry beats its own short history, and a warp runs the exact
// score if any lane needs it; against the warp's best, an iteration needs it only when one of 128 new
// entries (4 a lane) beats all the warp has seen, about ln(iterations) + 0.6 times per warp (the first included), and
// only then is the bar updated (a max over the lanes, 5 shuffles). An entry skipped is below some lane's
// best by the bar's margin: never the row's winner, nor tied with it.
template <bool PRUNE>
__global__ void sample_kernel(int32_t* tokens, const float* logits, int vocab_size, const SamplingRow* rows) {
  wait_for_previous_kernel();  // launched overlapped: nothing the previous kernel writes is read before this
  allow_next_kernel();
  const int chunk = blockIdx.x, chunks = gridDim.x;
  const SamplingRow row = rows[blockIdx.y];
  const float* l = logits + int64_t(blockIdx.y) * vocab_size;
  // A multiple of 4: see the pruned loop. Vocabulary 151,936: 8 chunks of 18,992; 5 chunks of 30,388, the
  // last 30,384.
  const int per_chunk = ((vocab_size + chunks - 1) / chunks + 3) / 4 * 4;
  const int begin = chunk * per_chunk, end = min(vocab_size, begin + per_chunk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool greedy = samples_greedily(row.temperature);
  float best = -INFINITY;
  int best_index = INT_MAX;
  int non_finite = 0;  // a NaN or +Inf logit anywhere in the row makes the token -1 (as an all -Inf row)
  if (!PRUNE || greedy) {
    for (int i = begin + threadIdx.x; i < end; i += kThreads) {
      const float logit = l[i];
      non_finite |= isnan(logit) || logit == INFINITY;
      if (logit == -INFINITY) continue;  // masked: never a candidate (a row of nothing else gives -1)
      const float score = greedy ? logit : logit / row.temperature + gumbel_noise(row.seed, row.step, uint32_t(i));
      if (better(score, i, best, best_index)) best = score, best_index = i;
    }
  } else {
    const float inverse_temperature = 1.0f / row.temperature;
    float bar = -INFINITY;  // the warp's: prune_bar(the best score of any of its lanes)
    // Lane `lane` takes the 4 entries i .. i + 3, i = base + 4 * lane: one 16-byte load where the row allows
    // it, and two hashes, one a pair (sampler_bits). begin is a multiple of 4, so i is. A warp covers 128
    // entries (32 lanes x 4) and the block 4 * kThreads a round. `base` depends on the warp alone, so every lane
    // runs the same rounds and reaches the full-mask __any_sync and shuffles below together.
    const bool vector_loads = reinterpret_cast<uintptr_t>(l) % 16 == 0;
    for (int base = begin + warp * 128; base < end; base += 4 * kThreads) {
      const int i = base + 4 * lane;
      float v[4];
      if (vector_loads && i + 3 < end) {
        const float4 four = *reinterpret_cast<const float4*>(l + i);
        v[0] = four.x, v[1] = four.y, v[2] = four.z, v[3] = four.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = i + j < end ? l[i + j] : -INFINITY;
      }
      unsigned scores = 0;  // bit j: entry i + j needs its exact score
#pragma unroll
      for (int pair = 0; pair < 2; pair++) {
        const float a = v[2 * pair], b = v[2 * pair + 1];
        non_finite |= isnan(a) || a == INFINITY || isnan(b) || b == INFINITY;
        // -Inf is masked (never a candidate); a NaN fails the comparison and the row gives -1 anyway.
        const float ga = bar - a * inverse_temperature, gb = bar - b * inverse_temperature;
        const bool hash_a = a != -INFINITY && ga <= kMaxNoise, hash_b = b != -INFINITY && gb <= kMaxNoise;
        if (hash_a || hash_b) {
          const uint64_t z = sampler_bits(row.seed, row.step, uint32_t(i / 2 + pair));
          if (hash_a && !below_bar(ga, sampler_bits_of_entry(z, 0))) scores |= 1u << (2 * pair);
          if (hash_b && !below_bar(gb, sampler_bits_of_entry(z, 1))) scores |= 2u << (2 * pair);
        }
      }
      if (!__any_sync(0xffffffffu, scores != 0)) continue;
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (scores >> j & 1) {
          const float score = v[j] / row.temperature + gumbel_noise(row.seed, row.step, uint32_t(i + j));
          if (better(score, i + j, best, best_index)) best = score, best_index = i + j;
        }
      float warp_max = best;
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) warp_max = fmaxf(warp_max, __shfl_xor_sync(0xffffffffu, warp_max, off));
      bar = prune_bar(warp_max);
    }
  }
  // Reduce over the warp, then over the block's 32 warps.
  warp_best(best, best_index);
  __shared__ float warp_score[kThreads / 32];
  __shared__ int warp_index[kThreads / 32];
  if (lane == 0) warp_score[warp] = best, warp_index[warp] = best_index;
  non_finite = __syncthreads_or(non_finite);  // every warp's candidate is written
  if (warp == 0) {
    best = warp_score[lane], best_index = warp_index[lane];  // kThreads / 32 == 32 candidates, one per lane
    warp_best(best, best_index);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (chunks > 1) {
    __shared__ float chunk_score;  // this block's candidate, read by the cluster's block 0
    __shared__ int chunk_index, chunk_non_finite;
    if (threadIdx.x == 0) chunk_score = best, chunk_index = best_index, chunk_non_finite = non_finite;
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    cluster.sync();  // every block's candidate is in its shared memory, visible to the cluster
    if (chunk == 0 && warp == 0) {
      best = -INFINITY, best_index = INT_MAX, non_finite = 0;
      if (lane < chunks) {  // lane c reads block c's candidate
        best = *cluster.map_shared_rank(&chunk_score, lane);
        best_index = *cluster.map_shared_rank(&chunk_index, lane);
        non_finite = *cluster.map_shared_rank(&chunk_non_finite, lane);
      }
      warp_best(best, best_index);
      non_finite = __any_sync(0xffffffffu, non_finite);
    }
    cluster.sync();  // no block exits (freeing its shared memory) before block 0 has read it
  }
#endif
  if (chunk == 0 && threadIdx.x == 0)
    tokens[blockIdx.y] = non_finite || best_index == INT_MAX ? -1 : best_index;
}

// Blocks per row: enough to give the GPU two 1024-thread blocks per SM (the most that fit) when the rows
// alone do not, up to kMaxChunks (an H200's 132 SMs, 264 blocks: 1-32 rows 8 chunks, 64 rows 5, 128 rows
// 3, 132 rows 2, from 264 rows 1); 1 where the kernel running is not sm_90 code (no clusters: its cluster
// reduction is compiled out).
int chunks_per_row(int num_rows) {
  static const int sms = [] {
    cudaFuncAttributes kernel = {};
    CUDA_CHECK(cudaFuncGetAttributes(&kernel, sample_kernel<true>));
    return kernel.binaryVersion >= 90 ? multiprocessor_count() : 0;
  }();
  return std::clamp((2 * sms + num_rows - 1) / num_rows, 1, kMaxChunks);
}

// One thread a row: the token of its key (sample_tile), -1 for a row flagged broken or with no candidate;
// then the key and the flag back to zero for the next GEMM.
__global__ void tokens_from_keys_kernel(int32_t* tokens, unsigned long long* best_keys, int* broken, int num_rows) {
  wait_for_previous_kernel();  // launched overlapped: the keys and flags are the GEMM's output
  allow_next_kernel();
  const int r = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= num_rows) return;
  const unsigned long long key = best_keys[r];
  tokens[r] = broken[r] || key == 0 ? -1 : index_of_candidate(key);
  best_keys[r] = 0, broken[r] = 0;
}

}  // namespace

void sample_from_keys_cuda(int32_t* tokens, unsigned long long* best_keys, int* broken, const float* logits,
                           int num_rows, int vocab_size, const SamplingRow* rows, cudaStream_t stream) {
  if (num_rows == 0) return;
  launch_overlapped(tokens_from_keys_kernel, dim3(unsigned((num_rows + 255) / 256)), dim3(256), 0, stream, tokens,
                    best_keys, broken, num_rows);
  CUDA_CHECK_LAUNCH();
  sample_top_k_top_p_cuda(tokens, logits, num_rows, vocab_size, rows, stream);  // as in sample_cuda
}

void sample_cuda(int32_t* tokens, const float* logits, int num_rows, int vocab_size, const SamplingRow* rows,
                 cudaStream_t stream, bool prune) {
  if (num_rows == 0) return;
  const int chunks = chunks_per_row(num_rows);
  // The chunks of a row are one cluster.
  launch_overlapped_in_clusters(prune ? sample_kernel<true> : sample_kernel<false>, dim3(unsigned(chunks), unsigned(num_rows)), unsigned(chunks), kThreads, 0,
                                stream, tokens, logits, vocab_size, rows);
  CUDA_CHECK_LAUNCH();
  // Rows with top-k or top-p: sample_top_k_top_p_kernel (sampler_top_k_top_p.cu) samples them again and
  // overwrites their tokens; on the same stream, it runs after sample_kernel. Which rows those are is only
  // known on the device (a CUDA graph replays with new rows), so both kernels get a block for every row and
  // the second one returns at once for the rows it does not own.
  sample_top_k_top_p_cuda(tokens, logits, num_rows, vocab_size, rows, stream);
}

}  // namespace nanovllm
