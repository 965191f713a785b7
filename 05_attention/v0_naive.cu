// v0_naive.cu: the first kernel to read: attention_cpu.cpp's attend_one_query on the GPU, one warp per
// query row and head, with the online softmax instead of a scores array.
//
// Idea:     one warp per (sequence, query head, query row); its 32 lanes split the head dimension; the
//           keys come one at a time, each through the block table, and the softmax is the online one of
//           FlashAttention (m_i, l_i, O_i; softmax.cuh says what they hold), so no score is stored.
// Adds:     (the first rung) the GPU's parallelism over rows and heads, and the online softmax.
// Launch:   grid (max_seqlen_q, num_heads, num_seqs), 32 threads; decode has one query per sequence.
//           Any head_dim up to 256 and any GQA group: the fallback of every phase for shapes the faster
//           versions are not instantiated for.
// Measured: see NOTES.md.
#include "05_attention/kernels.cuh"
#include "05_attention/softmax.cuh"

namespace nanovllm {
namespace {

constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256 = 32 lanes x 8

// Query row i of sequence seq, head h: out = softmax(q . K^T * scale) . V over keys 0 .. seqlen_k -
// seqlen_q + i (causal, bottom-right aligned). Lane `lane` owns dims d = lane + 32 * c, c = 0, 1, ...
__global__ void attention_v0_naive_kernel(AttentionParams p) {
  const int i = blockIdx.x, h = blockIdx.y, seq = blockIdx.z, lane = threadIdx.x;
  const SeqRange r = seq_range(p, seq);
  if (i >= r.seqlen_q) return;                               // a sequence shorter than the longest
  const int num_keys = r.seqlen_k - r.seqlen_q + i + 1;      // causal: the last query sees every key
  const int kv_head = h / (p.num_heads / p.num_kv_heads);    // GQA: consecutive heads share a KV head
  const int64_t kv_dim = int64_t(p.num_kv_heads) * p.head_dim;  // one token's K (or V) in the cache
  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  const bf16* q = p.q + int64_t(r.q_row0 + i) * p.q_stride + int64_t(h) * p.head_dim;

  float q_reg[kMaxDimsPerLane], O_i[kMaxDimsPerLane];  // this lane's dims of q and of the output
#pragma unroll
  for (int c = 0; c < kMaxDimsPerLane; c++) {
    const int d = lane + 32 * c;
    q_reg[c] = d < p.head_dim ? __bfloat162float(q[d]) : 0.0f;
    O_i[c] = 0.0f;
  }
  float m_i = -INFINITY, l_i = 0.0f;

  for (int j = 0; j < num_keys; j++) {
    const int64_t slot = key_slot(block_table, j, p.block_size);
    const bf16* k = p.k_cache + slot * kv_dim + int64_t(kv_head) * p.head_dim;  // (head_dim)
    const bf16* v = p.v_cache + slot * kv_dim + int64_t(kv_head) * p.head_dim;  // (head_dim)
    // s = q . k * scale: each lane its own dims, then the sum over the warp (every lane receives it).
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; c++) {
      const int d = lane + 32 * c;
      if (d < p.head_dim) s += q_reg[c] * __bfloat162float(k[d]);
    }
    s = warp_sum(s) * p.scale;
    // Online softmax: a new maximum rescales what was summed under the old one (exp(-inf) = 0 at j = 0).
    const float m_new = fmaxf(m_i, s);
    const float alpha = expf(m_i - m_new), p_j = expf(s - m_new);
    l_i = l_i * alpha + p_j;
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; c++) {
      const int d = lane + 32 * c;
      if (d < p.head_dim) O_i[c] = O_i[c] * alpha + p_j * __bfloat162float(v[d]);
    }
    m_i = m_new;
  }

  // out = O_i / l_i. A decode padding row (context 0) has no key: l_i = 0, and it writes zeros.
  const float inv_l = l_i > 0.0f ? 1.0f / l_i : 0.0f;
  bf16* out = p.out + int64_t(r.q_row0 + i) * p.out_stride + int64_t(h) * p.head_dim;
#pragma unroll
  for (int c = 0; c < kMaxDimsPerLane; c++) {
    const int d = lane + 32 * c;
    if (d < p.head_dim) out[d] = __float2bfloat16(O_i[c] * inv_l);
  }
}

}  // namespace

void launch_v0_naive(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(dims.max_seqlen_q), unsigned(p.num_heads), unsigned(dims.num_seqs));
  attention_v0_naive_kernel<<<grid, 32, 0, stream>>>(p);
}

}  // namespace nanovllm
