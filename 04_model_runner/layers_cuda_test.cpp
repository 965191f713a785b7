// Each CUDA layer kernel against its CPU reference (layers_cpu.cpp) on random bf16 inputs with ragged
// sizes; outputs are poisoned first so that an element left unwritten fails. Tolerance: relative error
// by norm <= 1e-2 (one bf16 rounding of the output is ~4e-3).
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "04_model_runner/layers.h"
#include "05_attention/attention.h"
#include "06_tensor_parallel/linear.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

TEST(Ch04_LayersCuda, EmbeddingWithVocabParallelMask) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  const int vocab_part = 50, hidden = 96, n = 37, vocab_start = 100;
  std::vector<float> table = random_bf16_values(size_t(vocab_part) * hidden, rng);
  std::vector<int32_t> ids(n);
  for (int& id : ids) id = 80 + int(rng() % 90);  // some below, some inside, some above this rank's part
  std::vector<float> want(size_t(n) * hidden);
  embedding_cpu(want.data(), table.data(), ids.data(), n, hidden, vocab_start, vocab_part);
  DeviceArray<bf16> d_table(to_bf16(table)), d_out(size_t(n) * hidden);
  DeviceArray<int32_t> d_ids(ids);
  d_out.poison();
  embedding_cuda(d_out.ptr, d_table.ptr, d_ids.ptr, n, hidden, vocab_start, vocab_part, 0);
  EXPECT_EQ(to_float(d_out.get()), want);  // a copy: exact
}

TEST(Ch04_LayersCuda, RmsNormAndFusedAdd) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  // 1, 2, 3 (run with 4), 4 and 8 chunks a thread (rmsnorm_kernel's CHUNKS, sized to the row from 1,024 rows
  // on, a prefill's), and rows shorter than one.
  for (int hidden : {64, 96, 1024, 2048, 2560, 4096, 8192}) {
    for (int n : {1, 7, 130, 1100}) {
      std::vector<float> x = random_bf16_values(size_t(n) * hidden, rng, 3.0f);
      std::vector<float> res = random_bf16_values(size_t(n) * hidden, rng, 3.0f);
      std::vector<float> w = random_bf16_values(size_t(hidden), rng);
      std::vector<float> want(x.size());
      rmsnorm_cpu(want.data(), x.data(), w.data(), n, hidden, 1e-6f);
      DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_out(x.size()), d_res(to_bf16(res));
      d_out.poison();
      rmsnorm_cuda(d_out.ptr, d_x.ptr, d_w.ptr, n, hidden, 1e-6f, 0);
      EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2) << hidden << " x " << n;

      std::vector<float> res_want = res, want2(x.size());
      add_rmsnorm_cpu(want2.data(), res_want.data(), x.data(), w.data(), n, hidden, 1e-6f);
      d_out.poison();
      add_rmsnorm_cuda(d_out.ptr, d_res.ptr, d_x.ptr, d_w.ptr, n, hidden, 1e-6f, 0);
      EXPECT_LE(rel_error(to_float(d_out.get()), want2), 1e-2) << "fused " << hidden << " x " << n;
      EXPECT_LE(rel_error(to_float(d_res.get()), res_want), 1e-2) << "residual " << hidden << " x " << n;
    }
  }
}

// Linear version 8: the norm after a narrow projection adds the projection's split-K partials itself. Its
// out and residual must be add_rmsnorm_cuda's bits over x = the partials' sum in split order (from +0.0f,
// or from -0.0f for one split), rounded to bf16 as the projection stores it; and the CPU composition's within
// a bf16 step. 1-8 splits, rows of one and of several chunks a thread, decode-sized and prefill-sized n.
TEST(Ch04_LayersCuda, AddRmsNormOverPartialSums) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (int hidden : {64, 1024, 2048})
    for (int n : {1, 9, 192, 1100})
      for (int splits : {1, 2, 5, 8}) {
        const size_t size = size_t(n) * hidden;
        std::vector<float> partials = random_bf16_values(size * splits, rng, 1.5f);
        for (float& p : partials) p *= 1.0f + 1e-3f;  // fp32 values, not bf16 ones
        std::vector<float> x(size);
        for (size_t e = 0; e < size; e++) {
          float sum = splits == 1 ? -0.0f : 0.0f;
          for (int p = 0; p < splits; p++) sum += partials[size_t(p) * size + e];
          x[e] = bf16_to_float(float_to_bf16(sum));
        }
        std::vector<float> res = random_bf16_values(size, rng, 3.0f), w = random_bf16_values(size_t(hidden), rng);
        DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_res(to_bf16(res)), d_res2(to_bf16(res)), d_out(size),
            d_out2(size);
        DeviceArray<float> d_partials(partials);
        d_out.poison(), d_out2.poison();
        add_rmsnorm_cuda(d_out.ptr, d_res.ptr, d_x.ptr, d_w.ptr, n, hidden, 1e-6f, 0);
        add_rmsnorm_partials_cuda(d_out2.ptr, d_res2.ptr, d_partials.ptr, splits, d_w.ptr, n, hidden, 1e-6f, 0);
        const std::string what = std::to_string(hidden) + " x " + std::to_string(n) + ", " + std::to_string(splits) + " splits";
        EXPECT_EQ(to_float(d_out2.get()), to_float(d_out.get())) << what;
        EXPECT_EQ(to_float(d_res2.get()), to_float(d_res.get())) << what;
        std::vector<float> res_want = res, want(size);
        add_rmsnorm_cpu(want.data(), res_want.data(), x.data(), w.data(), n, hidden, 1e-6f);
        EXPECT_LE(rel_error(to_float(d_out2.get()), want), 1e-2) << what;
      }
}

TEST(Ch04_LayersCuda, QkNormRope) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  struct Case { int heads, kv_heads, head_dim; };
  for (Case c : {Case{4, 2, 128}, Case{6, 2, 64}, Case{16, 8, 128}}) {
    const int n = 45, max_pos = 3000, stride = (c.heads + 2 * c.kv_heads) * c.head_dim;
    std::vector<float> qkv = random_bf16_values(size_t(n) * stride, rng, 2.0f);
    std::vector<float> qn = random_bf16_values(size_t(c.head_dim), rng), kn = random_bf16_values(size_t(c.head_dim), rng);
    std::vector<int32_t> pos(n);
    for (int& p : pos) p = int(rng() % max_pos);
    std::vector<float> cos, sin;
    build_rope_table(cos, sin, max_pos, c.head_dim, 1e6);
    std::vector<float> want = qkv;
    qk_norm_rope_cpu(want.data(), stride, qn.data(), kn.data(), pos.data(), cos.data(), sin.data(), n, c.heads,
                     c.kv_heads, c.head_dim, 1e-6f);
    DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_qn(to_bf16(qn)), d_kn(to_bf16(kn));
    DeviceArray<int32_t> d_pos(pos);
    DeviceArray<float> d_cos(cos), d_sin(sin);
    qk_norm_rope_cuda(d_qkv.ptr, stride, d_qn.ptr, d_kn.ptr, d_pos.ptr, d_cos.ptr, d_sin.ptr, n, c.heads, c.kv_heads,
                      c.head_dim, 1e-6f, 0);
    std::vector<float> got = to_float(d_qkv.get());
    EXPECT_LE(rel_error(got, want), 1e-2) << c.head_dim;
    // v is untouched: exactly the input.
    for (int i = 0; i < n; i++)
      for (int k = (c.heads + c.kv_heads) * c.head_dim; k < stride; k++)
        ASSERT_EQ(got[size_t(i) * stride + k], qkv[size_t(i) * stride + k]);
  }
}

namespace {

// The raw 16 bits of each bf16, for exact comparisons (a NaN never equals itself as a float).
std::vector<uint16_t> bits(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(uint16_t));
  return out;
}

}  // namespace

// The fused qk-norm + RoPE + KV write against its spec, the CPU composition qk_norm_rope_cpu then
// store_kvcache_cpu (qk_norm_rope_store_cpu), and bit for bit against the two CUDA kernels it replaces, in
// q and in the caches; qkv's k and v must come out as they went in (the kernel writes k to the cache only).
// Ragged token counts, GQA, head_dim 64 and 128, padding rows (slot -1). Both caches are poisoned first:
// a slot that no token maps to must still hold the poison afterwards.
TEST(Ch04_LayersCuda, QkNormRopeStoreFused) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  struct Case { int heads, kv_heads, head_dim; };
  for (Case c : {Case{4, 2, 128}, Case{6, 2, 64}, Case{16, 8, 128}, Case{8, 1, 64}}) {
    for (int n : {1, 3, 45, 130, 1030}) {  // 1030: a prefill's launch (4 warps a block, from 1,024 rows)
      const int kv_dim = c.kv_heads * c.head_dim, q_dim = c.heads * c.head_dim, stride = q_dim + 2 * kv_dim;
      const int max_pos = 3000, num_slots = 4 * n + 16;
      const std::string what = std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads of " +
                               std::to_string(c.head_dim) + ", n " + std::to_string(n);
      std::vector<float> qkv = random_bf16_values(size_t(n) * stride, rng, 2.0f);
      std::vector<float> qn = random_bf16_values(size_t(c.head_dim), rng), kn = random_bf16_values(size_t(c.head_dim), rng);
      std::vector<int32_t> pos(static_cast<size_t>(n)), slots(static_cast<size_t>(num_slots));
      for (int& p : pos) p = int(rng() % max_pos);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);  // scattered slots, each used once
      slots.resize(size_t(n));
      for (int i = 2; i < n; i += 4) slots[size_t(i)] = -1;  // padding rows
      std::vector<float> cos, sin;
      build_rope_table(cos, sin, max_pos, c.head_dim, 1e6);

      // The spec, on the CPU.
      std::vector<float> want = qkv, k_want(size_t(num_slots) * kv_dim, NAN), v_want(k_want.size(), NAN);
      qk_norm_rope_store_cpu(want.data(), stride, qn.data(), kn.data(), pos.data(), cos.data(), sin.data(),
                             k_want.data(), v_want.data(), slots.data(), n, c.heads, c.kv_heads, c.head_dim, 1e-6f);

      // The fused kernel, and the two kernels it replaces.
      DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_qn(to_bf16(qn)), d_kn(to_bf16(kn)), d_k(k_want.size()), d_v(k_want.size());
      DeviceArray<bf16> u_qkv(to_bf16(qkv)), u_k(k_want.size()), u_v(k_want.size());
      DeviceArray<int32_t> d_pos(pos), d_slots(slots);
      DeviceArray<float> d_cos(cos), d_sin(sin);
      d_k.poison(), d_v.poison(), u_k.poison(), u_v.poison();
      qk_norm_rope_store_cuda(d_qkv.ptr, stride, d_qn.ptr, d_kn.ptr, d_pos.ptr, d_cos.ptr, d_sin.ptr, d_k.ptr, d_v.ptr,
                              d_slots.ptr, n, c.heads, c.kv_heads, c.head_dim, 1e-6f, 0);
      qk_norm_rope_cuda(u_qkv.ptr, stride, d_qn.ptr, d_kn.ptr, d_pos.ptr, d_cos.ptr, d_sin.ptr, n, c.heads, c.kv_heads,
                        c.head_dim, 1e-6f, 0);
      store_kvcache_cuda(u_k.ptr, u_v.ptr, u_qkv.ptr + q_dim, u_qkv.ptr + q_dim + kv_dim, stride, d_slots.ptr, n, kv_dim, 0);

      // qkv: q normed and rotated in place, k and v exactly the input.
      const std::vector<float> got = to_float(d_qkv.get());
      std::vector<float> q_got, q_ref;
      for (int i = 0; i < n; i++) {
        q_got.insert(q_got.end(), got.begin() + size_t(i) * stride, got.begin() + size_t(i) * stride + q_dim);
        q_ref.insert(q_ref.end(), want.begin() + size_t(i) * stride, want.begin() + size_t(i) * stride + q_dim);
        for (int k = q_dim; k < stride; k++)
          ASSERT_EQ(got[size_t(i) * stride + k], qkv[size_t(i) * stride + k]) << what << ": k or v of token " << i;
      }
      EXPECT_LE(rel_error(q_got, q_ref), 1e-2) << what;

      // The caches: each token's slot holds its k (within bf16 rounding) and v (a copy: exact); every
      // other slot, padding rows' included, still holds the poison (0xffff).
      const std::vector<uint16_t> k_bits = bits(d_k.get()), v_bits = bits(d_v.get());
      std::vector<bool> written(size_t(num_slots), false);
      for (int32_t s : slots)
        if (s >= 0) written[size_t(s)] = true;
      std::vector<float> k_got, k_ref, v_got, v_ref;
      for (int s = 0; s < num_slots; s++)
        for (int d = 0; d < kv_dim; d++) {
          const size_t e = size_t(s) * kv_dim + d;
          if (!written[size_t(s)]) {
            ASSERT_EQ(k_bits[e], 0xffff) << what << ": k slot " << s << " was written";
            ASSERT_EQ(v_bits[e], 0xffff) << what << ": v slot " << s << " was written";
            continue;
          }
          k_got.push_back(bf16_to_float(k_bits[e])), k_ref.push_back(k_want[e]);
          v_got.push_back(bf16_to_float(v_bits[e])), v_ref.push_back(v_want[e]);
        }
      EXPECT_LE(rel_error(k_got, k_ref), 1e-2) << what;
      EXPECT_EQ(v_got, v_ref) << what;

      // The same bits as qk_norm_rope_cuda then store_kvcache_cuda, in q and in the caches (the helpers are
      // shared; a difference here means the compiler contracted the rotation differently in the two kernels).
      const std::vector<uint16_t> fused_qkv = bits(d_qkv.get()), unfused_qkv = bits(u_qkv.get());
      for (int i = 0; i < n; i++)
        for (int k = 0; k < q_dim; k++)
          ASSERT_EQ(fused_qkv[size_t(i) * stride + k], unfused_qkv[size_t(i) * stride + k]) << what << ": q of token " << i;
      EXPECT_EQ(k_bits, bits(u_k.get())) << what;
      EXPECT_EQ(v_bits, bits(u_v.get())) << what;
    }
  }
}

// The model's decode call Backend::qk_norm_rope_store_attention: attention v9, v10 and v11 do the qk-norm, RoPE
// and KV write inside the attention kernel (decode_attention_fused_cuda). Against the two launches it
// replaces (the same bits, in out and in both caches) and against the CPU spec (qk_norm_rope_store_cpu,
// then decode_attention_cpu). Cases: Qwen3-0.6B's heads with 1 split (20 sequences) and several (3), GQA
// groups of 2 and 8, head_dim 64, padding rows (context 0, slot -1), a grid sized for max_model_len.
TEST(Ch04_LayersCuda, QkNormRopeStoreInsideDecodeAttention) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  struct Case { int heads, kv_heads, head_dim, block_size; std::vector<int> context; int grid_context; };
  std::vector<int> twenty(20), forty_eight(48);
  for (size_t b = 0; b < twenty.size(); b++) twenty[b] = b % 7 == 3 ? 0 : 1 + int(rng() % 1200);
  // 384 blocks at one split: more than an H200 holds at once (2 an SM), so later blocks do their q work
  // after the first wave's, as the engine's larger batches would if they fused.
  for (size_t b = 0; b < forty_eight.size(); b++) forty_eight[b] = b % 11 == 5 ? 0 : 1 + int(rng() % 600);
  const std::vector<Case> cases = {{16, 8, 128, 16, {1, 300, 2000}, 0}, {16, 8, 128, 256, twenty, 4096},
                                   {16, 8, 128, 256, forty_eight, 0}, {8, 1, 64, 16, {77, 0, 513}, 1024},
                                   {4, 2, 128, 48, {17, 200}, 0}};
  for (const Case& c : cases) {
    const int B = int(c.context.size()), kv_dim = c.kv_heads * c.head_dim, q_dim = c.heads * c.head_dim;
    const int stride = q_dim + 2 * kv_dim, max_pos = 4096;
    const AttentionShape shape{c.heads, c.kv_heads, c.head_dim, c.block_size, 1.0f / std::sqrt(float(c.head_dim))};
    // Each sequence its own blocks, in a shuffled order; the new token at position context - 1 in its slot.
    int width = 1, num_blocks = 0;
    for (int ctx : c.context) width = std::max(width, (ctx + c.block_size - 1) / c.block_size);
    std::vector<int32_t> order(size_t(B) * width);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> tables(size_t(B) * width, -1), positions(size_t(B), 0), slots(size_t(B), -1);
    for (int b = 0; b < B; b++) {
      const int ctx = c.context[size_t(b)], blocks = (ctx + c.block_size - 1) / c.block_size;
      for (int i = 0; i < blocks; i++) tables[size_t(b) * width + i] = order[size_t(num_blocks++)];
      if (ctx == 0) continue;  // a padding row
      positions[size_t(b)] = ctx - 1;
      slots[size_t(b)] = tables[size_t(b) * width + (ctx - 1) / c.block_size] * c.block_size + (ctx - 1) % c.block_size;
    }
    const size_t cache_elems = size_t(B) * width * c.block_size * kv_dim;
    std::vector<float> qkv = random_bf16_values(size_t(B) * stride, rng, 2.0f);
    std::vector<float> k_cache = random_bf16_values(cache_elems, rng), v_cache = random_bf16_values(cache_elems, rng);
    std::vector<float> qn = random_bf16_values(size_t(c.head_dim), rng), kn = random_bf16_values(size_t(c.head_dim), rng);
    std::vector<float> cos, sin;
    build_rope_table(cos, sin, max_pos, c.head_dim, 1e6);
    const std::string what = std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads of " +
                             std::to_string(c.head_dim) + ", block " + std::to_string(c.block_size) + ", " +
                             std::to_string(B) + " sequences";

    // The spec, on the CPU.
    std::vector<float> q_want = qkv, k_want = k_cache, v_want = v_cache, want(size_t(B) * q_dim);
    qk_norm_rope_store_cpu(q_want.data(), stride, qn.data(), kn.data(), positions.data(), cos.data(), sin.data(),
                           k_want.data(), v_want.data(), slots.data(), B, c.heads, c.kv_heads, c.head_dim, 1e-6f);
    decode_attention_cpu(want.data(), q_dim, q_want.data(), stride, k_want.data(), v_want.data(), c.context.data(),
                         tables.data(), width, B, shape);

    const int max_ctx = c.grid_context ? c.grid_context : *std::max_element(c.context.begin(), c.context.end());
    DeviceArray<bf16> d_qn(to_bf16(qn)), d_kn(to_bf16(kn));
    DeviceArray<int32_t> d_pos(positions), d_slots(slots), d_ctx(c.context), d_tables(tables);
    DeviceArray<float> d_cos(cos), d_sin(sin), scratch(decode_attention_scratch_bytes(B, max_ctx, shape) / sizeof(float));
    const QkNormRopeInputs qk{d_qn.ptr, d_kn.ptr, d_cos.ptr, d_sin.ptr, d_pos.ptr, d_slots.ptr, 1e-6f};
    for (int version : {9, 10, 11}) {
      // Two launches, then one, each on fresh copies of qkv and the caches.
      DeviceArray<bf16> u_qkv(to_bf16(qkv)), u_k(to_bf16(k_cache)), u_v(to_bf16(v_cache)), u_out(size_t(B) * q_dim);
      DeviceArray<bf16> f_qkv(to_bf16(qkv)), f_k(to_bf16(k_cache)), f_v(to_bf16(v_cache)), f_out(size_t(B) * q_dim);
      u_out.poison(), f_out.poison();
      qk_norm_rope_store_cuda(u_qkv.ptr, stride, d_qn.ptr, d_kn.ptr, d_pos.ptr, d_cos.ptr, d_sin.ptr, u_k.ptr, u_v.ptr,
                              d_slots.ptr, B, c.heads, c.kv_heads, c.head_dim, 1e-6f, 0);
      decode_attention_cuda(u_out.ptr, q_dim, u_qkv.ptr, stride, u_k.ptr, u_v.ptr, d_ctx.ptr, d_tables.ptr, width, B,
                            max_ctx, shape, scratch.ptr, version, 0);
      scratch.poison();  // the fused run must not read the first run's partials
      ASSERT_TRUE(decode_attention_fuses_qk_norm_rope(version, shape)) << what;
      decode_attention_fused_cuda(f_out.ptr, q_dim, f_qkv.ptr, stride, f_k.ptr, f_v.ptr, d_ctx.ptr, d_tables.ptr, width,
                                  B, max_ctx, shape, scratch.ptr, version, qk, 0);
      const std::string label = what + ", v" + std::to_string(version);
      EXPECT_EQ(bits(f_out.get()), bits(u_out.get())) << label << ": out";
      EXPECT_EQ(bits(f_k.get()), bits(u_k.get())) << label << ": k cache";
      EXPECT_EQ(bits(f_v.get()), bits(u_v.get())) << label << ": v cache";
      EXPECT_LE(rel_error(to_float(f_out.get()), want), 1e-2) << label << ": against the CPU";
      EXPECT_LE(rel_error(to_float(f_k.get()), k_want), 1e-2) << label << ": k cache against the CPU";
    }
  }
  // The other versions cannot: the backend runs them as two launches.
  EXPECT_FALSE(decode_attention_fuses_qk_norm_rope(2, AttentionShape{16, 8, 128, 16, 0.088f}));
  EXPECT_FALSE(decode_attention_fuses_qk_norm_rope(10, AttentionShape{16, 8, 96, 16, 0.1f}));  // v0 runs head_dim 96
}

// Backend::attention_o_proj_add_rmsnorm on the GPU at one decode sequence: decode attention (v10's kernel,
// with its qk-norm, RoPE and KV write) whose split partials o_proj merges (decode_attention_o_proj_cuda), then
// the norm adding the KV heads' shares (add_rmsnorm_partials_cuda). Against v10 with its combine kernel (the
// same bits in attention's output and in both caches), each KV head's share against its columns' products
// on the CPU from that output, and the whole against the CPU spec (qk_norm_rope_store_cpu, decode_attention_cpu,
// linear_cpu, add_rmsnorm_cpu). Cases: Qwen3-0.6B's heads (16 splits) at contexts of 1,000 and of one key (in a
// grid sized for 4,096), a padding row (context 0: zeros); 4 query heads a KV head (512 columns, two chunks a
// lane) and an output count that is not a multiple of 64; head_dim 64; the tiny test models' 2 KV heads (64
// splits: the merge in rounds of 16) with 2 and 3 query heads each, and with 4 (two chunks a lane, in rounds).
TEST(Ch04_LayersCuda, OProjMergesDecodeAttentionsSplitsAtOneSequence) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  struct Case { int heads, kv_heads, head_dim, block_size, context, grid_context, hidden; };
  const std::vector<Case> cases = {{16, 8, 128, 16, 1000, 0, 1024}, {16, 8, 128, 256, 1, 4096, 1024},
                                   {16, 8, 128, 16, 0, 1024, 1024}, {32, 8, 128, 16, 777, 0, 1000},
                                   {16, 8, 64, 16, 300, 0, 96},     {4, 2, 128, 16, 2000, 0, 64},
                                   {6, 2, 64, 48, 150, 0, 96},      {8, 2, 128, 16, 1500, 0, 200}};
  for (const Case& c : cases) {
    const int kv_dim = c.kv_heads * c.head_dim, q_dim = c.heads * c.head_dim, stride = q_dim + 2 * kv_dim;
    const int columns = c.heads / c.kv_heads * c.head_dim, max_pos = 4096;
    const AttentionShape shape{c.heads, c.kv_heads, c.head_dim, c.block_size, 1.0f / std::sqrt(float(c.head_dim))};
    const std::string what = std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " heads of " +
                             std::to_string(c.head_dim) + ", context " + std::to_string(c.context) + ", hidden " +
                             std::to_string(c.hidden);
    ASSERT_TRUE(decode_attention_o_proj_fits(kAttentionVersionDefault, 1, shape)) << what;
    // The sequence's blocks in a shuffled order; the new token at position context - 1 in its slot.
    const int width = std::max(1, (c.context + c.block_size - 1) / c.block_size);
    std::vector<int32_t> tables(static_cast<size_t>(width));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    const std::vector<int32_t> context{c.context}, positions{std::max(0, c.context - 1)},
        slots{c.context == 0 ? -1 : tables[size_t((c.context - 1) / c.block_size)] * c.block_size +
                                        (c.context - 1) % c.block_size};
    const size_t cache_elems = size_t(width) * c.block_size * kv_dim;
    std::vector<float> qkv = random_bf16_values(size_t(stride), rng, 2.0f);
    std::vector<float> k_cache = random_bf16_values(cache_elems, rng), v_cache = random_bf16_values(cache_elems, rng);
    std::vector<float> qn = random_bf16_values(size_t(c.head_dim), rng), kn = random_bf16_values(size_t(c.head_dim), rng);
    std::vector<float> W = random_bf16_values(size_t(c.hidden) * q_dim, rng, 0.05f);
    std::vector<float> residual = random_bf16_values(size_t(c.hidden), rng), norm_w = random_bf16_values(size_t(c.hidden), rng);
    std::vector<float> cos, sin;
    build_rope_table(cos, sin, max_pos, c.head_dim, 1e6);

    // The spec, on the CPU: attention, o_proj, then the residual add and the norm.
    std::vector<float> q_want = qkv, k_want = k_cache, v_want = v_cache, attn_want(static_cast<size_t>(q_dim));
    qk_norm_rope_store_cpu(q_want.data(), stride, qn.data(), kn.data(), positions.data(), cos.data(), sin.data(),
                           k_want.data(), v_want.data(), slots.data(), 1, c.heads, c.kv_heads, c.head_dim, 1e-6f);
    decode_attention_cpu(attn_want.data(), q_dim, q_want.data(), stride, k_want.data(), v_want.data(), context.data(),
                         tables.data(), width, 1, shape);
    std::vector<float> hidden_want(size_t(c.hidden)), res_want = residual, out_want(size_t(c.hidden));
    linear_cpu(hidden_want.data(), attn_want.data(), W.data(), 1, q_dim, c.hidden);
    add_rmsnorm_cpu(out_want.data(), res_want.data(), hidden_want.data(), norm_w.data(), 1, c.hidden, 1e-6f);

    const int max_ctx = c.grid_context ? c.grid_context : std::max(1, c.context);
    DeviceArray<bf16> d_qn(to_bf16(qn)), d_kn(to_bf16(kn)), d_W(to_bf16(W)), d_norm(to_bf16(norm_w));
    DeviceArray<int32_t> d_pos(positions), d_slots(slots), d_ctx(context), d_tables(tables);
    DeviceArray<float> d_cos(cos), d_sin(sin), scratch(decode_attention_scratch_bytes(1, max_ctx, shape) / sizeof(float));
    const QkNormRopeInputs qk{d_qn.ptr, d_kn.ptr, d_cos.ptr, d_sin.ptr, d_pos.ptr, d_slots.ptr, 1e-6f};
    // v10 with its combine, on fresh copies of qkv and the caches.
    DeviceArray<bf16> u_qkv(to_bf16(qkv)), u_k(to_bf16(k_cache)), u_v(to_bf16(v_cache)), u_out(static_cast<size_t>(q_dim));
    u_out.poison();
    decode_attention_fused_cuda(u_out.ptr, q_dim, u_qkv.ptr, stride, u_k.ptr, u_v.ptr, d_ctx.ptr, d_tables.ptr, width, 1,
                                max_ctx, shape, scratch.ptr, 10, qk, 0);
    scratch.poison();  // the merge must not read the first run's partials
    // The same attention with o_proj merging its splits, then the norm adding the KV heads' shares.
    DeviceArray<bf16> f_qkv(to_bf16(qkv)), f_k(to_bf16(k_cache)), f_v(to_bf16(v_cache)), f_out(static_cast<size_t>(q_dim));
    DeviceArray<bf16> d_res(to_bf16(residual)), d_normed(size_t(c.hidden));
    DeviceArray<float> partials(size_t(c.kv_heads) * c.hidden);
    f_out.poison(), partials.poison(), d_normed.poison();
    decode_attention_o_proj_cuda(partials.ptr, d_W.ptr, c.hidden, f_out.ptr, f_qkv.ptr, stride, f_k.ptr, f_v.ptr,
                                 d_ctx.ptr, d_tables.ptr, width, max_ctx, shape, scratch.ptr,
                                 kAttentionVersionDefault, qk, 0);
    const std::vector<float> shares = partials.get();
    add_rmsnorm_partials_cuda(d_normed.ptr, d_res.ptr, partials.ptr, c.kv_heads, d_norm.ptr, 1, c.hidden, 1e-6f, 0);

    EXPECT_EQ(bits(f_out.get()), bits(u_out.get())) << what << ": attention's output";
    EXPECT_EQ(bits(f_k.get()), bits(u_k.get())) << what << ": k cache";
    EXPECT_EQ(bits(f_v.get()), bits(u_v.get())) << what << ": v cache";
    EXPECT_LE(rel_error(to_float(f_out.get()), attn_want), 1e-2) << what << ": attention against the CPU";
    // Each KV head's share: its columns of o_proj times attention's output (as the GPU rounded it).
    const std::vector<float> attn = to_float(u_out.get());
    for (int g = 0; g < c.kv_heads; g++) {
      std::vector<float> want(size_t(c.hidden)), got(shares.begin() + size_t(g) * c.hidden,
                                                     shares.begin() + size_t(g + 1) * c.hidden);
      for (int o = 0; o < c.hidden; o++) {
        double sum = 0;
        for (int k = g * columns; k < (g + 1) * columns; k++) sum += double(attn[size_t(k)]) * W[size_t(o) * q_dim + k];
        want[size_t(o)] = float(sum);
      }
      EXPECT_LE(rel_error(got, want), 1e-5) << what << ": KV head " << g << "'s share";
    }
    EXPECT_LE(rel_error(to_float(d_res.get()), res_want), 1e-2) << what << ": residual against the CPU";
    EXPECT_LE(rel_error(to_float(d_normed.get()), out_want), 1e-2) << what << ": norm against the CPU";
  }
  // Where it does not run: more than one sequence, versions other than 10 and 11, a KV head's query heads
  // wider than kOProjMergeMaxColumns (512; here 8 x 128), and shapes that fall back to v0.
  const AttentionShape qwen{16, 8, 128, 16, 0.088f};
  EXPECT_TRUE(decode_attention_o_proj_fits(10, 1, qwen));
  EXPECT_FALSE(decode_attention_o_proj_fits(kAttentionVersionDefault, 2, qwen));
  EXPECT_FALSE(decode_attention_o_proj_fits(9, 1, qwen));
  EXPECT_FALSE(decode_attention_o_proj_fits(2, 1, qwen));
  EXPECT_FALSE(decode_attention_o_proj_fits(kAttentionVersionDefault, 1, AttentionShape{64, 8, 128, 16, 0.088f}));
  EXPECT_FALSE(decode_attention_o_proj_fits(kAttentionVersionDefault, 1, AttentionShape{16, 8, 96, 16, 0.1f}));
}

TEST(Ch04_LayersCuda, SiluAndMulAndGather) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  const int n = 33, inter = 200;
  std::vector<float> gu = random_bf16_values(size_t(n) * 2 * inter, rng, 2.0f);
  std::vector<float> want(size_t(n) * inter);
  silu_and_mul_cpu(want.data(), gu.data(), n, inter);
  DeviceArray<bf16> d_gu(to_bf16(gu)), d_out(want.size());
  d_out.poison();
  silu_and_mul_cuda(d_out.ptr, d_gu.ptr, n, inter, 0);
  EXPECT_LE(rel_error(to_float(d_out.get()), want), 1e-2);

  std::vector<int32_t> rows = {32, 0, 5, 5, 17};
  std::vector<float> gathered(rows.size() * 2 * inter);
  gather_rows_cpu(gathered.data(), gu.data(), rows.data(), int(rows.size()), 2 * inter);
  DeviceArray<int32_t> d_rows(rows);
  DeviceArray<bf16> d_g(gathered.size());
  d_g.poison();
  gather_rows_cuda(d_g.ptr, d_gu.ptr, d_rows.ptr, int(rows.size()), 2 * inter, 0);
  EXPECT_EQ(to_float(d_g.get()), gathered);
}

// Over more than one block of threads (m = 600, blocks of 256): the CPU's answer, rows of -1 left as they were.
TEST(Ch04_LayersCuda, TakeSampledTokensAsTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int m = 600, sampled = 97;
  std::vector<int32_t> ids(m), tokens(sampled), rows(m);
  for (int32_t& id : ids) id = int32_t(rng() % 151936);
  for (int32_t& t : tokens) t = int32_t(rng() % 151936);
  for (int32_t& r : rows) r = int32_t(rng() % (sampled + 1)) - 1;  // -1 about once in 98
  rows[0] = -1, rows[m - 1] = sampled - 1;
  DeviceArray<int32_t> d_ids(ids), d_tokens(tokens), d_rows(rows);
  std::vector<int32_t> want = ids;
  take_sampled_tokens_cpu(want.data(), tokens.data(), rows.data(), m);
  take_sampled_tokens_cuda(d_ids.ptr, d_tokens.ptr, d_rows.ptr, m, 0);
  EXPECT_EQ(d_ids.get(), want);
}

#else
TEST(Ch04_LayersCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
