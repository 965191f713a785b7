// kv_warm.cu: part of a layer's KV cache brought into the L2 while the projections before its attention run.
//
// Idea:     between two attentions a decode step runs o_proj, the MLP and qkv, whose weights (31 MB a layer for
//           Qwen3-0.6B) come from memory at a fraction of its bandwidth: at 16 rows the memory idles for most of
//           the ~19 us they take. Attention then streams its K/V from DRAM, each of its blocks over a share of a
//           sequence's keys. If the first share of every cache block the step uses is already in the L2, every
//           one of attention's blocks finishes that much sooner. The engine launches this kernel on a branch of
//           the captured step's graph, beside the projections, after a layer's attention and o_proj (for the
//           next layer's attention): nothing waits for it.
// Why loads: the probe (tests/kv_stream_probe.cu, "asked of the L2 first") found real loads worth two to three
//           times what prefetch instructions are (prefetch.global.L2, its evict_last form, or the copy engine's
//           cp.async.bulk.prefetch.L2) for the same bytes: attention at 16 sequences 22.0 us after 16.8 MB loaded
//           against 25.2-26.7 after the same asked for, 28.8 with nothing (H100). Why, it did not say.
// How much: a fixed budget of bytes a layer, spread over the step's keys in proportion: each cache block gives
//           its first floor(valid x budget / all) keys, where valid is the block's keys and all the step's (sum
//           of context_lens). Under a graph the budget holds at any context, since the kernel reads the
//           contexts at replay. The engine asks for 16 MiB a layer up to 32 rows and 8 MiB above, the best of
//           2-24 MB at 16, 32 and 64 rows once the projections' weights leave the L2 first
//           (04_model_runner/NOTES.md, section 19).
// Launch:   grid (table_width, num_seqs) of 256 threads; block (e, s) reads cache block table[s][e], K then V,
//           16 bytes a thread and load, 8 loads in flight a thread.
//           A faster warm (4 or 16 blocks a cache block) made the 16-row step slower, and 4 loads in flight a
//           thread changed nothing (04_model_runner/NOTES.md, section 19, "A faster warm").
#include "05_attention/attention.h"

#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {
namespace {

constexpr int kWarmThreads = 256;
constexpr int kLoadsInFlight = 8;

// The keys a cache block with `valid` keys gives, of all_keys in the step: its share of a budget of bytes,
// each key kv_dim elements of K and as many of V in bf16. All of them when the budget covers the step.
__device__ inline int warm_kv_keys(int valid, int64_t all_keys, int kv_dim, int64_t budget_bytes) {
  const int64_t step_bytes = all_keys * kv_dim * 2 * int64_t(sizeof(bf16));
  if (budget_bytes >= step_bytes) return valid;
  return int(int64_t(valid) * budget_bytes / step_bytes);
}

// XOR of the 32-bit words of bytes [0, n) at p (n a multiple of 16, p 16-byte aligned), the block's threads
// 16 bytes at a time, each with kLoadsInFlight loads issued before it uses any. ld.global.cg: the L2 only,
// where attention's blocks on other SMs will find the lines.
__device__ inline uint32_t xor_of_run(const char* p, uint32_t n) {
  uint32_t x = 0;
  const uint32_t stride = kWarmThreads * 16;
  for (uint32_t at = threadIdx.x * 16; at < n; at += kLoadsInFlight * stride) {
    uint32_t w[kLoadsInFlight][4];
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; j++) {
      const uint32_t o = at + j * stride;
      if (o < n)
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(w[j][0]), "=r"(w[j][1]), "=r"(w[j][2]), "=r"(w[j][3])
                     : "l"(p + o));
      else
        w[j][0] = w[j][1] = w[j][2] = w[j][3] = 0;
    }
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; j++) x ^= w[j][0] ^ w[j][1] ^ w[j][2] ^ w[j][3];
  }
  return x;
}

// Block (e, s): the first warm_kv_keys(...) keys of sequence s's e-th cache block, K and V. Every block first
// adds up the step's context lengths (num_seqs of them, a few hundred at most) to know its share.
__global__ void __launch_bounds__(kWarmThreads)
    kv_warm_kernel(const bf16* k_cache, const bf16* v_cache, const int* block_tables, const int* context_lens,
                   int table_width, int num_seqs, int block_size, int kv_dim, int64_t budget_bytes,
                   unsigned* checksum) {
  const int e = blockIdx.x, s = blockIdx.y;
  const int valid = min(block_size, context_lens[s] - e * block_size);
  if (valid <= 0) return;  // past the sequence's context (or a padding row): nothing to read
  __shared__ int64_t all_keys;
  if (threadIdx.x < 32) {
    int64_t sum = 0;
    for (int i = threadIdx.x; i < num_seqs; i += 32) sum += max(context_lens[i], 0);
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) all_keys = sum;
  }
  __syncthreads();  // all_keys, written by thread 0, read by every thread
  const int keys = warm_kv_keys(valid, all_keys, kv_dim, budget_bytes);
  const int block = block_tables[int64_t(s) * table_width + e];
  if (keys == 0 || block < 0) return;
  const int64_t first = int64_t(block) * block_size * kv_dim;  // the block's first element, K and V alike
  const uint32_t bytes = uint32_t(keys) * uint32_t(kv_dim) * sizeof(bf16);
  uint32_t x = xor_of_run(reinterpret_cast<const char*>(k_cache + first), bytes) ^
               xor_of_run(reinterpret_cast<const char*>(v_cache + first), bytes);
  for (int offset = 16; offset > 0; offset >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, offset);
  if (threadIdx.x % 32 == 0) atomicXor(checksum, x);
}

}  // namespace

void kv_warm_cuda(const bf16* k_cache, const bf16* v_cache, const int* block_tables, const int* context_lens,
                  int table_width, int num_seqs, int block_size, int kv_dim, int64_t budget_bytes, unsigned* checksum,
                  cudaStream_t stream) {
  if (kv_dim % 8 != 0) fail("internal: kv_warm_cuda needs kv_dim a multiple of 8 (16-byte rows), got ", kv_dim);
  if (num_seqs == 0 || table_width == 0) return;
  kv_warm_kernel<<<dim3(unsigned(table_width), unsigned(num_seqs)), kWarmThreads, 0, stream>>>(
      k_cache, v_cache, block_tables, context_lens, table_width, num_seqs, block_size, kv_dim, budget_bytes, checksum);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
