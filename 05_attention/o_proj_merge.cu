// o_proj_merge.cu: at one decode sequence, the merge of v10's splits done by the projection after attention
// (o_proj), so that neither a combine kernel nor a cluster does it.
//
// Idea:     at one sequence v10 cuts the context into 16 splits (decode_splits: 8 KV heads, 128 blocks) and
//           someone must merge them: v10's combine kernel is one more dependent launch a layer, and v11's
//           cluster merge costs the step as much (measured: launched as clusters the step is 0.04-0.06 ms
//           slower at one sequence, with or without the merge; NOTES.md, "What the splits' merge costs at one
//           to eight sequences"). But o_proj reads all of attention's output anyway, and a block of o_proj
//           that takes the columns of one KV head's query heads (row h of out is o_proj's columns
//           h * head_dim ..) needs the partials of those heads only: it can merge them itself after its wait,
//           as the combine kernel would, then multiply.
// Adds:     over v10 with its combine: no combine kernel; o_proj split by KV head, each block writing its KV
//           head's share of the projection, fp32, which the norm after it adds up (chapter 04's
//           add_rmsnorm_partials_cuda, the same sum chapter 06's linear version 8 leaves to the norm).
// Launch:   grid (num_kv_heads, ceil(hidden / 64)) of 8 warps, one block an SM where the grid fits the GPU.
//           Block (g, j): W's rows j*64 .. j*64+63 (warp w its 8 rows j*64 + 8w ..), W's columns g*C ..
//           g*C+C-1, C = G * head_dim (G query heads a KV head; Qwen3-0.6B: 2 x 128 = 256, one 16-byte chunk of
//           a row a lane). The next kernel (the norm) is let in at the block's start.
// Measured: the step at one sequence 0.794-0.796 ms against v11's 0.814-0.816 (H100; NOTES.md, "The merge in
//           o_proj"); one block an SM and the norm let in at the start, with attention's blocks one an SM and
//           gate_up letting down_proj in: 0.743-0.744 ms against 0.802-0.805 on one H100, as built 0.748-0.759
//           against 0.772-0.776 on another (04_model_runner/NOTES.md, section 9, "One block an SM, and the MLP's
//           weights sooner").
#include "05_attention/kernels.cuh"

namespace nanovllm {
namespace {

constexpr int kMergeWarps = 8;
constexpr int kRowsPerWarp = 8;                                  // W rows (outputs) a warp
constexpr int kOutputsPerBlock = kMergeWarps * kRowsPerWarp;     // 64
constexpr int kColumnsPerChunk = 32 * 8;                         // a warp's 16-byte loads cover 256 columns
constexpr int kPartsAtOnce = kMaxClusterSplits;                  // partitions whose O loads are issued together
constexpr int kMaxHeadsPerBlock = kOProjMergeMaxColumns / 64;    // G: the columns over the smallest head_dim

// Block (kv_head, tile) of the grid above, for sequence 0 of p (p.splits partitions, their partials written).
// out (1, num_heads * HEAD_DIM) bf16: the tile-0 blocks write their KV head's part of it. partials (num_kv_heads,
// hidden) fp32: row kv_head gets, for each of the block's outputs o, sum over the block's columns c of
// bf16(merged c) * W[o][c]. CHUNKS: 16-byte chunks of a W row a lane holds (C <= 256 * CHUNKS).
template <int HEAD_DIM, int CHUNKS>
__global__ void __launch_bounds__(kMergeWarps * 32)
    o_proj_merge_kernel(AttentionParams p, float* partials, const bf16* W, int hidden) {
  // The norm after this kernel reads nothing but its weight before its wait, so it may start now, and let
  // gate_up in, whose 12.6 MB of weights then stream while attention and this merge run, not after this
  // kernel's wait (cuda_utils.h; 04_model_runner/NOTES.md, section 9, "One block an SM, and the MLP's weights
  // sooner").
  allow_next_kernel();
  const int kv_head = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int G = p.num_heads / p.num_kv_heads, columns = G * HEAD_DIM;  // this block's columns of W: C
  const int row_chunks = p.num_heads * HEAD_DIM / 8;                   // a W row in 16-byte chunks
  const int o0 = blockIdx.y * kOutputsPerBlock + warp * kRowsPerWarp;  // this warp's first output
  const uint4* w4 = reinterpret_cast<const uint4*>(W) + kv_head * columns / 8;  // (hidden, row_chunks), at column g*C

  // Launched overlapped: W is no kernel's output, and context_lens is the step's input (cuda_utils.h), so all
  // of the block's weights (64 rows x C columns, 32 KB for Qwen3-0.6B) are on their way before the wait.
  uint4 w[kRowsPerWarp][CHUNKS];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
    for (int u = 0; u < CHUNKS; u++) {
      const int chunk = u * 32 + lane;
      w[r][u] = o0 + r < hidden && chunk * 8 < columns ? __ldcs(w4 + int64_t(o0 + r) * row_chunks + chunk)
                                                      : make_uint4(0, 0, 0, 0);
    }
  const int context = p.context_lens[0];
  const int partition_size = context == 0 ? 1 : partition_size_for(p, context);
  const int parts = (context + partition_size - 1) / partition_size;  // as the combine counts them
  wait_for_previous_kernel();  // attention's partials are written

  // Attention's output for the block's C columns, merged over the sequence's `parts` partitions with
  // decode_combine_kernel's formula in its order (v2_split_k.cu), so its bits:
  //   out = sum_i exp2(m_i - M) O_i / sum_i exp2(m_i - M) l_i,   M = max_i m_i,
  // rounded to bf16 as the combine stores it; thread t takes column t (and t + 256). A padding row (context 0)
  // has no partition: zeros, as there. All loads through the L2 (__ldcg): the kernel before wrote them.
  // Every partition's m and l of the block's G query heads go through shared memory, one load a thread. Each is
  // used by all of its head's columns; loaded by every thread from the L2 instead (the first version), the same
  // few lines took ~4 us a layer (NOTES.md, "The merge in o_proj").
  __shared__ float m_of[kMaxHeadsPerBlock * kMaxOProjMergeSplits];  // (G, parts): m of head r, partition i
  __shared__ float l_of[kMaxHeadsPerBlock * kMaxOProjMergeSplits];
  for (int idx = threadIdx.x; idx < G * parts; idx += blockDim.x) {
    const int64_t at = int64_t(kv_head * G + idx / parts) * p.max_partitions + idx % parts;  // sequence 0
    m_of[idx] = __ldcg(p.part_m + at), l_of[idx] = __ldcg(p.part_l + at);
  }
  // The first kPartsAtOnce partitions' O of this thread's columns, requested before the barrier.
  float o[CHUNKS][kPartsAtOnce];
  auto load_O = [&](int u, int first) {  // o[u][i] = O of partition first + i, column threadIdx.x + 256 u
    const int c = threadIdx.x + u * kColumnsPerChunk;
    const int64_t row = int64_t(kv_head * G + c / HEAD_DIM) * p.max_partitions;  // (head, partition 0)
#pragma unroll
    for (int i = 0; i < kPartsAtOnce; i++)
      if (c < columns && first + i < parts) o[u][i] = __ldcg(p.part_O + (row + first + i) * HEAD_DIM + c % HEAD_DIM);
  };
#pragma unroll
  for (int u = 0; u < CHUNKS; u++) load_O(u, 0);
  __shared__ __align__(16) bf16 x[CHUNKS * kColumnsPerChunk];  // (C): out's columns g*C .. g*C+C-1
  __syncthreads();  // m_of and l_of are complete before any thread merges
#pragma unroll
  for (int u = 0; u < CHUNKS; u++) {
    const int c = threadIdx.x + u * kColumnsPerChunk;
    if (c >= columns) break;
    const float* m = m_of + c / HEAD_DIM * parts;
    const float* l = l_of + c / HEAD_DIM * parts;
    float M = -INFINITY;
    for (int i = 0; i < parts; i++) M = fmaxf(M, m[i]);
    float L = 0.0f, O = 0.0f;
    for (int first = 0; first < parts; first += kPartsAtOnce) {
      if (first > 0) load_O(u, first);  // more partitions than kPartsAtOnce: a round trip each kPartsAtOnce
#pragma unroll
      for (int i = 0; i < kPartsAtOnce; i++)
        if (first + i < parts) {
          const float w = exp2f(m[first + i] - M);
          L += l[first + i] * w;
          O += o[u][i] * w;
        }
    }
    x[c] = __float2bfloat16(parts == 0 ? 0.0f : O / L);
    if (blockIdx.y == 0) p.out[kv_head * columns + c] = x[c];
  }
  __syncthreads();  // every column of x is merged before any warp multiplies

  // Each warp's 8 outputs: lane `lane` holds chunks lane (and lane + 32) of each row; then a warp sum.
  float acc[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) acc[r] = 0.0f;
#pragma unroll
  for (int u = 0; u < CHUNKS; u++) {
    const int chunk = u * 32 + lane;
    if (chunk * 8 >= columns) break;
    float xf[8];
    bf16x8_to_float(*reinterpret_cast<const uint4*>(x + chunk * 8), xf);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      float wf[8];
      bf16x8_to_float(w[r][u], wf);
#pragma unroll
      for (int k = 0; k < 8; k++) acc[r] += xf[k] * wf[k];
    }
  }
  float* row = partials + int64_t(kv_head) * hidden;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0 && o0 + r < hidden) row[o0 + r] = sum;
  }
}

// Grid (num_kv_heads, ceil(hidden / 64)) of kMergeWarps warps; a grid no larger than the GPU's SM count
// (Qwen3-0.6B: 8 x 16 = 128) is held to one block an SM by shared memory it never uses (cuda_utils.h,
// one_block_per_sm_launch_bytes). Measured (H100, batch 1): packed two to an SM on about half the SMs, the
// step took ~0.02 ms longer (04_model_runner/NOTES.md, section 9, "One block an SM, and the MLP's weights
// sooner").
template <int HEAD_DIM, int CHUNKS>
void launch_with_chunks(const AttentionParams& p, float* partials, const bf16* W, int hidden, cudaStream_t stream) {
  const dim3 grid(unsigned(p.num_kv_heads), unsigned((hidden + kOutputsPerBlock - 1) / kOutputsPerBlock));
  const auto kernel = o_proj_merge_kernel<HEAD_DIM, CHUNKS>;
  static PerDeviceOnce once;
  allow_one_block_per_sm(once, reinterpret_cast<const void*>(kernel), 0);
  launch_overlapped(kernel, grid, kMergeWarps * 32, one_block_per_sm_launch_bytes(int(grid.x * grid.y), 0), stream, p,
                    partials, W, hidden);
}

template <int HEAD_DIM>
void launch_for_head_dim(const AttentionParams& p, float* partials, const bf16* W, int hidden, cudaStream_t stream) {
  const int columns = p.num_heads / p.num_kv_heads * HEAD_DIM;
  if (columns <= kColumnsPerChunk) launch_with_chunks<HEAD_DIM, 1>(p, partials, W, hidden, stream);
  else launch_with_chunks<HEAD_DIM, 2>(p, partials, W, hidden, stream);
}

}  // namespace

void launch_o_proj_merge(const AttentionParams& p, float* partials, const bf16* W, int hidden, cudaStream_t stream) {
  static_assert(2 * kColumnsPerChunk == kOProjMergeMaxColumns, "CHUNKS 1 and 2 cover every width allowed");
  if (p.head_dim == 64) launch_for_head_dim<64>(p, partials, W, hidden, stream);
  else launch_for_head_dim<128>(p, partials, W, hidden, stream);
}

}  // namespace nanovllm
