// sampler.cu: argmax of (logits / T + Gumbel noise) per row, or of the logits alone when T = 0.
#include <algorithm>
#include <climits>

#include <cooperative_groups.h>

#include "07_sampler/sampler.h"
#include "07_sampler/sampler_top_k_top_p.h"

namespace nanovllm {

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxChunks = 8;  // blocks per row at most: the largest portable thread-block cluster

// (score, index) pairs compare by score, then prefer the lower index (torch.argmax's first maximum).
__device__ bool better(float score, int index, float best_score, int best_index) {
  return score > best_score || (score == best_score && index < best_index);
}

// The best (score, index) over the 32 lanes of a warp, in every lane.
__device__ void warp_best(float& best, int& best_index) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    float s = __shfl_xor_sync(0xffffffffu, best, off);
    int i = __shfl_xor_sync(0xffffffffu, best_index, off);
    if (better(s, i, best, best_index)) best = s, best_index = i;
  }
}

// Gumbel noise never exceeds this: G(u) = -log(-log u) is largest at the largest u sampler_uniform gives,
// 1 - 2^-24, where it is 16.64.
constexpr float kMaxNoise = 16.7f;

// Which entries of a sampled row can be skipped without their exact score: those whose score l / T + G(u)
// is certainly below `bar`, a little under the best score their warp has so far (below_bar).
//
// The exact score costs a precise division and two precise logarithms, about 100 of the ~136 instructions
// an entry took (04_model_runner/NOTES.md, section 5). The bound costs a multiplication and two fast
// exponentials: G is increasing in u, so G(u) < g exactly when u < exp(-exp(-g)), and with g = bar - l / T
// that says the score is below the bar. An entry whose scaled logit is more than kMaxNoise under the bar
// is skipped without its random number (its pair is hashed only if the other entry of the pair needs it).
//
// Why it never skips a winner. The scaled logit is l * (1 / T), within 2 ulps of l / T; __expf is within a
// few parts in 10^6, so the threshold is within 2e-6 of exp(-exp(-g)) and kUniformMargin (1e-5) covers
// it; the exact score's own rounding (two logf, one addition: a few ulps of a value under 17 and of the
// score) is far inside the bar's margin below the best (1e-3 + 1e-4 |best|, prune_bar). An entry that is
// not skipped gets its exact score, so the token is the one the unpruned loop picks (tested against it:
// Ch07_SamplerCuda.PruningNeverChangesTheToken).
constexpr float kUniformMargin = 1e-5f;

__device__ inline float prune_bar(float best) { return best - (1e-3f + 1e-4f * fabsf(best)); }

// The bound for an entry whose 23 random bits are k (sampler_bits_of_entry): true when its score is
// certainly below the bar, g = bar - l / T being the noise the entry would need to reach it. (An entry
// that would need more than kMaxNoise is skipped before its pair is hashed.)
__device__ inline bool below_bar(float g, uint32_t k) {
  return uniform_of_bits(k) < __expf(-__expf(-g)) - kUniformMargin;  // G(u) < g, with room for the fast exponentials
}

// Grid (chunks, num_rows), 1024 threads; with chunks > 1 the chunks of a row are one thread-block cluster.
// Block (chunk, row) finds the best candidate of its chunk of the row (vocab_size / chunks entries); the
// cluster's block 0 then reads every block's candidate from its shared memory (distributed shared memory,
// sm_90) and writes the row's token. One block per row would leave most of the GPU idle at small batches:
// at batch 1 a single SM would hash and log 151,936 entries.
//
// PRUNE: skip the exact score of the entries that cannot win (below_bar); the same token as without.
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
  const int per_chunk = ((vocab_size + chunks - 1) / chunks + 3) / 4 * 4;  // a multiple of 4: see the pruned loop
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
    // it, and two hashes, one a pair (sampler_bits). begin is a multiple of 4, so i is.
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
// alone do not, up to kMaxChunks; 1 where the kernel running is not sm_90 code (no clusters: its cluster
// reduction is compiled out).
int chunks_per_row(int num_rows) {
  static const int sms = [] {
    cudaFuncAttributes kernel = {};
    CUDA_CHECK(cudaFuncGetAttributes(&kernel, sample_kernel<true>));
    return kernel.binaryVersion >= 90 ? multiprocessor_count() : 0;
  }();
  return std::clamp((2 * sms + num_rows - 1) / num_rows, 1, kMaxChunks);
}

}  // namespace

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
