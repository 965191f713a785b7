// The CUDA attention kernels against the CPU reference (attention_cpu.cpp) on the same bf16-rounded data,
// every version of the table (attention.h: attention_versions) in every phase it implements, plus the
// default. Random caches with scrambled block tables; ragged lengths, sizes not multiples of 64; block
// sizes 16, 48 (a KV tile of 64 keys straddles pages unevenly) and 256; cached context before the queries
// (prefix hits, chunks that start and end mid-page); q_len = 1 prefill; GQA groups 1, 2, 3, 4, 8 and MQA
// (one KV head for 8 or 16 query heads); head dims 64 and 128, and 80, 96 and (prefill) 256 through the fallback (v0);
// one long prefill with many KV tiles; batch sizes that select every decode partition size; CUDA-graph
// sized grids with padding rows; v11 (splits merged in a cluster) bit for bit against v10 (the combine
// kernel). Outputs are poisoned (NaN) before each launch.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "05_attention/attention.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

struct Problem {
  AttentionShape shape;
  int num_blocks, width;
  std::vector<float> k_cache, v_cache;  // (num_blocks, block_size, kv_heads, head_dim)
  std::vector<int32_t> block_tables;    // (num_seqs, width), blocks drawn at random without repeats, -1 unused
};

// A cache with random contents and, for each sequence, a random set of blocks for `lengths[b]` tokens.
Problem make_problem(AttentionShape shape, const std::vector<int>& lengths, std::mt19937& rng) {
  Problem p{shape, 0, 0, {}, {}, {}};
  for (int len : lengths) {
    p.num_blocks += ceil_div(len, shape.block_size);
    p.width = std::max(p.width, ceil_div(len, shape.block_size));
  }
  p.num_blocks += 3;  // a few blocks nobody uses
  const size_t elems = size_t(p.num_blocks) * shape.block_size * shape.num_kv_heads * shape.head_dim;
  p.k_cache = random_bf16_values(elems, rng);
  p.v_cache = random_bf16_values(elems, rng);
  std::vector<int32_t> pool(size_t(p.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.block_tables.assign(lengths.size() * std::max(p.width, 1), -1);
  size_t next = 0;
  for (size_t b = 0; b < lengths.size(); b++)
    for (int i = 0; i < ceil_div(lengths[b], shape.block_size); i++) p.block_tables[b * p.width + i] = pool[next++];
  return p;
}

AttentionShape shape_of(int heads, int kv_heads, int head_dim, int block_size) {
  return {heads, kv_heads, head_dim, block_size, float(1.0 / std::sqrt(double(head_dim)))};
}

std::string describe(const AttentionShape& s) {
  return "heads " + std::to_string(s.num_heads) + "/" + std::to_string(s.num_kv_heads) + " dim " +
         std::to_string(s.head_dim) + " block " + std::to_string(s.block_size);
}

// The versions a test runs for a phase: the default, then every version implementing the phase.
std::vector<int> versions_of(AttentionPhase phase) {
  std::vector<int> out{kAttentionVersionDefault};
  for (const AttentionVersion& v : attention_versions())
    if (phase == AttentionPhase::Prefill ? v.prefill : v.decode) out.push_back(v.number);
  return out;
}

std::string version_label(AttentionPhase phase, int requested, const AttentionShape& s) {
  const int ran = attention_version_for(phase, requested, s);
  return "requested " + (requested == kAttentionVersionDefault ? std::string("default") : std::to_string(requested)) +
         ", ran " + attention_versions()[size_t(ran)].name;
}

// Prefill of sequences with seqlen_q[b] new queries at the end of seqlen_k[b] keys, every version
// against one CPU reference. `only` restricts the versions (empty: all).
void check_prefill(AttentionShape s, const std::vector<int>& seqlen_q, const std::vector<int>& seqlen_k,
                   std::mt19937& rng, std::vector<int> only = {}) {
  Problem p = make_problem(s, seqlen_k, rng);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; b < seqlen_q.size(); b++)
    cu_q.push_back(cu_q.back() + seqlen_q[b]), cu_k.push_back(cu_k.back() + seqlen_k[b]);
  const int T = cu_q.back(), out_dim = s.num_heads * s.head_dim;
  const int q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;  // q inside a wider qkv row
  std::vector<float> q = random_bf16_values(size_t(T) * q_stride, rng);
  std::vector<float> want(size_t(T) * out_dim);
  prefill_attention_cpu(want.data(), out_dim, q.data(), q_stride, p.k_cache.data(), p.v_cache.data(), cu_q.data(),
                        cu_k.data(), p.block_tables.data(), p.width, int(seqlen_q.size()), s);
  DeviceArray<bf16> d_q(to_bf16(q)), d_k(to_bf16(p.k_cache)), d_v(to_bf16(p.v_cache)), d_out(want.size());
  DeviceArray<int32_t> d_cu_q(cu_q), d_cu_k(cu_k), d_bt(p.block_tables);
  const int max_q = *std::max_element(seqlen_q.begin(), seqlen_q.end());
  for (int version : only.empty() ? versions_of(AttentionPhase::Prefill) : only) {
    d_out.poison();
    prefill_attention_cuda(d_out.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_cu_q.ptr, d_cu_k.ptr, d_bt.ptr,
                           p.width, int(seqlen_q.size()), max_q, s, version, 0);
    EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2)
        << "prefill, " << version_label(AttentionPhase::Prefill, version, s) << ", " << describe(s);
  }
}

// Decode of sequences with context[b] keys (0: a padding row), every decode version against one CPU
// reference. grid_context > 0 sizes the launch as a CUDA graph does (max_model_len).
void check_decode(AttentionShape s, const std::vector<int>& context, std::mt19937& rng, int grid_context = 0) {
  Problem p = make_problem(s, context, rng);
  const int B = int(context.size()), out_dim = s.num_heads * s.head_dim;
  const int q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  std::vector<float> q = random_bf16_values(size_t(B) * q_stride, rng);
  std::vector<float> want(size_t(B) * out_dim);
  decode_attention_cpu(want.data(), out_dim, q.data(), q_stride, p.k_cache.data(), p.v_cache.data(), context.data(),
                       p.block_tables.data(), p.width, B, s);
  const int max_ctx = grid_context ? grid_context : std::max(1, *std::max_element(context.begin(), context.end()));
  DeviceArray<bf16> d_q(to_bf16(q)), d_k(to_bf16(p.k_cache)), d_v(to_bf16(p.v_cache)), d_out(want.size());
  DeviceArray<int32_t> d_ctx(context), d_bt(p.block_tables);
  DeviceArray<float> scratch(decode_attention_scratch_bytes(B, max_ctx, s) / sizeof(float));
  for (int version : versions_of(AttentionPhase::Decode)) {
    d_out.poison();
    scratch.poison();  // a partial result read before it is written shows as NaN
    decode_attention_cuda(d_out.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_ctx.ptr, d_bt.ptr, p.width, B,
                          max_ctx, s, scratch.ptr, version, 0);
    EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2)
        << "decode, " << version_label(AttentionPhase::Decode, version, s) << ", B " << B << ", " << describe(s);
  }
}

}  // namespace

namespace nanovllm {
namespace test {
// late_writer_test.cu: K and V rows written to `slots` by a kernel launched overlapped, after a spin.
void late_cache_write_cuda(bf16* k_cache, bf16* v_cache, const bf16* k_rows, const bf16* v_rows,
                           const int32_t* slots, int n, int kv_dim, long long delay_cycles, cudaStream_t stream);
}  // namespace test
}  // namespace nanovllm

TEST(Ch05_AttentionCuda, StoreKvcacheWritesExactlyItsSlots) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int tokens = 20, kv_dim = 256, stride = 1024, slots = 64;
  std::vector<float> qkv = random_bf16_values(size_t(tokens) * stride, rng);
  std::vector<int32_t> slot(tokens);
  std::vector<int32_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < tokens; i++) slot[i] = i % 5 == 3 ? -1 : perm[i];
  DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_k(size_t(slots) * kv_dim), d_v(size_t(slots) * kv_dim);
  DeviceArray<int32_t> d_slot(slot);
  d_k.poison(), d_v.poison();
  store_kvcache_cuda(d_k.ptr, d_v.ptr, d_qkv.ptr + 512, d_qkv.ptr + 768, stride, d_slot.ptr, tokens, kv_dim, 0);
  std::vector<float> k = to_float(d_k.get()), v = to_float(d_v.get());
  std::vector<bool> written(slots, false);
  for (int i = 0; i < tokens; i++) {
    if (slot[i] < 0) continue;
    written[slot[i]] = true;
    for (int d = 0; d < kv_dim; d++) {
      ASSERT_EQ(k[size_t(slot[i]) * kv_dim + d], qkv[size_t(i) * stride + 512 + d]);
      ASSERT_EQ(v[size_t(slot[i]) * kv_dim + d], qkv[size_t(i) * stride + 768 + d]);
    }
  }
  for (int s = 0; s < slots; s++) {
    if (written[s]) continue;
    EXPECT_TRUE(std::isnan(k[size_t(s) * kv_dim])) << "slot " << s << " was overwritten";
  }
}

TEST(Ch05_AttentionCuda, StoreKvcacheUnalignedRowsTakeTheScalarPath) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const int tokens = 7, kv_dim = 36, stride = 3 * 36 + 4, slots = 16;  // kv_dim and stride not multiples of 8
  std::vector<float> qkv = random_bf16_values(size_t(tokens) * stride, rng);
  std::vector<int32_t> slot = {3, -1, 0, 15, 7, 8, 1};
  DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_k(size_t(slots) * kv_dim), d_v(size_t(slots) * kv_dim);
  DeviceArray<int32_t> d_slot(slot);
  d_k.poison(), d_v.poison();
  store_kvcache_cuda(d_k.ptr, d_v.ptr, d_qkv.ptr + 36, d_qkv.ptr + 72, stride, d_slot.ptr, tokens, kv_dim, 0);
  std::vector<float> k = to_float(d_k.get()), v = to_float(d_v.get());
  for (int i = 0; i < tokens; i++) {
    if (slot[i] < 0) continue;
    for (int d = 0; d < kv_dim; d++) {
      ASSERT_EQ(k[size_t(slot[i]) * kv_dim + d], qkv[size_t(i) * stride + 36 + d]);
      ASSERT_EQ(v[size_t(slot[i]) * kv_dim + d], qkv[size_t(i) * stride + 72 + d]);
    }
  }
}

TEST(Ch05_AttentionCuda, PrefillMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  for (int block : {16, 48, 256}) {
    check_prefill(shape_of(4, 2, 128, block), {1, 17, 300}, {1, 17, 300}, rng);    // plain prefill, q_len 1
    check_prefill(shape_of(6, 2, 64, block), {5, 40, 1}, {69, 40, 513}, rng);      // cached context; GQA 3
    check_prefill(shape_of(16, 8, 128, block), {130, 64}, {130, 200}, rng);        // a prefix hit of 136
    check_prefill(shape_of(32, 8, 128, block), {33, 7}, {100, 7}, rng);            // GQA group 4
    check_prefill(shape_of(8, 8, 64, block), {50, 129}, {50, 129}, rng);           // no GQA
    check_prefill(shape_of(8, 1, 128, block), {21, 3}, {21, 90}, rng);             // MQA, group 8
    check_prefill(shape_of(16, 1, 64, block), {37, 2}, {37, 150}, rng);            // MQA, group 16
    check_prefill(shape_of(8, 2, 128, block), {50, 70}, {80, 118}, rng);           // chunks from mid-page
  }
}

TEST(Ch05_AttentionCuda, PrefillLongCachedPrefixManyKvTiles) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  // 400 queries after 600 cached keys: 16 KV tiles of 64 keys, masked only near the diagonal; and a
  // second sequence whose queries start mid-tile.
  check_prefill(shape_of(8, 2, 128, 16), {400, 45}, {1000, 333}, rng);
  check_prefill(shape_of(8, 4, 64, 256), {200}, {777}, rng);
}

TEST(Ch05_AttentionCuda, PrefillManyShortSequences) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  // A prefill step of many short prompts, as bench's are but more of them: 150 sequences of 1-70 queries,
  // many of them one row tile long, most of the grid's blocks past their sequence's rows.
  std::vector<int> seqlen_q(150), seqlen_k(150);
  for (size_t b = 0; b < seqlen_q.size(); b++) {
    seqlen_q[b] = 1 + int(rng() % 70);
    seqlen_k[b] = seqlen_q[b] + (b % 3 == 1 ? int(rng() % 100) : 0);  // a cached prefix on every third
  }
  check_prefill(shape_of(16, 8, 128, 256), seqlen_q, seqlen_k, rng);
  check_prefill(shape_of(6, 2, 64, 16), seqlen_q, seqlen_k, rng);
}

TEST(Ch05_AttentionCuda, PrefillOddHeadDimsRunTheFallback) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  // Neither 64 nor 128: every version request runs v0 (attention_version_for).
  check_prefill(shape_of(4, 2, 96, 16), {9, 40}, {30, 40}, rng);
  check_prefill(shape_of(6, 3, 80, 48), {1, 25}, {70, 25}, rng);
  check_prefill(shape_of(2, 1, 256, 16), {12}, {20}, rng);
}

TEST(Ch05_AttentionCuda, DecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (int block : {16, 48, 256}) {
    check_decode(shape_of(4, 2, 128, block), {1, 17, 300, 2000}, rng);
    check_decode(shape_of(6, 2, 64, block), {513, 64, 65}, rng);
    check_decode(shape_of(16, 8, 128, block), {1000, 3, 777}, rng);
    check_decode(shape_of(16, 8, 128, block), {1000}, rng);  // one sequence: v10 and v11 split it 16 ways
    check_decode(shape_of(32, 8, 128, block), {257, 1}, rng);
    check_decode(shape_of(8, 8, 64, block), {100, 7}, rng);      // no GQA
    check_decode(shape_of(8, 1, 128, block), {99, 1200}, rng);   // MQA, group 8
    check_decode(shape_of(16, 1, 64, block), {50, 333}, rng);    // MQA, group 16: v0
  }
}

// Decode attention loads its first tiles before it waits for the previous kernel (cuda_utils.h), all but the
// tile of each sequence's newest key, which the previous kernel of a step writes (qk_norm_rope_store). Here
// that kernel (late_writer_test.cu) lets attention start, then spins ~100 µs before writing the newest keys;
// until then their slots hold NaN. Every version must give the CPU's answer over the written cache: short
// contexts put the newest key in a warp's first tiles (those loaded before the wait), long ones after them.
TEST(Ch05_AttentionCuda, DecodeReadsTheNewestKeyAfterThePreviousKernel) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const AttentionShape s = shape_of(16, 8, 128, 16);
  const int kv_dim = s.num_kv_heads * s.head_dim;
  for (const std::vector<int>& context : {std::vector<int>{1, 16, 17, 40, 1000}, std::vector<int>(24, 33),
                                          std::vector<int>{129, 2000}}) {
    Problem p = make_problem(s, context, rng);
    const int B = int(context.size()), out_dim = s.num_heads * s.head_dim;
    const int q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
    std::vector<float> q = random_bf16_values(size_t(B) * q_stride, rng);
    std::vector<float> want(size_t(B) * out_dim);
    decode_attention_cpu(want.data(), out_dim, q.data(), q_stride, p.k_cache.data(), p.v_cache.data(),
                         context.data(), p.block_tables.data(), p.width, B, s);
    // Each sequence's newest key: its slot and its K and V rows; the cache the GPU starts from has NaN there.
    std::vector<int32_t> slots(size_t(B), 0);
    std::vector<float> k_rows(size_t(B) * kv_dim), v_rows(size_t(B) * kv_dim);
    std::vector<float> stale_k = p.k_cache, stale_v = p.v_cache;
    for (int b = 0; b < B; b++) {
      const int key = context[size_t(b)] - 1;
      slots[size_t(b)] = p.block_tables[size_t(b) * p.width + key / s.block_size] * s.block_size + key % s.block_size;
      for (int c = 0; c < kv_dim; c++) {
        const size_t at = size_t(slots[size_t(b)]) * kv_dim + c;
        k_rows[size_t(b) * kv_dim + c] = p.k_cache[at], v_rows[size_t(b) * kv_dim + c] = p.v_cache[at];
        stale_k[at] = stale_v[at] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    const int max_ctx = *std::max_element(context.begin(), context.end());
    DeviceArray<bf16> d_q(to_bf16(q)), d_out(want.size()), d_k_rows(to_bf16(k_rows)), d_v_rows(to_bf16(v_rows));
    DeviceArray<int32_t> d_ctx(context), d_bt(p.block_tables), d_slots(slots);
    DeviceArray<float> scratch(decode_attention_scratch_bytes(B, max_ctx, s) / sizeof(float));
    for (int version : versions_of(AttentionPhase::Decode)) {
      DeviceArray<bf16> d_k(to_bf16(stale_k)), d_v(to_bf16(stale_v));
      d_out.poison();
      late_cache_write_cuda(d_k.ptr, d_v.ptr, d_k_rows.ptr, d_v_rows.ptr, d_slots.ptr, B, kv_dim, 200000, 0);
      decode_attention_cuda(d_out.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_ctx.ptr, d_bt.ptr, p.width, B,
                            max_ctx, s, scratch.ptr, version, 0);
      EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2)
          << "decode after a late write of the newest keys, " << version_label(AttentionPhase::Decode, version, s)
          << ", B " << B;
    }
  }
}

TEST(Ch05_AttentionCuda, DecodeOddHeadDimsRunTheFallback) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  check_decode(shape_of(4, 2, 96, 16), {1, 70, 300}, rng);
  check_decode(shape_of(6, 3, 80, 48), {40, 0, 5}, rng);
}

TEST(Ch05_AttentionCuda, DecodeEveryPartitionSizeAndPaddingRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  // 8 KV heads: 4 sequences -> partitions of 64, 16 -> 128, 64 -> 256, 160 -> 512 (v2-v9); v10 splits
  // 4 ways at 4 sequences, 1 way (no combine) from 16 on; v11 2 ways at 16 (a cluster of 2), 1 from 32.
  for (int B : {4, 16, 64, 160}) {
    std::vector<int> ctx(static_cast<size_t>(B), 0);
    for (int& c : ctx) c = 1 + int(rng() % 1500);
    check_decode(shape_of(16, 8, 128, 16), ctx, rng);
  }
  // A graph-sized grid (max_model_len) much larger than the contexts, and padding rows of context 0.
  check_decode(shape_of(16, 8, 128, 16), {5, 0, 300, 0}, rng, 4096);
  check_decode(shape_of(16, 8, 64, 256), {0, 0}, rng, 4096);
  // v10 with 1 split (16 sequences x 8 KV heads and more): the block writes `out` itself, zeros for padding.
  std::vector<int> padded(20, 0);
  for (size_t b = 0; b < padded.size(); b += 2) padded[b] = 1 + int(rng() % 1500);
  check_decode(shape_of(16, 8, 128, 16), padded, rng, 4096);
}

// v11's split count (host only): decode_splits' about 128 blocks, and 2 splits instead of 1 while one split
// leaves fewer than two blocks an SM (256); what decode_splits gives is v10's, unchanged.
TEST(Ch05_AttentionCuda, ClusterSplitsTwoBelowTwoBlocksAnSm) {
  const AttentionShape s = shape_of(16, 8, 128, 16);  // 8 KV heads
  const std::vector<std::pair<int, int>> seqs_splits = {{1, 16}, {2, 8}, {4, 4}, {8, 2}, {12, 2}, {16, 2},
                                                        {31, 2}, {32, 1}, {256, 1}};
  for (const auto& [seqs, splits] : seqs_splits) EXPECT_EQ(cluster_decode_splits(seqs, s), splits) << seqs;
  EXPECT_EQ(decode_splits(16, s), 1);
  EXPECT_EQ(cluster_decode_splits(64, shape_of(4, 2, 128, 16)), 2);  // 2 KV heads: 128 blocks at 64 sequences
}

TEST(Ch05_AttentionCuda, ClusterCombineGivesTheCombineKernelsBits) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  // Batches where v10 splits each context as many ways as the GPU's largest cluster holds at most (8 KV
  // heads: 1 sequence -> 16 splits where clusters of 16 fit, 2 -> 8, 3 -> 6, 4 -> 4, 8 -> 2), so that v11
  // has the same partitions: its merge in the cluster must give the combine kernel's bits. Contexts
  // shorter than the splits' tiles leave blocks past the context (empty partitions), and context 0 is a
  // padding row.
  const AttentionShape s = shape_of(16, 8, 128, 16);
  // Before compute capability 9.0 there are no clusters: tensor_core_decode_max_cluster() is 1, v11 is v10
  // itself, and every batch below (2 splits or more) would be skipped: say so rather than pass. From 9.0 on
  // (built for sm_90a, as the GPU's code must be) clusters of 8 at least must hold, and B = 2, 3, 4 and 8 run.
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 9) GTEST_SKIP() << "no thread-block clusters before compute capability 9.0: v11 runs as v10";
  int compared = 0;
  for (int B : {1, 2, 3, 4, 8}) {
    if (decode_splits(B, s) > tensor_core_decode_max_cluster()) continue;
    compared++;
    std::vector<int> context(static_cast<size_t>(B));
    for (int& c : context) c = 1 + int(rng() % 1500);
    if (B > 1) context[0] = 20;  // 2 tiles: only 2 of its splits hold keys, the rest are empty
    if (B > 2) context[1] = 0;
    Problem p = make_problem(s, context, rng);
    const int out_dim = s.num_heads * s.head_dim, q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
    const int max_ctx = 2048;  // as under a CUDA graph
    DeviceArray<bf16> d_q(to_bf16(random_bf16_values(size_t(B) * q_stride, rng))), d_k(to_bf16(p.k_cache)),
        d_v(to_bf16(p.v_cache)), out10(size_t(B) * out_dim), out11(size_t(B) * out_dim);
    DeviceArray<int32_t> d_ctx(context), d_bt(p.block_tables);
    DeviceArray<float> scratch(decode_attention_scratch_bytes(B, max_ctx, s) / sizeof(float));
    out10.poison();
    out11.poison();
    decode_attention_cuda(out10.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_ctx.ptr, d_bt.ptr, p.width, B,
                          max_ctx, s, scratch.ptr, 10, 0);
    scratch.poison();  // v11 must not need the partials
    decode_attention_cuda(out11.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_ctx.ptr, d_bt.ptr, p.width, B,
                          max_ctx, s, scratch.ptr, 11, 0);
    const std::vector<bf16> a = out10.get(), b = out11.get();
    ASSERT_EQ(a.size(), b.size());
    int differ = 0;
    for (size_t i = 0; i < a.size(); i++) differ += std::memcmp(&a[i], &b[i], sizeof(bf16)) != 0;
    EXPECT_EQ(differ, 0) << "B " << B << ": v11 differs from v10 in " << differ << " of " << a.size() << " outputs";
  }
  EXPECT_GE(compared, 4) << "batches whose splits fit one cluster (all but B = 1 where clusters of 16 do not fit)";
}

TEST(Ch05_AttentionCuda, KvWarmReadsEachBlocksShareOfItsBudget) {
  // kv_warm_cuda reports the XOR of every 32-bit word it read. Against the same XOR on the host over the keys
  // attention.h says it reads (each block's first floor(valid * budget / step bytes) keys of K and of V, or
  // all of them), on a random cache with scrambled tables, ragged contexts ending mid-block, a padding row
  // (context 0) and a table wider than any context (as under a CUDA graph): a key too many or too few, or a
  // wrong block, changes the XOR. Two shapes: small blocks, where a thread loads once a run, and Qwen3-0.6B's
  // (8 KV heads of 128, blocks of 256: 512 KB a run, 16 rounds of 8 loads a thread).
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const std::vector<std::pair<AttentionShape, std::vector<int>>> cases = {
      {shape_of(8, 2, 64, 16), {40, 17, 0, 5, 33}},  // kv_dim 128: a key is 256 bytes of K and 256 of V
      {shape_of(16, 8, 128, 256), {700, 300, 0, 257}}};
  for (const auto& [s, context] : cases) {
    const int kv_dim = s.num_kv_heads * s.head_dim;
    Problem p = make_problem(s, context, rng);
    const int width = p.width + 2;  // two table entries past every context
    std::vector<int32_t> table(context.size() * width, -1);
    for (size_t b = 0; b < context.size(); b++)
      std::copy_n(p.block_tables.begin() + b * p.width, p.width, table.begin() + b * width);
    const std::vector<bf16> k = to_bf16(p.k_cache), v = to_bf16(p.v_cache);
    DeviceArray<bf16> d_k(k), d_v(v);
    DeviceArray<int32_t> d_ctx(context), d_bt(table);
    const int64_t all_keys = std::accumulate(context.begin(), context.end(), int64_t(0));
    const int64_t step_bytes = all_keys * kv_dim * 2 * 2;  // K and V, bf16
    auto words_xor = [](const std::vector<bf16>& cache, size_t first, size_t elements) {
      uint32_t x = 0;
      for (size_t i = 0; i < elements; i += 2) {
        uint32_t word;
        std::memcpy(&word, &cache[first + i], sizeof(word));
        x ^= word;
      }
      return x;
    };
    for (int64_t budget : {int64_t(0), step_bytes / 3, step_bytes / 2, step_bytes - 1, step_bytes, 10 * step_bytes}) {
      uint32_t want = 0;
      int64_t keys_read = 0;
      for (size_t b = 0; b < context.size(); b++)
        for (int e = 0; e < width; e++) {
          const int valid = std::min(s.block_size, context[b] - e * s.block_size);
          if (valid <= 0) continue;
          const int keys = budget >= step_bytes ? valid : int(int64_t(valid) * budget / step_bytes);
          const size_t first = size_t(table[b * width + e]) * s.block_size * kv_dim;
          want ^= words_xor(k, first, size_t(keys) * kv_dim) ^ words_xor(v, first, size_t(keys) * kv_dim);
          keys_read += keys;
        }
      DeviceArray<unsigned> checksum(std::vector<unsigned>{0u});
      kv_warm_cuda(d_k.ptr, d_v.ptr, d_bt.ptr, d_ctx.ptr, width, int(context.size()), s.block_size, kv_dim, budget,
                   checksum.ptr, 0);
      EXPECT_EQ(checksum.get()[0], want) << "block size " << s.block_size << ", budget " << budget << " of "
                                         << step_bytes << " bytes (" << keys_read << " of " << all_keys << " keys)";
    }
  }
}

#else
TEST(Ch05_AttentionCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
