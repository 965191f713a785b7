// Runs the kernels of 05_attention in the emulator (emu_runtime.h) against the CPU reference. The launch
// grids below repeat those of the launch_v* functions by hand: keep them in step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "05_attention/kernels.cuh"
#include "05_attention/gqa_tile.cuh"

namespace nanovllm {
void emu_v0(const AttentionParams&);
void emu_v1(const AttentionParams&, int);
void emu_v2(const AttentionParams&, int);
void emu_v3(const AttentionParams&, int);
void emu_v4(const AttentionParams&, int);
void emu_v5(const AttentionParams&);
void emu_v6(const AttentionParams&, int);
void emu_combine(const AttentionParams&);
}
using namespace nanovllm;

static int failures = 0;

float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }
std::vector<float> rnd(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(d(rng));
  return v;
}
std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> o(v.size());
  for (size_t i = 0; i < v.size(); i++) o[i] = __float2bfloat16(v[i]);
  return o;
}
double rel_error(const std::vector<bf16>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); i++) {
    float g = __bfloat162float(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += double(g - want[i]) * (g - want[i]);
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Problem {
  AttentionShape s;
  int num_blocks = 0, width = 0;
  std::vector<float> k, v;
  std::vector<int32_t> bt;
};
Problem make_problem(AttentionShape s, const std::vector<int>& lengths, std::mt19937& rng) {
  Problem p{s};
  for (int len : lengths) p.num_blocks += (len + s.block_size - 1) / s.block_size, p.width = std::max(p.width, (len + s.block_size - 1) / s.block_size);
  p.num_blocks += 3;
  size_t elems = size_t(p.num_blocks) * s.block_size * s.num_kv_heads * s.head_dim;
  p.k = rnd(elems, rng), p.v = rnd(elems, rng);
  std::vector<int32_t> pool(size_t(p.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  p.bt.assign(lengths.size() * std::max(p.width, 1), -1);
  size_t next = 0;
  for (size_t b = 0; b < lengths.size(); b++)
    for (int i = 0; i < (lengths[b] + s.block_size - 1) / s.block_size; i++) p.bt[b * p.width + i] = pool[next++];
  return p;
}
AttentionShape shape_of(int h, int kv, int d, int bs) { return {h, kv, d, bs, float(1.0 / std::sqrt(double(d)))}; }

void grid_run(dim3 grid, int threads, size_t smem, const std::function<void()>& body) {
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++)
        emu::run_block(body, make_uint3(x, y, z), make_uint3(grid.x, grid.y, grid.z), threads, smem);
}

AttentionParams base_params(const Problem& pr, bf16* out, int64_t out_stride, const bf16* q, int64_t q_stride,
                            const bf16* k, const bf16* v, const int32_t* bt) {
  AttentionParams p{};
  p.out = out, p.out_stride = out_stride, p.q = q, p.q_stride = q_stride, p.k_cache = k, p.v_cache = v;
  p.block_tables = bt, p.block_table_width = pr.width;
  p.num_heads = pr.s.num_heads, p.num_kv_heads = pr.s.num_kv_heads, p.head_dim = pr.s.head_dim, p.block_size = pr.s.block_size;
  p.scale = pr.s.scale, p.scale_log2 = pr.s.scale * 1.4426950408889634f;
  return p;
}

void check_prefill(AttentionShape s, std::vector<int> sq, std::vector<int> sk, std::mt19937& rng, std::vector<int> versions) {
  Problem pr = make_problem(s, sk, rng);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (size_t b = 0; b < sq.size(); b++) cu_q.push_back(cu_q.back() + sq[b]), cu_k.push_back(cu_k.back() + sk[b]);
  const int T = cu_q.back(), out_dim = s.num_heads * s.head_dim, q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  std::vector<float> q = rnd(size_t(T) * q_stride, rng), want(size_t(T) * out_dim);
  prefill_attention_cpu(want.data(), out_dim, q.data(), q_stride, pr.k.data(), pr.v.data(), cu_q.data(), cu_k.data(),
                        pr.bt.data(), pr.width, int(sq.size()), s);
  std::vector<bf16> qb = to_bf16(q), kb = to_bf16(pr.k), vb = to_bf16(pr.v);
  const int max_q = *std::max_element(sq.begin(), sq.end()), G = s.num_heads / s.num_kv_heads, B = int(sq.size());
  for (int ver : versions) {
    std::vector<bf16> out(want.size(), __float2bfloat16(NAN));
    AttentionParams p = base_params(pr, out.data(), out_dim, qb.data(), q_stride, kb.data(), vb.data(), pr.bt.data());
    p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
    if (ver == 0) grid_run(dim3(max_q, s.num_heads, B), 32, 0, [&] { emu_v0(p); });
    else if (ver == 1) grid_run(dim3((max_q * G + 7) / 8, s.num_kv_heads, B), 128, 0, [&] { emu_v1(p, 8); });
    else if (ver == 5) grid_run(dim3((max_q * G + 63) / 64, s.num_kv_heads, B), 128, 5 * 64 * s.head_dim * 2, [&] { emu_v5(p); });
    double e = rel_error(out, want);
    bool ok = e <= 1e-2;
    failures += !ok;
    std::printf("%s prefill v%d heads %d/%d dim %d block %d q %s: rel %.2e\n", ok ? "ok  " : "FAIL", ver, s.num_heads,
                s.num_kv_heads, s.head_dim, s.block_size, std::to_string(T).c_str(), e);
  }
}

int partition_size(int num_seqs, const AttentionShape& s) {
  const int work = num_seqs * s.num_kv_heads;
  if (work >= 1024) return 512;
  if (work >= 256) return 256;
  if (work >= 64) return 128;
  return 64;
}

void check_decode(AttentionShape s, std::vector<int> ctx, std::mt19937& rng, std::vector<int> versions, int grid_ctx = 0) {
  Problem pr = make_problem(s, ctx, rng);
  const int B = int(ctx.size()), out_dim = s.num_heads * s.head_dim, q_stride = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  std::vector<float> q = rnd(size_t(B) * q_stride, rng), want(size_t(B) * out_dim);
  decode_attention_cpu(want.data(), out_dim, q.data(), q_stride, pr.k.data(), pr.v.data(), ctx.data(), pr.bt.data(), pr.width, B, s);
  std::vector<bf16> qb = to_bf16(q), kb = to_bf16(pr.k), vb = to_bf16(pr.v);
  const int max_ctx = grid_ctx ? grid_ctx : std::max(1, *std::max_element(ctx.begin(), ctx.end()));
  const int G = s.num_heads / s.num_kv_heads, rows = decode_rows(G);
  for (int ver : versions) {
    std::vector<bf16> out(want.size(), __float2bfloat16(NAN));
    AttentionParams p = base_params(pr, out.data(), out_dim, qb.data(), q_stride, kb.data(), vb.data(), pr.bt.data());
    p.context_lens = ctx.data();
    p.partition_size = partition_size(B, s);
    p.max_partitions = std::max(1, (max_ctx + p.partition_size - 1) / p.partition_size);
    size_t entries = size_t(B) * s.num_heads * p.max_partitions;
    std::vector<float> scratch(entries * (s.head_dim + 2), NAN);
    p.part_m = scratch.data(), p.part_l = scratch.data() + entries, p.part_O = scratch.data() + 2 * entries;
    dim3 split(p.max_partitions, s.num_kv_heads, B);
    if (ver == 0) grid_run(dim3(1, s.num_heads, B), 32, 0, [&] { emu_v0(p); });
    else if (ver == 1) grid_run(dim3(1, s.num_kv_heads, B), 128, 0, [&] { emu_v1(p, rows); });
    else if (ver == 2) grid_run(split, 128, 0, [&] { emu_v2(p, rows); });
    else if (ver == 3) grid_run(split, 128, 0, [&] { emu_v3(p, rows); });
    else if (ver == 4) grid_run(split, 128, 0, [&] { emu_v4(p, rows); });
    else if (ver == 6) grid_run(split, 128, 4 * 2 * (4 * (32 / (s.head_dim / 8)) * 4) * s.head_dim * 2, [&] { emu_v6(p, rows); });
    if (ver >= 2) grid_run(dim3(s.num_heads, B, 1), s.head_dim, 0, [&] { emu_combine(p); });
    double e = rel_error(out, want);
    bool ok = e <= 1e-2;
    failures += !ok;
    std::printf("%s decode v%d heads %d/%d dim %d block %d B %d: rel %.2e\n", ok ? "ok  " : "FAIL", ver, s.num_heads,
                s.num_kv_heads, s.head_dim, s.block_size, B, e);
  }
}

int main(int argc, char** argv) {
  std::mt19937 rng(1);
  const std::string what = argc > 1 ? argv[1] : "all";
  if (what == "quick") {
    check_prefill(shape_of(4, 2, 128, 16), {1, 70}, {1, 150}, rng, {5});
    check_prefill(shape_of(6, 3, 64, 48), {40}, {100}, rng, {5});
    check_decode(shape_of(4, 2, 128, 48), {1, 300}, rng, {6});
    check_prefill(shape_of(2, 1, 64, 16), {70}, {400}, rng, {5});
  }
  if (what == "all" || what == "prefill") {
    for (int block : {16, 48, 256}) {
      check_prefill(shape_of(4, 2, 128, block), {1, 17, 100}, {1, 17, 100}, rng, {0, 1, 5});
      check_prefill(shape_of(6, 2, 64, block), {5, 40, 1}, {69, 40, 130}, rng, {0, 1, 5});
      check_prefill(shape_of(8, 1, 128, block), {21, 3}, {21, 90}, rng, {5});
      check_prefill(shape_of(16, 1, 64, block), {37, 2}, {37, 150}, rng, {5});
      check_prefill(shape_of(8, 8, 64, block), {50, 129}, {50, 129}, rng, {5});
      check_prefill(shape_of(8, 2, 128, block), {50, 70}, {80, 118}, rng, {5});
    }
    check_prefill(shape_of(4, 2, 128, 16), {150}, {400}, rng, {5});
    check_prefill(shape_of(4, 2, 96, 16), {9, 40}, {30, 40}, rng, {0});
  }
  if (what == "all" || what == "decode") {
    for (int block : {16, 48, 256}) {
      check_decode(shape_of(4, 2, 128, block), {1, 17, 300, 700}, rng, {0, 1, 2, 3, 4, 6});
      check_decode(shape_of(6, 2, 64, block), {513, 64, 65}, rng, {2, 6});
      check_decode(shape_of(32, 8, 128, block), {257, 1}, rng, {6});
      check_decode(shape_of(8, 1, 128, block), {99, 300}, rng, {2, 4, 6});
      check_decode(shape_of(8, 8, 64, block), {100, 7}, rng, {6});
    }
    check_decode(shape_of(16, 8, 128, 16), {5, 0, 300, 0}, rng, {0, 1, 2, 6}, 4096);
  }
  const auto& st = emu::stats();
  std::printf("ldmatrix phases %ld, conflicted %ld; mma %ld; copies never completed %ld\n", st.ldmatrix_phases,
              st.ldmatrix_conflicted_phases, st.mma, st.uncompleted_copies);
  std::printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
  return failures != 0;
}
