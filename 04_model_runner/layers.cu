// layers.cu: CUDA kernels for the non-attention layers. Memory-bound, so each is written for one pass
// over its data with 16-byte accesses; arithmetic is fp32, storage bf16. CPU references: layers_cpu.cpp.
#include <algorithm>
#include <cassert>

#include "01_sequence/base/ptx.cuh"
#include "04_model_runner/layers.h"
#include "06_tensor_parallel/linear.h"
#include "05_attention/qk_norm_rope.cuh"

namespace nanovllm {

namespace {

constexpr int kRowThreads = 128;        // one block per row for the row-wise kernels
constexpr int kMaxChunksPerThread = 8;  // hidden <= 8 * 8 * 128 = 8192
// From this many rows a call is a prefill's (a decode step has at most max_num_seqs rows, 512 by default):
// rmsnorm_kernel and qk_norm_rope_store_kernel launch differently for the two (see each launcher).
constexpr int kPrefillRows = 1024;

// out (n, hidden) bf16 = the rows of table (vocab_size, hidden) bf16 picked by ids (n,) i32, one block a
// row; an id outside [vocab_start, vocab_start + vocab_size) gives a zero row (another rank's: the
// all-reduce adds it). hidden % 8 == 0.
__global__ void embedding_kernel(bf16* out, const bf16* table, const int32_t* ids, int hidden, int vocab_start,
                                 int vocab_size) {
  wait_for_previous_kernel();  // launched overlapped: nothing the previous kernel writes is read before this
  allow_next_kernel();
  const int row = blockIdx.x;
  const int local = ids[row] - vocab_start;
  bf16* dst = out + int64_t(row) * hidden;
  const bool mine = local >= 0 && local < vocab_size;  // vocab-parallel: other ranks' ids give zeros
  for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (mine) load_bf16x8(table + int64_t(local) * hidden + 8 * c, v);
    store_bf16x8(dst + 8 * c, v);
  }
}

// v (8 values) = the sum of partials[s * stride + at + k] over s < splits in split order, rounded to bf16 as a
// projection's output: the ending of linear_wgmma_cuda's cluster sum, which starts from +0.0f, or with one split
// its plain store (from -0.0f, which adds nothing to any value, -0.0 included). Every load is issued first.
__device__ inline void partial_sum_x8(const float* partials, int splits, int64_t stride, int64_t at, float (&v)[8]) {
  constexpr int kMost = kWgmmaMaxSplits;  // the most splits v6 leaves
  float4 p[kMost][2];
#pragma unroll
  for (int s = 0; s < kMost; s++)
    if (s < splits) {
      p[s][0] = __ldcg(reinterpret_cast<const float4*>(partials + s * stride + at));
      p[s][1] = __ldcg(reinterpret_cast<const float4*>(partials + s * stride + at + 4));
    }
  const float start = splits == 1 ? -0.0f : 0.0f;
#pragma unroll
  for (int k = 0; k < 8; k++) v[k] = start;
#pragma unroll
  for (int s = 0; s < kMost; s++)
    if (s < splits) {
      v[0] += p[s][0].x, v[1] += p[s][0].y, v[2] += p[s][0].z, v[3] += p[s][0].w;
      v[4] += p[s][1].x, v[5] += p[s][1].y, v[6] += p[s][1].z, v[7] += p[s][1].w;
    }
#pragma unroll
  for (int k = 0; k < 8; k++) v[k] = __bfloat162float(__float2bfloat16(v[k]));
}

// out (n, hidden) bf16 = x / rms(x) * w, x (n, hidden) bf16, weight (hidden,) bf16, one row per block of
// kRowThreads (hidden % 8 == 0, hidden <= 8 * CHUNKS * kRowThreads); with RESIDUAL (residual (n, hidden) bf16), x += residual first and the (rounded) sum is
// written back to residual. CHUNKS: 16-byte chunks a thread holds, at least hidden / (8 * kRowThreads) (1 for
// hidden 1,024). A compile-time count, so that the registers are those of the row at hand: sized for the
// largest row (8 chunks) the kernel took 115 registers, 4 blocks an SM, and a prefill's 16,000-row calls
// ran at two thirds of their bandwidth (04_model_runner/NOTES.md section 13). PARTIALS (with RESIDUAL): x is
// not read, its values are the sum of `splits` fp32 partials (splits, n, hidden) in split order, rounded to
// bf16 (add_rmsnorm_partials_cuda); a kernel of its own, since its loads take registers the others must not.
template <bool RESIDUAL, int CHUNKS, bool PARTIALS = false>
__global__ void rmsnorm_kernel(bf16* out, bf16* residual, const bf16* x, const bf16* weight, int hidden, float eps,
                               const float* partials, int splits) {
  // The next kernel may start at once, before this one's wait: it is a projection, which reads nothing but
  // its weights before its own wait, so its weights come in while the projection before this norm ends
  // (cuda_utils.h, "a norm lets the next kernel in first"; 04_model_runner/NOTES.md, section 4).
  allow_next_kernel();
  // Launched overlapped: the weight is no kernel's output, so it is on its way before the wait (cuda_utils.h)
  // and no longer a round trip after the row's sum.
  Bf16x8 w_raw[CHUNKS];
#pragma unroll
  for (int i = 0; i < CHUNKS; i++) {
    int c = threadIdx.x + i * kRowThreads;
    if (c >= hidden / 8) break;
    w_raw[i] = *reinterpret_cast<const Bf16x8*>(weight + 8 * c);
  }
  wait_for_previous_kernel();
  const int64_t base = int64_t(blockIdx.x) * hidden;
  float v[CHUNKS][8];
  float sum_sq = 0;
#pragma unroll
  for (int i = 0; i < CHUNKS; i++) {
    int c = threadIdx.x + i * kRowThreads;
    if (c >= hidden / 8) break;
    if constexpr (PARTIALS) {
      partial_sum_x8(partials, splits, int64_t(gridDim.x) * hidden, base + 8 * c, v[i]);
    } else {
      load_bf16x8(x + base + 8 * c, v[i]);
    }
    if (RESIDUAL) {
      float r[8];
      load_bf16x8(residual + base + 8 * c, r);
#pragma unroll
      for (int k = 0; k < 8; k++) v[i][k] += r[k];
      store_bf16x8(residual + base + 8 * c, v[i]);
    }
#pragma unroll
    for (int k = 0; k < 8; k++) sum_sq += v[i][k] * v[i][k];
  }
  const float inv_rms = rsqrtf(block_sum<kRowThreads / 32>(sum_sq) / hidden + eps);
#pragma unroll
  for (int i = 0; i < CHUNKS; i++) {
    int c = threadIdx.x + i * kRowThreads;
    if (c >= hidden / 8) break;
    float w[8];
    unpack_bf16x8(w_raw[i], w);
#pragma unroll
    for (int k = 0; k < 8; k++) v[i][k] = v[i][k] * inv_rms * w[k];
    store_bf16x8(out + base + 8 * c, v[i]);
  }
}

// qkv (n, row_stride) in place: one warp per (token, head) of q and k (n * (num_heads + num_kv_heads)
// warps): RMSNorm over head_dim, then RoPE. v is untouched.
template <int HEAD_DIM>
__global__ void qk_norm_rope_kernel(bf16* qkv, int64_t row_stride, const bf16* q_norm, const bf16* k_norm,
                                    const int32_t* positions, const float* cos_table, const float* sin_table,
                                    int num_tokens, int num_heads, int num_kv_heads, float eps) {
  constexpr int HALF = HEAD_DIM / 2;
  const int warp_global = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int heads = num_heads + num_kv_heads;
  if (warp_global >= num_tokens * heads) return;
  const int token = warp_global / heads, head = warp_global % heads;
  bf16* x = qkv + int64_t(token) * row_stride + int64_t(head) * HEAD_DIM;
  float x1[HEAD_DIM / 64], x2[HEAD_DIM / 64];
  load_head<HEAD_DIM>(x, x1, x2, lane);
  norm_rope_head<HEAD_DIM>(x1, x2, head < num_heads ? q_norm : k_norm, cos_table + int64_t(positions[token]) * HALF,
                           sin_table + int64_t(positions[token]) * HALF, lane, eps);
  store_head<HEAD_DIM>(x, x1, x2, lane);
}

// qk_norm_rope_kernel, then 05_attention's store_kvcache_kernel, in one pass: one block per token over all
// three parts of its qkv row, num_heads + 2 * num_kv_heads heads (Qwen3-0.6B: 16 + 8 + 8 = 32), each head
// done by one warp, a warp taking heads warp, warp + warps, ...
//   q head: normed and rotated in place (what attention reads).
//   k head: normed and rotated into its cache slot only. qkv's k stays as the projection wrote it, where
//           qk_norm_rope would have rotated it in place: attention reads every key from the cache, so
//           nobody reads it there, and writing it back cost kv_dim * 2 bytes a token (a ninth of the
//           kernel's traffic; 04_model_runner/NOTES.md section 17).
//   v head: copied to its cache slot, bit for bit.
// slot_mapping[token] = -1 (a padding row of a CUDA graph batch) writes no slot.
//   qkv (n, row_stride) bf16, 16-byte aligned rows; k_cache, v_cache (num_slots, num_kv_heads * HEAD_DIM) bf16.
// What the fusion saves: store_kvcache_kernel's launch, and its read of k and v back from qkv.
//
// The row is first copied whole into shared memory (cp.async: no register holds it on the way), then each
// warp norms its heads from there with the helpers every other path uses (05_attention/qk_norm_rope.cuh), so
// the bits are those of a warp reading its head from qkv. Why the copy: a warp that loads its own head into
// registers has 256 bytes in flight, and a prefill's calls (thousands of rows, 04_model_runner/NOTES.md
// section 13) ran at half their bandwidth with 64 such warps an SM; a block of 4 warps here asks for its
// 8 KB row at once, and 16 such blocks fit an SM.
template <int HEAD_DIM>
__global__ void qk_norm_rope_store_kernel(bf16* qkv, int64_t row_stride, const bf16* q_norm, const bf16* k_norm,
                                          const int32_t* positions, const float* cos_table, const float* sin_table,
                                          bf16* k_cache, bf16* v_cache, const int32_t* slot_mapping, int num_heads,
                                          int num_kv_heads, float eps) {
  extern __shared__ uint4 staged_row[];  // (num_heads + 2 * num_kv_heads) * HEAD_DIM bf16: this token's row
  constexpr int HALF = HEAD_DIM / 2, PER_LANE = HALF / 32;
  const int token = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int heads = num_heads + 2 * num_kv_heads;
  bf16* row = qkv + int64_t(token) * row_stride;
  const int64_t kv_dim = int64_t(num_kv_heads) * HEAD_DIM;
  // Launched overlapped: the weights and the step's inputs (slot, position) are not written by the kernel
  // just before this one (uploaded before the step, or in a graph pulled by its first kernel, which has
  // completed by then: cuda_utils.h), so they and the factors of the norm and rotation are loaded before
  // the wait; qkv after it.
  const int32_t slot = __ldcg(slot_mapping + token);
  const int64_t position = __ldcg(positions + token);
  const float *cos_row = cos_table + position * HALF, *sin_row = sin_table + position * HALF;
  // q's factors and k's: the same rotation, each head kind's own norm weight.
  const NormRopeFactors<HEAD_DIM> q_factors = load_norm_rope_factors<HEAD_DIM>(q_norm, cos_row, sin_row, lane);
  const NormRopeFactors<HEAD_DIM> k_factors = load_norm_rope_factors<HEAD_DIM>(k_norm, cos_row, sin_row, lane);
  wait_for_previous_kernel();
  allow_next_kernel();

  const int chunks = heads * HEAD_DIM / 8;  // 16-byte pieces of the row
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) cp_async_16(smem_address(staged_row + c), row + 8 * c, true);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // every thread's copies have landed: a warp's heads came in through all the block's threads
  const bf16* staged = reinterpret_cast<const bf16*>(staged_row);

  for (int head = warp; head < heads; head += warps) {
    const bf16* x = staged + head * HEAD_DIM;
    const int kv_head = head - num_heads;  // k heads: [0, num_kv_heads); v heads: [num_kv_heads, 2 num_kv_heads)
    if (kv_head >= num_kv_heads) {         // a v head: a copy
      if (slot >= 0) copy_head<HEAD_DIM>(v_cache + slot * kv_dim + int64_t(kv_head - num_kv_heads) * HEAD_DIM, x, lane);
      continue;
    }
    if (kv_head >= 0 && slot < 0) continue;  // a padding row's k goes nowhere
    float x1[PER_LANE], x2[PER_LANE];
    load_head<HEAD_DIM>(x, x1, x2, lane);
    if (kv_head < 0) {  // a q head: back into qkv
      norm_rope_head<HEAD_DIM>(x1, x2, q_factors, eps);
      store_head<HEAD_DIM>(row + head * HEAD_DIM, x1, x2, lane);
    } else {            // a k head: into the cache only
      norm_rope_head<HEAD_DIM>(x1, x2, k_factors, eps);
      store_head<HEAD_DIM>(k_cache + slot * kv_dim + int64_t(kv_head) * HEAD_DIM, x1, x2, lane);
    }
  }
}

// out (n, inter) bf16 = silu(gate) * up, gate_up (n, 2 inter) bf16 = [gate | up] a row; one thread per 8
// outputs (inter % 8 == 0; Qwen3-0.6B's 3,072: 384 threads a row).
__global__ void silu_and_mul_kernel(bf16* out, const bf16* gate_up, int n, int inter) {
  wait_for_previous_kernel();  // launched overlapped: nothing the previous kernel writes is read before this
  allow_next_kernel();
  const int64_t chunks_per_row = inter / 8;
  const int64_t chunk = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= n * chunks_per_row) return;
  const int64_t row = chunk / chunks_per_row, c = chunk % chunks_per_row;
  float g[8], u[8];
  load_bf16x8(gate_up + row * 2 * inter + 8 * c, g);
  load_bf16x8(gate_up + row * 2 * inter + inter + 8 * c, u);
#pragma unroll
  for (int k = 0; k < 8; k++) g[k] = silu_times(g[k], u[k]);
  store_bf16x8(out + row * inter + 8 * c, g);
}

// ids (m,) i32; tokens (the step before's rows,) i32; rows (m,) i32, -1: ids[i] kept. take_sampled_tokens_cpu's
// loop, a thread a row. In a decode step's graph it runs after the pull of the
// step's inputs (pull_ranges_kernel, the graph's first kernel), so after the step before has ended (stream
// order); the embedding after it waits for it (launched overlapped).
__global__ void take_sampled_tokens_kernel(int32_t* ids, const int32_t* tokens, const int32_t* rows, int m) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < m && rows[i] >= 0) ids[i] = tokens[rows[i]];
}

// dst (device) and host (pinned) are byte images of one layout, copied at the ranges' offsets; counter (1,)
// i64 device, host_flag (1,) i64 pinned: the pulls so far. One block: every thread loads up to kPullWords
// words of the ranges (all its loads issued before its first store: each is a PCIe round trip, a
// microsecond or two, and a block of 1,024 threads then reads 32 KB in about one), then stores them; until
// the ranges are done.
constexpr int kPullThreads = 1024, kPullWords = 8;
__global__ void __launch_bounds__(kPullThreads) pull_ranges_kernel(uint32_t* dst, const uint32_t* host,
                                                                   PullRanges ranges, int64_t* counter,
                                                                   int64_t* host_flag) {
  int64_t total = 0;  // words in all ranges
  for (int r = 0; r < ranges.count; r++) total += ranges.bytes[r] / 4;
  // Word w of the ranges is at this word offset of host and dst.
  auto word_offset = [&](int64_t w) {
    int r = 0;
    while (w >= ranges.bytes[r] / 4) w -= ranges.bytes[r++] / 4;
    return ranges.offsets[r] / 4 + w;
  };
  for (int64_t first = 0; first < total; first += int64_t(kPullThreads) * kPullWords) {
    uint32_t v[kPullWords];
    int64_t at[kPullWords];
#pragma unroll
    for (int k = 0; k < kPullWords; k++) {
      const int64_t w = first + threadIdx.x + int64_t(k) * kPullThreads;
      at[k] = w < total ? word_offset(w) : -1;
      if (at[k] >= 0) v[k] = host[at[k]];
    }
#pragma unroll
    for (int k = 0; k < kPullWords; k++)
      if (at[k] >= 0) dst[at[k]] = v[k];
  }
  __syncthreads();  // every thread's loads of host have returned: the host may write it again
  if (threadIdx.x == 0) {
    const int64_t pulls = *counter + 1;
    *counter = pulls;
    *reinterpret_cast<volatile int64_t*>(host_flag) = pulls;
  }
}

// host[*slot * stride + i] = src[i] for i < n: src (n,) i32 device, slot (1,) i32 device (0 or 1), host
// pinned, (2, stride) i32. One block, launched the ordinary way: after every kernel before it has completed.
__global__ void push_tokens_kernel(int32_t* host, int64_t stride, const int32_t* src, const int32_t* slot, int n) {
  int32_t* row = host + int64_t(*slot) * stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = src[i];
}

// out (m, cols) bf16 = x[rows[b]] for b < m: x (?, cols) bf16, rows (m,) i32; one block an output row, 16-byte
// copies (cols % 8 == 0).
__global__ void gather_rows_kernel(bf16* out, const bf16* x, const int32_t* rows, int cols) {
  const bf16* src = x + int64_t(rows[blockIdx.x]) * cols;
  bf16* dst = out + int64_t(blockIdx.x) * cols;
  for (int c = threadIdx.x; c < cols / 8; c += blockDim.x)
    *reinterpret_cast<Bf16x8*>(dst + 8 * c) = *reinterpret_cast<const Bf16x8*>(src + 8 * c);
}

}  // namespace

void embedding_cuda(bf16* out, const bf16* table, const int32_t* ids, int n, int hidden, int vocab_start,
                    int vocab_size, cudaStream_t stream) {
  assert(hidden % 8 == 0);
  if (n == 0) return;
  launch_overlapped(embedding_kernel, n, kRowThreads, 0, stream, out, table, ids, hidden, vocab_start, vocab_size);
  CUDA_CHECK_LAUNCH();
}

// A prefill's rows: rmsnorm_kernel with the fewest chunks a thread (1, 2, 4 or 8) that hold a row of `hidden`,
// so 16 blocks an SM at hidden 1,024. A decode step's rows: the kernel sized for the largest row, whose 115
// registers allow 4 blocks an SM. Measured over `bench --random qwen3-0.6b` on the H200 (04_model_runner/NOTES.md
// section 13): the prefill's norms 24.2 -> 16.9 ms sized to the row, but the decode's 87.6 -> 103.4 ms, the step at
// 256 rows 7.99 -> 8.10 ms. Tested after: the row-sized kernel held to 4 blocks an SM (by shared memory it
// does not use) ran as the 115-register one, so what costs is blocks an SM, not registers (same section).
// Why more blocks an SM hurt was not isolated; a guess: in a step the norm's blocks become resident while the
// projection before it still runs (launched overlapped), and with room for 16 an SM they crowd onto few SMs.
template <bool RESIDUAL, bool PARTIALS = false>
void launch_rmsnorm(bf16* out, bf16* residual, const bf16* x, const bf16* weight, int n, int hidden, float eps,
                    cudaStream_t stream, const float* partials = nullptr, int splits = 0) {
  assert(hidden % 8 == 0 && hidden <= 8 * kMaxChunksPerThread * kRowThreads);
  if (n == 0) return;
  // PARTIALS: sized to the row at any n (sized for the largest row, its loads of up to 8 partials a chunk
  // would take 188 registers a thread).
  const int chunks = n >= kPrefillRows || PARTIALS ? (hidden / 8 + kRowThreads - 1) / kRowThreads : kMaxChunksPerThread;
  auto launch = [&](auto kernel) {
    launch_overlapped(kernel, n, kRowThreads, 0, stream, out, residual, x, weight, hidden, eps, partials, splits);
  };
  if (chunks <= 1)
    launch(rmsnorm_kernel<RESIDUAL, 1, PARTIALS>);
  else if (chunks <= 2)
    launch(rmsnorm_kernel<RESIDUAL, 2, PARTIALS>);
  else if (chunks <= 4)
    launch(rmsnorm_kernel<RESIDUAL, 4, PARTIALS>);
  else
    launch(rmsnorm_kernel<RESIDUAL, kMaxChunksPerThread, PARTIALS>);
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_cuda(bf16* out, const bf16* x, const bf16* weight, int n, int hidden, float eps, cudaStream_t stream) {
  launch_rmsnorm<false>(out, nullptr, x, weight, n, hidden, eps, stream);
}

void add_rmsnorm_cuda(bf16* out, bf16* residual, const bf16* x, const bf16* weight, int n, int hidden, float eps,
                      cudaStream_t stream) {
  launch_rmsnorm<true>(out, residual, x, weight, n, hidden, eps, stream);
}

void add_rmsnorm_partials_cuda(bf16* out, bf16* residual, const float* partials, int splits, const bf16* weight, int n,
                               int hidden, float eps, cudaStream_t stream) {
  assert(splits >= 1 && splits <= kWgmmaMaxSplits && reinterpret_cast<uintptr_t>(partials) % 16 == 0);
  launch_rmsnorm<true, true>(out, residual, nullptr, weight, n, hidden, eps, stream, partials, splits);
}

void qk_norm_rope_cuda(bf16* qkv, int64_t row_stride, const bf16* q_norm, const bf16* k_norm,
                       const int32_t* positions, const float* cos_table, const float* sin_table, int n,
                       int num_heads, int num_kv_heads, int head_dim, float eps, cudaStream_t stream) {
  if (n == 0) return;
  const int warps = n * (num_heads + num_kv_heads), warps_per_block = 4;
  const int blocks = (warps + warps_per_block - 1) / warps_per_block;
  switch (head_dim) {
    case 64:
      qk_norm_rope_kernel<64><<<blocks, 32 * warps_per_block, 0, stream>>>(
          qkv, row_stride, q_norm, k_norm, positions, cos_table, sin_table, n, num_heads, num_kv_heads, eps);
      break;
    case 128:
      qk_norm_rope_kernel<128><<<blocks, 32 * warps_per_block, 0, stream>>>(
          qkv, row_stride, q_norm, k_norm, positions, cos_table, sin_table, n, num_heads, num_kv_heads, eps);
      break;
    case 256:
      qk_norm_rope_kernel<256><<<blocks, 32 * warps_per_block, 0, stream>>>(
          qkv, row_stride, q_norm, k_norm, positions, cos_table, sin_table, n, num_heads, num_kv_heads, eps);
      break;
    default: fail("head_dim ", head_dim, " is not supported by the CUDA kernels (64, 128, 256)");
  }
  CUDA_CHECK_LAUNCH();
}

void qk_norm_rope_store_cuda(bf16* qkv, int64_t row_stride, const bf16* q_norm, const bf16* k_norm,
                             const int32_t* positions, const float* cos_table, const float* sin_table,
                             bf16* k_cache, bf16* v_cache, const int32_t* slot_mapping, int n, int num_heads,
                             int num_kv_heads, int head_dim, float eps, cudaStream_t stream) {
  if (n == 0) return;
  if (reinterpret_cast<uintptr_t>(qkv) % 16 != 0 || row_stride % 8 != 0)
    fail("internal: qk_norm_rope_store_cuda needs 16-byte aligned qkv rows (row stride ", row_stride, ")");
  const int heads = num_heads + 2 * num_kv_heads;
  // A prefill's thousands of rows: blocks of 4 warps, 16 of them an SM, each with its row in flight. A decode
  // batch's few: a warp per head up to 32 warps (a block's most), so that no warp norms several heads one after
  // another while SMs idle (above 32 heads, Qwen3-8B's 48, some warps take two).
  const int warps = n >= kPrefillRows ? 4 : std::min(heads, 32);
  const size_t smem = size_t(heads) * head_dim * sizeof(bf16);
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)  // above the default limit a kernel must ask for more (one row of a very wide model)
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_overlapped(kernel, unsigned(n), 32 * warps, smem, stream, qkv, row_stride, q_norm, k_norm, positions,
                      cos_table, sin_table, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads, eps);
  };
  switch (head_dim) {
    case 64: launch(qk_norm_rope_store_kernel<64>); break;
    case 128: launch(qk_norm_rope_store_kernel<128>); break;
    case 256: launch(qk_norm_rope_store_kernel<256>); break;
    default: fail("head_dim ", head_dim, " is not supported by the CUDA kernels (64, 128, 256)");
  }
  CUDA_CHECK_LAUNCH();
}

void silu_and_mul_cuda(bf16* out, const bf16* gate_up, int n, int inter, cudaStream_t stream) {
  assert(inter % 8 == 0);
  const int64_t chunks = int64_t(n) * inter / 8;
  if (chunks == 0) return;
  launch_overlapped(silu_and_mul_kernel, unsigned((chunks + 255) / 256), 256, 0, stream, out, gate_up, n, inter);
  CUDA_CHECK_LAUNCH();
}

void take_sampled_tokens_cuda(int32_t* ids, const int32_t* tokens, const int32_t* rows, int m, cudaStream_t stream) {
  if (m == 0) return;
  take_sampled_tokens_kernel<<<(m + 255) / 256, 256, 0, stream>>>(ids, tokens, rows, m);
  CUDA_CHECK_LAUNCH();
}

void pull_ranges_cuda(void* dst, const void* host, const PullRanges& ranges, int64_t* counter,
                      int64_t* host_flag, cudaStream_t stream) {
  assert(ranges.count >= 1 && ranges.count <= kMaxPullRanges);
  for (int r = 0; r < ranges.count; r++) assert(ranges.offsets[r] % 4 == 0 && ranges.bytes[r] % 4 == 0);
  pull_ranges_kernel<<<1, kPullThreads, 0, stream>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(host),
                                                     ranges, counter, host_flag);
  CUDA_CHECK_LAUNCH();
}

void push_tokens_cuda(int32_t* host, int64_t stride, const int32_t* src, const int32_t* slot, int n,
                      cudaStream_t stream) {
  if (n == 0) return;
  push_tokens_kernel<<<1, 512, 0, stream>>>(host, stride, src, slot, n);
  CUDA_CHECK_LAUNCH();
}

void gather_rows_cuda(bf16* out, const bf16* x, const int32_t* rows, int m, int cols, cudaStream_t stream) {
  assert(cols % 8 == 0);
  if (m == 0) return;
  gather_rows_kernel<<<m, kRowThreads, 0, stream>>>(out, x, rows, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
