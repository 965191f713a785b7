// The CUDA attention kernels against the CPU reference (attention_cpu.cpp) on the same bf16-rounded
// data: random caches, scrambled block tables, ragged lengths, cached context before the queries
// (prefix hits and chunks), GQA group sizes 1 to 8, head dims 64 and 128, block sizes 16 to 256, and
// batch sizes that select every decode partition size. Outputs are poisoned before each launch.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <algorithm>
#include <numeric>

#include "05_attention/attention.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

struct Problem {
  AttentionShape shape;
  int num_blocks, width;
  std::vector<float> k_cache, v_cache;  // (num_blocks, block_size, kv_heads, head_dim)
  std::vector<int32_t> block_tables;    // (num_seqs, width), blocks drawn at random without repeats
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
  p.block_tables.assign(lengths.size() * p.width, -1);
  size_t next = 0;
  for (size_t b = 0; b < lengths.size(); b++)
    for (int i = 0; i < ceil_div(lengths[b], shape.block_size); i++) p.block_tables[b * p.width + i] = pool[next++];
  return p;
}

AttentionShape shape_of(int heads, int kv_heads, int head_dim, int block_size) {
  return {heads, kv_heads, head_dim, block_size, float(1.0 / std::sqrt(double(head_dim)))};
}

void check_prefill(AttentionShape s, const std::vector<int>& seqlen_q, const std::vector<int>& seqlen_k, std::mt19937& rng) {
  Problem p = make_problem(s, seqlen_k, rng);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; b < seqlen_q.size(); b++) cu_q.push_back(cu_q.back() + seqlen_q[b]), cu_k.push_back(cu_k.back() + seqlen_k[b]);
  const int T = cu_q.back(), q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, out_dim = s.num_heads * s.head_dim;
  std::vector<float> q = random_bf16_values(size_t(T) * q_stride, rng);  // q inside a wider qkv row
  std::vector<float> want(size_t(T) * out_dim);
  prefill_attention_cpu(want.data(), out_dim, q.data(), q_stride, p.k_cache.data(), p.v_cache.data(), cu_q.data(),
                        cu_k.data(), p.block_tables.data(), p.width, int(seqlen_q.size()), s);
  DeviceArray<bf16> d_q(to_bf16(q)), d_k(to_bf16(p.k_cache)), d_v(to_bf16(p.v_cache)), d_out(want.size());
  DeviceArray<int32_t> d_cu_q(cu_q), d_cu_k(cu_k), d_bt(p.block_tables);
  d_out.poison();
  prefill_attention_cuda(d_out.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_cu_q.ptr, d_cu_k.ptr, d_bt.ptr,
                         p.width, int(seqlen_q.size()), *std::max_element(seqlen_q.begin(), seqlen_q.end()), s, 0);
  EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2)
      << "heads " << s.num_heads << "/" << s.num_kv_heads << " dim " << s.head_dim << " block " << s.block_size;
}

void check_decode(AttentionShape s, const std::vector<int>& context, std::mt19937& rng, int grid_context = 0) {
  Problem p = make_problem(s, context, rng);
  const int B = int(context.size()), q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, out_dim = s.num_heads * s.head_dim;
  std::vector<float> q = random_bf16_values(size_t(B) * q_stride, rng);
  std::vector<float> want(size_t(B) * out_dim);
  decode_attention_cpu(want.data(), out_dim, q.data(), q_stride, p.k_cache.data(), p.v_cache.data(), context.data(),
                       p.block_tables.data(), p.width, B, s);
  const int max_ctx = grid_context ? grid_context : *std::max_element(context.begin(), context.end());
  DeviceArray<bf16> d_q(to_bf16(q)), d_k(to_bf16(p.k_cache)), d_v(to_bf16(p.v_cache)), d_out(want.size());
  DeviceArray<int32_t> d_ctx(context), d_bt(p.block_tables);
  DeviceArray<float> scratch(decode_attention_scratch_bytes(B, max_ctx, s) / 4);
  d_out.poison();
  decode_attention_cuda(d_out.ptr, out_dim, d_q.ptr, q_stride, d_k.ptr, d_v.ptr, d_ctx.ptr, d_bt.ptr, p.width, B,
                        max_ctx, s, scratch.ptr, 0);
  EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2)
      << "B " << B << " heads " << s.num_heads << "/" << s.num_kv_heads << " dim " << s.head_dim << " block " << s.block_size;
}

}  // namespace

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

// Runs the body once per kernel version (attention.h: attention_kernel_version), restoring the default.
template <class F>
void for_each_version(F&& body) {
  const int saved = attention_kernel_version;
  for (int version : {1, 2, 3}) {
    SCOPED_TRACE("kernel v" + std::to_string(version));
    attention_kernel_version = version;
    body();
  }
  attention_kernel_version = saved;
}

TEST(Ch05_AttentionCuda, PrefillMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  for_each_version([&] {
  for (int block : {16, 32, 256}) {
    check_prefill(shape_of(4, 2, 128, block), {1, 17, 300}, {1, 17, 300}, rng);          // plain prefill
    check_prefill(shape_of(6, 2, 64, block), {5, 40, 1}, {69, 40, 513}, rng);            // cached context
    check_prefill(shape_of(16, 8, 128, block), {130, 64}, {130, 200}, rng);
    check_prefill(shape_of(32, 8, 128, block), {33, 7}, {100, 7}, rng);                  // GQA group 4
    check_prefill(shape_of(8, 8, 64, block), {50}, {50}, rng);                           // no GQA
    check_prefill(shape_of(8, 1, 128, block), {21, 3}, {21, 90}, rng);                   // group 8
  }
  });
  // A long context whose block table does not fit the 256 staged entries of v2 (16-token blocks).
  check_prefill(shape_of(16, 8, 128, 16), {70}, {5000}, rng);
}

TEST(Ch05_AttentionCuda, DecodeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for_each_version([&] {
  for (int block : {16, 48, 256}) {
    check_decode(shape_of(4, 2, 128, block), {1, 17, 300, 2000}, rng);
    check_decode(shape_of(6, 2, 64, block), {513, 64, 65}, rng);
    check_decode(shape_of(16, 8, 128, block), {1000, 3, 777}, rng);
    check_decode(shape_of(32, 8, 128, block), {257, 1}, rng);
    check_decode(shape_of(8, 1, 128, block), {99, 1200}, rng);
  }
  });
}

TEST(Ch05_AttentionCuda, DecodeEveryPartitionSizeAndPaddingRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  for_each_version([&] {
    // 8 KV heads: 4 sequences -> partitions of 64, 16 -> 128, 64 -> 256, 160 -> 512.
    for (int B : {4, 16, 64, 160}) {
      std::vector<int> ctx(static_cast<size_t>(B), 0);
      for (int& c : ctx) c = 1 + int(rng() % 1500);
      check_decode(shape_of(16, 8, 128, 16), ctx, rng);
    }
    // A graph-sized grid (max_model_len) much larger than the contexts, and padding rows of context 0.
    std::vector<int> ctx = {5, 0, 300, 0};
    check_decode(shape_of(16, 8, 128, 16), ctx, rng, 4096);
  });
}

#else
TEST(Ch05_AttentionCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
