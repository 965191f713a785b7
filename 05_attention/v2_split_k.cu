// v2_split_k.cu: split-K decode (flash-decoding): the context is cut into partitions attended by separate
// thread blocks, and a second kernel merges their partial results.
//
// Idea:     v1 gives each (sequence, KV head) one block: at batch 1 that is 8 blocks on 132 SMs. Cutting
//           each context into partitions of partition_size keys (decode_partition_size, attention.cu:
//           64 keys for a handful of sequences up to 512 for big batches) makes enough blocks to fill
//           the GPU. Each block writes its rows' unnormalised (m, l, O) (store_partials); the softmax of
//           the whole context is their merge (softmax.cuh: online_softmax_merge), done by
//           decode_combine_kernel for each (sequence, query head).
// Adds:     the partition grid dimension and the combine kernel. Decode only: a prefill tile already
//           has enough blocks (prefill runs the prefill default).
// Launch:   grid (max_partitions, num_kv_heads, num_seqs), 128 threads; blocks past a sequence's context
//           return at once (under a CUDA graph, max_partitions is sized for max_model_len). Then the
//           combine: grid (num_heads, num_seqs), head_dim threads.
// Measured: see NOTES.md (the decode default until the tensor-core versions, v9 on).
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
namespace {

// Block (partition, kv_head, seq): the G query heads of KV head kv_head of sequence seq over keys
// partition * partition_size .. (partition + 1) * partition_size - 1 -> their partial (m, l, O).
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) attention_v2_split_k_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;  // this lane: key group, and dims [8c, 8c + 8)
  const int seq = blockIdx.z, kv_head = blockIdx.y, partition = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);  // decode: one query, seqlen_k = context_lens[seq]

  // This block's keys: one partition of the context.
  const int key_begin = partition * p.partition_size;
  const int key_end = min(r.seqlen_k, key_begin + p.partition_size);
  if (key_begin >= key_end) return;  // past this sequence's context (or a padding row, context 0)

  float q[ROWS][8];
  int limit[ROWS];
  load_query_rows<HEAD_DIM, ROWS>(p, r, kv_head, 0, G, c, q, limit);
  RowStates<ROWS> st;
  st.init();

  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  auto page_of = [&](int logical) { return block_table[logical]; };
  for (int warp_base = key_begin + warp * L::GROUPS * kKeysPerGroup; warp_base < key_end;
       warp_base += L::kStepKeys) {
    const int base = warp_base + group * kKeysPerGroup;
    uint4 k_raw[kKeysPerGroup], v_raw[kKeysPerGroup];
    load_kv<HEAD_DIM>(p, page_of, base, key_end, kv_head, c, k_raw, v_raw);
    attend_keys<L::KG, ROWS>(st, q, limit, base, key_end, k_raw, v_raw);
  }

  if (reduce_block<HEAD_DIM, ROWS>(st)) store_partials<HEAD_DIM, ROWS>(p, seq, st, kv_head, partition, c);
}

// Merges the partitions of one (sequence, query head), thread d owning dim d:
//   out = sum_i exp2(m_i - M) O_i / sum_i exp2(m_i - M) l_i,   M = max_i m_i.
// A padding row (context 0) has no partition and writes zeros.
template <int HEAD_DIM>
__global__ void decode_combine_kernel(AttentionParams p) {
  const int seq = blockIdx.y, head = blockIdx.x, d = threadIdx.x;
  wait_for_previous_kernel();  // launched overlapped: nothing the previous kernel writes is read before this
  allow_next_kernel();
  const int context = p.context_lens[seq];
  bf16* out = p.out + int64_t(seq) * p.out_stride + int64_t(head) * HEAD_DIM;
  if (context == 0) {
    out[d] = __float2bfloat16(0.0f);
    return;
  }
  const int partition_size = partition_size_for(p, context);
  const int parts = (context + partition_size - 1) / partition_size;
  const int64_t base = (int64_t(seq) * p.num_heads + head) * p.max_partitions;
  float M = -INFINITY;
  for (int i = 0; i < parts; i++) M = fmaxf(M, p.part_m[base + i]);
  float l = 0.0f, O = 0.0f;
  for (int i = 0; i < parts; i++) {
    const float w = exp2f(p.part_m[base + i] - M);
    l += p.part_l[base + i] * w;
    O += p.part_O[(base + i) * HEAD_DIM + d] * w;
  }
  out[d] = __float2bfloat16(O / l);
}

}  // namespace

void launch_decode_combine(const AttentionParams& p, int num_seqs, cudaStream_t stream) {
  const dim3 grid(unsigned(p.num_heads), unsigned(num_seqs));
  // Overlapped (cuda_utils.h): the combine's blocks start while the partitions' last blocks finish.
  if (p.head_dim == 64) launch_overlapped(decode_combine_kernel<64>, grid, 64, 0, stream, p);
  else launch_overlapped(decode_combine_kernel<128>, grid, 128, 0, stream, p);
}

void launch_v2_split_k(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(p.max_partitions), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, decode_rows(p.num_heads / p.num_kv_heads), [&](auto head_dim, auto rows) {
    attention_v2_split_k_kernel<decltype(head_dim)::value, decltype(rows)::value>
        <<<grid, kWarps * 32, 0, stream>>>(p);
  });
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
