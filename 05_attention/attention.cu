// attention.cu: paged attention on the GPU.
//
// One kernel, paged_attention_kernel, serves prefill and decode. Its unit of work is a set of ROWS
// "rows" that share one KV head: a row is (a query token, one of the G = num_heads / num_kv_heads query
// heads that read this KV head). Decode has one query per sequence, so a block's rows are that query's G
// heads and every key is read once for all of them (GQA-aware). Prefill has many queries per sequence;
// a block takes ROWS consecutive (query, head) rows of one sequence.
//
// Inside a block, 4 warps split the keys; inside a warp, KG = head_dim / 8 lanes read one key row with
// 16-byte loads (lane c holds dims 8c .. 8c+7), so a warp reads 32 / KG keys per instruction, each row
// fully coalesced. Each key group keeps its own running max / sum / output (the online softmax of
// FlashAttention), and the groups and warps are merged at the end.
//
// Decode also splits the context into partitions handled by different blocks (flash-decoding), so that a
// few long sequences still fill the GPU; decode_combine_kernel merges the partitions.
//
// Versions (notes in 05_attention/NOTES.md): v1 is this CUDA-core kernel; the CPU reference is
// attention_cpu.cpp.
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cstdlib>

#include "05_attention/attention.h"

namespace nanovllm {

namespace {

constexpr int kWarps = 4;          // warps per block; they split the keys
constexpr int kKeysPerGroup = 4;   // keys a key group loads per iteration (loads in flight)
// (query, head) rows per prefill block: 8, but 4 for v3, whose double buffer would spill registers.
template <int VERSION>
constexpr int prefill_rows() { return VERSION == 3 ? 4 : 8; }
constexpr int kTableEntries = 256; // block-table entries a v2 block stages in shared memory
constexpr float kLog2e = 1.4426950408889634f;

struct PagedAttentionParams {
  bf16* out;
  int64_t out_stride;
  const bf16* q;
  int64_t q_stride;
  const bf16* k_cache;  // (num_blocks, block_size, num_kv_heads, HEAD_DIM)
  const bf16* v_cache;
  const int32_t* block_tables;  // (num_seqs, block_table_width)
  int block_table_width;
  int num_heads, num_kv_heads, block_size;
  float scale_log2;  // softmax scale * log2(e): scores are kept in base 2 (exp2f is one instruction)
  // Prefill
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  // Decode
  const int32_t* context_lens;
  int partition_size;
  int max_partitions;
  float* part_max;  // (num_seqs, num_heads, max_partitions)
  float* part_sum;  // (num_seqs, num_heads, max_partitions)
  float* part_out;  // (num_seqs, num_heads, max_partitions, HEAD_DIM)
};

// The running state of one key group for each of its rows: max score m (base 2), sum of exp2(s - m),
// and the unnormalised output over this lane's 8 dims.
template <int ROWS>
struct SoftmaxState {
  float m[ROWS], l[ROWS], acc[ROWS][8];
};

// Merges `other` into `s` (both over disjoint key sets): rescale both to the larger max and add.
template <int ROWS>
__device__ void merge_state(SoftmaxState<ROWS>& s, const float* om, const float* ol, const float (*oacc)[8]) {
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    float m = fmaxf(s.m[r], om[r]);
    if (m == -INFINITY) continue;  // neither side saw a key for this row
    float a = exp2f(s.m[r] - m), b = exp2f(om[r] - m);
    s.l[r] = s.l[r] * a + ol[r] * b;
#pragma unroll
    for (int k = 0; k < 8; k++) s.acc[r][k] = s.acc[r][k] * a + oacc[r][k] * b;
    s.m[r] = m;
  }
}

// Converts 8 bf16 values held as raw 16 bytes.
__device__ inline void bf16x8_to_float(const uint4& raw, float out[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}

template <int HEAD_DIM, int ROWS, bool DECODE, int VERSION>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(PagedAttentionParams p) {
  constexpr int KG = HEAD_DIM / 8;      // lanes per key row
  constexpr int GROUPS = 32 / KG;       // key groups per warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / KG, c = lane % KG;  // this lane: key group, and dims [8c, 8c+8)
  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int G = p.num_heads / p.num_kv_heads;

  // Which rows, which keys.
  int num_rows, first_row, seqlen_q, seqlen_k, q_base, key_begin, key_end;
  if (DECODE) {
    seqlen_k = p.context_lens[seq];
    seqlen_q = 1;
    q_base = seq;
    num_rows = G, first_row = 0;
    key_begin = blockIdx.x * p.partition_size;
    key_end = min(seqlen_k, key_begin + p.partition_size);
    if (key_begin >= key_end) return;  // past this sequence's context (or a padding row)
  } else {
    q_base = p.cu_seqlens_q[seq];
    seqlen_q = p.cu_seqlens_q[seq + 1] - q_base;
    seqlen_k = p.cu_seqlens_k[seq + 1] - p.cu_seqlens_k[seq];
    first_row = blockIdx.x * ROWS;
    if (first_row >= seqlen_q * G) return;
    num_rows = min(ROWS, seqlen_q * G - first_row);
    key_begin = 0;
    // Causal, bottom-right: query i sees keys 0 .. seqlen_k - seqlen_q + i; the tile's last query most.
    key_end = seqlen_k - seqlen_q + (first_row + num_rows - 1) / G + 1;
  }

  // This lane's slice of each row's query, pre-scaled, and each row's last visible key.
  float q[ROWS][8];
  int limit[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    const int row = first_row + min(r, num_rows - 1);  // spare rows repeat the last one, unused
    const int qi = row / G, head = kv_head * G + row % G;
    load_bf16x8(p.q + int64_t(q_base + qi) * p.q_stride + int64_t(head) * HEAD_DIM + 8 * c, q[r]);
#pragma unroll
    for (int k = 0; k < 8; k++) q[r][k] *= p.scale_log2;
    limit[r] = r < num_rows ? seqlen_k - seqlen_q + qi : -1;
  }

  SoftmaxState<ROWS> st;
#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    st.m[r] = -INFINITY, st.l[r] = 0;
#pragma unroll
    for (int k = 0; k < 8; k++) st.acc[r][k] = 0;
  }

  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  const int64_t row_elems = int64_t(p.num_kv_heads) * HEAD_DIM;  // one token's K (or V) in the cache
  const int64_t head_offset = int64_t(kv_head) * HEAD_DIM + 8 * c;
  constexpr int kStep = kWarps * GROUPS * kKeysPerGroup;  // keys per block iteration

  // The online-softmax update of every row with kKeysPerGroup keys, given as raw bf16 (this lane's 8
  // dims of each key's K and V). Keys are converted one at a time, so only 8 floats of K or V are live.
  auto process = [&](int base, const uint4 (&k_raw)[kKeysPerGroup], const uint4 (&v_raw)[kKeysPerGroup]) {
    float s[ROWS][kKeysPerGroup];
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; u++) {
      float kf[8];
      bf16x8_to_float(k_raw[u], kf);
#pragma unroll
      for (int r = 0; r < ROWS; r++) {
        float dot = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) dot += q[r][k] * kf[k];
        // Sum over the KG lanes of this key group (xor offsets below KG stay inside the group).
#pragma unroll
        for (int off = KG / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        s[r][u] = (base + u < key_end && base + u <= limit[r]) ? dot : -INFINITY;
      }
    }
    float p_ru[ROWS][kKeysPerGroup];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      float m_new = st.m[r];
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; u++) m_new = fmaxf(m_new, s[r][u]);
      // Rescale what was accumulated under the old maximum (no key visible yet: nothing to do).
      const float correction = m_new == -INFINITY ? 1.0f : exp2f(st.m[r] - m_new);
      st.l[r] *= correction;
#pragma unroll
      for (int k = 0; k < 8; k++) st.acc[r][k] *= correction;
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; u++) {
        p_ru[r][u] = m_new == -INFINITY ? 0.0f : exp2f(s[r][u] - m_new);  // 0 for masked keys
        st.l[r] += p_ru[r][u];
      }
      st.m[r] = m_new;
    }
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; u++) {
      float vf[8];
      bf16x8_to_float(v_raw[u], vf);
#pragma unroll
      for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int k = 0; k < 8; k++) st.acc[r][k] += p_ru[r][u] * vf[k];
    }
  };

  if (VERSION == 1) {
    // v1: load, then compute. The block-table entry is fetched right before each key's K/V, so every
    // iteration waits for two memory round trips, and nothing is in flight while it computes.
    // The loop bound is the warp's base, the same for all its lanes: the shuffles need every lane.
    for (int warp_base = key_begin + warp * GROUPS * kKeysPerGroup; warp_base < key_end; warp_base += kStep) {
      const int base = warp_base + group * kKeysPerGroup;  // this key group's first key
      uint4 kr[kKeysPerGroup], vr[kKeysPerGroup];
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; u++) {
        const int j = base + u;
        if (j < key_end) {
          const int64_t slot = int64_t(block_table[j / p.block_size]) * p.block_size + j % p.block_size;
          kr[u] = *reinterpret_cast<const uint4*>(p.k_cache + slot * row_elems + head_offset);
          vr[u] = *reinterpret_cast<const uint4*>(p.v_cache + slot * row_elems + head_offset);
        } else {  // zeros, not garbage: a masked key's weight is 0, and 0 * NaN would be NaN
          kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
        }
      }
      process(base, kr, vr);
    }
  } else {
    // v2 and v3: the block-table entries of this block's key range are staged in shared memory once,
    // so a key's slot costs no memory round trip.
    __shared__ int32_t sm_table[kTableEntries];
    const int first_block = key_begin / p.block_size;
    const int table_entries = (key_end - 1) / p.block_size - first_block + 1;
    const bool staged = table_entries <= kTableEntries;
    if (staged)
      for (int i = threadIdx.x; i < table_entries; i += blockDim.x) sm_table[i] = block_table[first_block + i];
    __syncthreads();  // the staged table is complete before any warp reads it
    auto load_keys = [&](int base, uint4 (&kr)[kKeysPerGroup], uint4 (&vr)[kKeysPerGroup]) {
#pragma unroll
      for (int u = 0; u < kKeysPerGroup; u++) {
        const int j = base + u;
        if (j < key_end) {
          const int logical = j / p.block_size;
          const int physical = staged ? sm_table[logical - first_block] : block_table[logical];
          const int64_t slot = int64_t(physical) * p.block_size + (j - logical * p.block_size);
          kr[u] = *reinterpret_cast<const uint4*>(p.k_cache + slot * row_elems + head_offset);
          vr[u] = *reinterpret_cast<const uint4*>(p.v_cache + slot * row_elems + head_offset);
        } else {
          kr[u] = vr[u] = make_uint4(0, 0, 0, 0);  // bf16 zeros
        }
      }
    };
    int warp_base = key_begin + warp * GROUPS * kKeysPerGroup;
    if (VERSION == 2) {
      for (; warp_base < key_end; warp_base += kStep) {
        uint4 kr[kKeysPerGroup], vr[kKeysPerGroup];
        load_keys(warp_base + group * kKeysPerGroup, kr, vr);
        process(warp_base + group * kKeysPerGroup, kr, vr);
      }
    } else {
      // v3: the next iteration's K/V are loaded before this one computes, so loads overlap the math
      // (at the price of 16 more registers per key group, hence fewer warps per SM).
      uint4 k_now[kKeysPerGroup], v_now[kKeysPerGroup];
      if (warp_base < key_end) load_keys(warp_base + group * kKeysPerGroup, k_now, v_now);
      for (; warp_base < key_end; warp_base += kStep) {
        uint4 k_next[kKeysPerGroup], v_next[kKeysPerGroup];
        const bool more = warp_base + kStep < key_end;  // uniform across the warp
        if (more) load_keys(warp_base + kStep + group * kKeysPerGroup, k_next, v_next);
        process(warp_base + group * kKeysPerGroup, k_now, v_now);
        if (more) {
#pragma unroll
          for (int u = 0; u < kKeysPerGroup; u++) k_now[u] = k_next[u], v_now[u] = v_next[u];
        }
      }
    }
  }

  // Merge the key groups of this warp: lanes with the same c hold the same dims.
#pragma unroll
  for (int off = KG; off < 32; off <<= 1) {
    float om[ROWS], ol[ROWS], oacc[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      om[r] = __shfl_xor_sync(0xffffffffu, st.m[r], off);
      ol[r] = __shfl_xor_sync(0xffffffffu, st.l[r], off);
#pragma unroll
      for (int k = 0; k < 8; k++) oacc[r][k] = __shfl_xor_sync(0xffffffffu, st.acc[r][k], off);
    }
    merge_state<ROWS>(st, om, ol, oacc);
  }

  // Merge the warps through shared memory; warp 0 finishes.
  __shared__ float sm_m[kWarps][ROWS], sm_l[kWarps][ROWS], sm_acc[kWarps][ROWS][HEAD_DIM];
  if (lane < KG) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
      if (lane == 0) sm_m[warp][r] = st.m[r], sm_l[warp][r] = st.l[r];
#pragma unroll
      for (int k = 0; k < 8; k++) sm_acc[warp][r][8 * c + k] = st.acc[r][k];
    }
  }
  __syncthreads();  // all warps' states are in shared memory
  if (warp != 0) return;
  for (int w = 1; w < kWarps; w++) {
    float oacc[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
      for (int k = 0; k < 8; k++) oacc[r][k] = sm_acc[w][r][8 * c + k];
    merge_state<ROWS>(st, sm_m[w], sm_l[w], oacc);
  }
  if (lane >= KG) return;

#pragma unroll
  for (int r = 0; r < ROWS; r++) {
    if (r >= num_rows) break;
    const int row = first_row + r;
    const int qi = row / G, head = kv_head * G + row % G;
    if (DECODE) {
      // Unnormalised partial result of this partition; decode_combine_kernel finishes.
      const int64_t idx = (int64_t(seq) * p.num_heads + head) * p.max_partitions + blockIdx.x;
      if (c == 0) p.part_max[idx] = st.m[r], p.part_sum[idx] = st.l[r];
#pragma unroll
      for (int k = 0; k < 8; k++) p.part_out[idx * HEAD_DIM + 8 * c + k] = st.acc[r][k];
    } else {
      float o[8];
      const float inv = st.l[r] > 0 ? 1.0f / st.l[r] : 0.0f;
#pragma unroll
      for (int k = 0; k < 8; k++) o[k] = st.acc[r][k] * inv;
      store_bf16x8(p.out + int64_t(q_base + qi) * p.out_stride + int64_t(head) * HEAD_DIM + 8 * c, o);
    }
  }
}

// Merges the partitions of one (sequence, head): out = sum_p exp2(m_p - M) acc_p / sum_p exp2(m_p - M) l_p.
template <int HEAD_DIM>
__global__ void decode_combine_kernel(PagedAttentionParams p) {
  const int seq = blockIdx.y, head = blockIdx.x, d = threadIdx.x;
  const int context = p.context_lens[seq];
  bf16* out = p.out + int64_t(seq) * p.out_stride + int64_t(head) * HEAD_DIM;
  if (context == 0) {  // padding row of a CUDA graph batch
    out[d] = __float2bfloat16(0.0f);
    return;
  }
  const int parts = (context + p.partition_size - 1) / p.partition_size;
  const int64_t base = (int64_t(seq) * p.num_heads + head) * p.max_partitions;
  float M = -INFINITY;
  for (int i = 0; i < parts; i++) M = fmaxf(M, p.part_max[base + i]);
  float L = 0, acc = 0;
  for (int i = 0; i < parts; i++) {
    const float w = exp2f(p.part_max[base + i] - M);
    L += p.part_sum[base + i] * w;
    acc += p.part_out[(base + i) * HEAD_DIM + d] * w;
  }
  out[d] = __float2bfloat16(acc / L);
}

__global__ void store_kvcache_kernel(bf16* k_cache, bf16* v_cache, const bf16* k, const bf16* v, int64_t row_stride,
                                     const int32_t* slot_mapping, int kv_dim) {
  const int token = blockIdx.x;
  const int32_t slot = slot_mapping[token];
  if (slot < 0) return;  // padding row
  for (int c = threadIdx.x; c < kv_dim / 8; c += blockDim.x) {
    *reinterpret_cast<Bf16x8*>(k_cache + int64_t(slot) * kv_dim + 8 * c) =
        *reinterpret_cast<const Bf16x8*>(k + token * row_stride + 8 * c);
    *reinterpret_cast<Bf16x8*>(v_cache + int64_t(slot) * kv_dim + 8 * c) =
        *reinterpret_cast<const Bf16x8*>(v + token * row_stride + 8 * c);
  }
}

PagedAttentionParams make_params(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                                 const bf16* v_cache, const int32_t* block_tables, int width,
                                 const AttentionShape& s) {
  PagedAttentionParams p{};
  p.out = out, p.out_stride = out_stride, p.q = q, p.q_stride = q_stride;
  p.k_cache = k_cache, p.v_cache = v_cache, p.block_tables = block_tables, p.block_table_width = width;
  p.num_heads = s.num_heads, p.num_kv_heads = s.num_kv_heads, p.block_size = s.block_size;
  p.scale_log2 = s.scale * kLog2e;
  return p;
}

template <int HEAD_DIM, bool DECODE, int VERSION>
void launch_rows(const PagedAttentionParams& p, dim3 grid, int rows, cudaStream_t stream) {
  const dim3 block(kWarps * 32);
  switch (rows) {
    case 1: paged_attention_kernel<HEAD_DIM, 1, DECODE, VERSION><<<grid, block, 0, stream>>>(p); break;
    case 2: paged_attention_kernel<HEAD_DIM, 2, DECODE, VERSION><<<grid, block, 0, stream>>>(p); break;
    case 4: paged_attention_kernel<HEAD_DIM, 4, DECODE, VERSION><<<grid, block, 0, stream>>>(p); break;
    case 8: paged_attention_kernel<HEAD_DIM, 8, DECODE, VERSION><<<grid, block, 0, stream>>>(p); break;
    default: fail("internal: unsupported rows ", rows);
  }
}

template <bool DECODE, int VERSION>
void launch_version(const PagedAttentionParams& p, int head_dim, dim3 grid, int rows, cudaStream_t stream) {
  switch (head_dim) {
    case 64: launch_rows<64, DECODE, VERSION>(p, grid, rows, stream); break;
    case 128: launch_rows<128, DECODE, VERSION>(p, grid, rows, stream); break;
    default: fail("head_dim ", head_dim, " is not supported by the CUDA attention kernels (64, 128)");
  }
}

template <bool DECODE>
void launch(const PagedAttentionParams& p, int head_dim, dim3 grid, int rows, cudaStream_t stream) {
  switch (attention_kernel_version) {
    case 1: launch_version<DECODE, 1>(p, head_dim, grid, rows, stream); break;
    case 2: launch_version<DECODE, 2>(p, head_dim, grid, rows, stream); break;
    case 3: launch_version<DECODE, 3>(p, head_dim, grid, rows, stream); break;
    default: fail("attention kernel version ", attention_kernel_version, " does not exist (1, 2, 3)");
  }
  CUDA_CHECK_LAUNCH();
}

int prefill_rows_of_version() { return attention_kernel_version == 3 ? prefill_rows<3>() : prefill_rows<1>(); }

// Rows per decode block: the GQA group size rounded up to a power of two.
int decode_rows(const AttentionShape& s) {
  const int G = s.num_heads / s.num_kv_heads;
  if (G > 8) fail("GQA groups of more than 8 query heads are not supported (", G, ")");
  int rows = 1;
  while (rows < G) rows *= 2;
  return rows;
}

}  // namespace

// The default, or NANOVLLM_ATTENTION_VERSION from the environment (for comparing versions end to end).
int attention_kernel_version = std::getenv("NANOVLLM_ATTENTION_VERSION") ? std::atoi(std::getenv("NANOVLLM_ATTENTION_VERSION")) : 1;

void store_kvcache_cuda(bf16* k_cache, bf16* v_cache, const bf16* k, const bf16* v, int64_t row_stride,
                        const int32_t* slot_mapping, int num_tokens, int kv_dim, cudaStream_t stream) {
  assert(kv_dim % 8 == 0 && row_stride % 8 == 0);
  if (num_tokens == 0) return;
  store_kvcache_kernel<<<num_tokens, 128, 0, stream>>>(k_cache, v_cache, k, v, row_stride, slot_mapping, kv_dim);
  CUDA_CHECK_LAUNCH();
}

void prefill_attention_cuda(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                            const bf16* v_cache, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                            const int32_t* block_tables, int block_table_width, int num_seqs, int max_seqlen_q,
                            const AttentionShape& shape, cudaStream_t stream) {
  if (num_seqs == 0) return;
  PagedAttentionParams p = make_params(out, out_stride, q, q_stride, k_cache, v_cache, block_tables,
                                       block_table_width, shape);
  p.cu_seqlens_q = cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_k;
  const int G = shape.num_heads / shape.num_kv_heads, rows = prefill_rows_of_version();
  const dim3 grid(unsigned((max_seqlen_q * G + rows - 1) / rows), unsigned(shape.num_kv_heads), unsigned(num_seqs));
  launch<false>(p, shape.head_dim, grid, rows, stream);
}

int decode_partition_size(int num_seqs, const AttentionShape& s) {
  // Enough blocks to fill the GPU (132 SMs on an H200) even for a handful of sequences; long partitions
  // for big batches, where every block then covers the whole of a typical context.
  const int work = num_seqs * s.num_kv_heads;
  if (work >= 1024) return 512;
  if (work >= 256) return 256;
  if (work >= 64) return 128;
  return 64;
}

size_t decode_attention_scratch_bytes(int max_seqs, int max_context_len, const AttentionShape& s) {
  size_t most = 0;
  for (int b = 1; b <= max_seqs; b++) {
    size_t parts = size_t((max_context_len + decode_partition_size(b, s) - 1) / decode_partition_size(b, s));
    most = std::max(most, size_t(b) * s.num_heads * parts);
  }
  return most * (size_t(s.head_dim) + 2) * sizeof(float);
}

void decode_attention_cuda(bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride, const bf16* k_cache,
                           const bf16* v_cache, const int32_t* context_lens, const int32_t* block_tables,
                           int block_table_width, int num_seqs, int max_context_len, const AttentionShape& shape,
                           float* scratch, cudaStream_t stream) {
  if (num_seqs == 0) return;
  PagedAttentionParams p = make_params(out, out_stride, q, q_stride, k_cache, v_cache, block_tables,
                                       block_table_width, shape);
  p.context_lens = context_lens;
  p.partition_size = decode_partition_size(num_seqs, shape);
  p.max_partitions = std::max(1, (max_context_len + p.partition_size - 1) / p.partition_size);
  const size_t entries = size_t(num_seqs) * shape.num_heads * p.max_partitions;
  p.part_max = scratch;
  p.part_sum = scratch + entries;
  p.part_out = scratch + 2 * entries;
  const dim3 grid(unsigned(p.max_partitions), unsigned(shape.num_kv_heads), unsigned(num_seqs));
  launch<true>(p, shape.head_dim, grid, decode_rows(shape), stream);
  const dim3 combine_grid(unsigned(shape.num_heads), unsigned(num_seqs));
  switch (shape.head_dim) {
    case 64: decode_combine_kernel<64><<<combine_grid, 64, 0, stream>>>(p); break;
    case 128: decode_combine_kernel<128><<<combine_grid, 128, 0, stream>>>(p); break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
