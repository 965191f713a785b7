// Tests for the CPU reference of paged attention (attention_cpu.cpp), against a float64 attention
// written here from the definition: dense K/V per sequence (no cache, no block table), scores
// q.k * scale, softmax in double, bottom-right causal mask, GQA head h -> h / (heads / kv_heads).
//
//   StoreKvcache   rows land in their slots bit-exactly; slot -1 and every other slot stay poisoned
//   Prefill        block sizes 16 and 32 with ragged lengths; physical blocks in sequential, reversed,
//                  interleaved and scrambled order; varlen batches; cached prefix / chunked prefill;
//                  GQA groups 1, 2, 4, 8; the shape's scale; scores in the hundreds; q inside a qkv row
//   Decode         = the last row of the full prefill; context_len 0 writes zeros
//   Known answers  one key returns its value; equal keys return the running mean of the values;
//                  constant values per KV head reveal which KV head each query head reads
//
// Every unused cache slot, unused block-table entry and unused q column holds NaN (or -1 for block
// ids): reading anything outside the contract turns the output into NaN, or trips AddressSanitizer.
// Tolerance: each output row (num_heads * head_dim values) must satisfy |out - ref| <= 1e-5 |ref|
// (Euclidean norms). fp32 accumulation over <= 129 keys and head_dim <= 128 gives ~1e-7 here.
#include "05_attention/attention.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

using namespace nanovllm;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kTol = 1e-5;

// ---------------------------------------------------------------------------------------------------
// Inputs: test::Rng (tests/test_util.h), a fixed-seed splitmix64 of our own.
using test::Rng;
using test::random_vector;

AttentionShape make_shape(int num_heads, int num_kv_heads, int head_dim, int block_size) {
  return AttentionShape{num_heads, num_kv_heads, head_dim, block_size, 1.0f / std::sqrt(float(head_dim))};
}

// ---------------------------------------------------------------------------------------------------
// The independent reference: dense, float64, straight from the definition.

// One sequence. q: (seqlen_q, num_heads * head_dim), the queries of positions seqlen_k - seqlen_q ..
// seqlen_k - 1; k, v: (>= seqlen_k, num_kv_heads * head_dim). Returns (seqlen_q, num_heads * head_dim).
std::vector<double> reference_attention(const float* q, int seqlen_q, const float* k, const float* v, int seqlen_k,
                                        const AttentionShape& s) {
  const int q_dim = s.num_heads * s.head_dim, kv_dim = s.num_kv_heads * s.head_dim;
  const int group = s.num_heads / s.num_kv_heads;
  std::vector<double> out(size_t(seqlen_q) * q_dim, 0.0);
  std::vector<double> score(static_cast<size_t>(seqlen_k));
  for (int i = 0; i < seqlen_q; i++) {
    const int position = seqlen_k - seqlen_q + i;  // sees keys 0 .. position
    for (int h = 0; h < s.num_heads; h++) {
      const int kvh = h / group;
      double max_score = -INFINITY;
      for (int j = 0; j <= position; j++) {
        double dot = 0;
        for (int d = 0; d < s.head_dim; d++)
          dot += double(q[size_t(i) * q_dim + h * s.head_dim + d]) * double(k[size_t(j) * kv_dim + kvh * s.head_dim + d]);
        score[j] = dot * double(s.scale);
        max_score = std::max(max_score, score[j]);
      }
      double total = 0;
      for (int j = 0; j <= position; j++) total += (score[j] = std::exp(score[j] - max_score));
      for (int j = 0; j <= position; j++)
        for (int d = 0; d < s.head_dim; d++)
          out[size_t(i) * q_dim + h * s.head_dim + d] += score[j] / total * double(v[size_t(j) * kv_dim + kvh * s.head_dim + d]);
    }
  }
  return out;
}

// ||got - ref|| / ||ref|| over one row of n values.
double relative_error(const float* got, const double* ref, int n) {
  double diff = 0, norm = 0;
  for (int i = 0; i < n; i++) {
    diff += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// ---------------------------------------------------------------------------------------------------
// A paged batch: the sequences' K/V written into a NaN-poisoned cache through block tables that the
// test builds itself (slot = block_table[pos / block_size] * block_size + pos % block_size).

// One sequence's data: queries, keys and values of positions 0 .. length - 1.
struct SeqData {
  int length;
  std::vector<float> q, k, v;  // (length, q_dim), (length, kv_dim), (length, kv_dim)
};

SeqData random_seq(int length, const AttentionShape& s, Rng& rng) {
  return SeqData{length, random_vector(size_t(length) * s.num_heads * s.head_dim, rng),
                 random_vector(size_t(length) * s.num_kv_heads * s.head_dim, rng),
                 random_vector(size_t(length) * s.num_kv_heads * s.head_dim, rng)};
}

// A sequence in a step: keys 0 .. seqlen_k - 1 are in the cache, queries are the last seqlen_q of them.
struct SeqSpec {
  const SeqData* data;
  int seqlen_k;
  int seqlen_q;
};

enum class Layout { kSequential, kReversed, kInterleaved, kScrambled };
const Layout kAllLayouts[] = {Layout::kSequential, Layout::kReversed, Layout::kInterleaved, Layout::kScrambled};
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kSequential: return "sequential";
    case Layout::kReversed: return "reversed";
    case Layout::kInterleaved: return "interleaved";
    case Layout::kScrambled: return "scrambled";
  }
  return "?";
}

struct PagedBatch {
  AttentionShape shape;
  std::vector<SeqSpec> seqs;
  int num_blocks = 0, table_width = 0;
  std::vector<float> k_cache, v_cache;       // (num_blocks, block_size, num_kv_heads, head_dim)
  std::vector<int32_t> block_tables;         // (num_seqs, table_width), -1 past each sequence's blocks
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k, context_lens;
  int q_offset = 0;                          // q sits at this column of a wider row (a qkv row)
  int64_t q_stride = 0, out_stride = 0;
  std::vector<float> q;                      // (total_q, q_stride), NaN outside the q columns
  std::vector<float> decode_q;               // (num_seqs, q_stride): each sequence's last query

  int q_dim() const { return shape.num_heads * shape.head_dim; }
  int kv_dim() const { return shape.num_kv_heads * shape.head_dim; }
  int total_q() const { return cu_seqlens_q.back(); }
  int num_seqs() const { return int(seqs.size()); }
  const int32_t* table(int b) const { return block_tables.data() + size_t(b) * table_width; }
};

// Builds the cache and the inputs. `spare_blocks` unused (poisoned) blocks are mixed into the pool.
// q_pad / out_pad widen the q and out rows (q starts at column q_pad / 2).
PagedBatch make_batch(const AttentionShape& shape, std::vector<SeqSpec> seqs, Layout layout, Rng& rng,
                      int spare_blocks = 3, int q_pad = 0, int out_pad = 0) {
  PagedBatch p;
  p.shape = shape;
  p.seqs = std::move(seqs);
  const int bs = shape.block_size, n = p.num_seqs();
  std::vector<int> blocks_needed(static_cast<size_t>(n));
  for (int b = 0; b < n; b++) {
    blocks_needed[b] = (p.seqs[b].seqlen_k + bs - 1) / bs;
    p.table_width = std::max(p.table_width, blocks_needed[b]);
  }
  const int used = std::accumulate(blocks_needed.begin(), blocks_needed.end(), 0);
  p.num_blocks = used + spare_blocks;

  // Logical block order: which (sequence, block index) takes the next physical id.
  std::vector<std::pair<int, int>> order;
  if (layout == Layout::kInterleaved) {  // round robin: seq 0 block 0, seq 1 block 0, ..., seq 0 block 1
    for (int j = 0; j < p.table_width; j++)
      for (int b = 0; b < n; b++)
        if (j < blocks_needed[b]) order.emplace_back(b, j);
  } else {
    for (int b = 0; b < n; b++)
      for (int j = 0; j < blocks_needed[b]; j++) order.emplace_back(b, j);
  }
  // Physical ids handed out in that order: 1, 2, ... (block 0 and the tail stay spare), descending, or
  // a fixed-seed shuffle of every id.
  std::vector<int32_t> pool(size_t(p.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  if (layout == Layout::kReversed) std::reverse(pool.begin(), pool.end());
  if (layout == Layout::kScrambled)
    for (int i = p.num_blocks - 1; i > 0; i--) std::swap(pool[i], pool[rng.below(i + 1)]);
  const int first = (layout == Layout::kSequential || layout == Layout::kInterleaved) && spare_blocks > 0 ? 1 : 0;
  p.block_tables.assign(size_t(n) * p.table_width, -1);
  for (size_t i = 0; i < order.size(); i++)
    p.block_tables[size_t(order[i].first) * p.table_width + order[i].second] = pool[first + i];

  // The cache: NaN everywhere, then every sequence's keys 0 .. seqlen_k - 1 at their slots.
  const int kv_dim = p.kv_dim();
  p.k_cache.assign(size_t(p.num_blocks) * bs * kv_dim, kNaN);
  p.v_cache.assign(p.k_cache.size(), kNaN);
  for (int b = 0; b < n; b++) {
    const SeqSpec& s = p.seqs[b];
    for (int pos = 0; pos < s.seqlen_k; pos++) {
      const int64_t slot = int64_t(p.table(b)[pos / bs]) * bs + pos % bs;
      std::copy_n(s.data->k.begin() + size_t(pos) * kv_dim, kv_dim, p.k_cache.begin() + slot * kv_dim);
      std::copy_n(s.data->v.begin() + size_t(pos) * kv_dim, kv_dim, p.v_cache.begin() + slot * kv_dim);
    }
  }

  // Queries, packed varlen, each row inside a NaN row of q_stride values.
  const int q_dim = p.q_dim();
  p.q_offset = q_pad / 2;
  p.q_stride = q_dim + q_pad;
  p.out_stride = q_dim + out_pad;
  p.cu_seqlens_q = {0};
  p.cu_seqlens_k = {0};
  for (const SeqSpec& s : p.seqs) {
    p.cu_seqlens_q.push_back(p.cu_seqlens_q.back() + s.seqlen_q);
    p.cu_seqlens_k.push_back(p.cu_seqlens_k.back() + s.seqlen_k);
    p.context_lens.push_back(s.seqlen_k);
  }
  p.q.assign(size_t(p.total_q()) * p.q_stride, kNaN);
  p.decode_q.assign(size_t(n) * p.q_stride, kNaN);
  for (int b = 0; b < n; b++) {
    const SeqSpec& s = p.seqs[b];
    for (int i = 0; i < s.seqlen_q; i++) {
      const int pos = s.seqlen_k - s.seqlen_q + i;
      std::copy_n(s.data->q.begin() + size_t(pos) * q_dim, q_dim,
                  p.q.begin() + size_t(p.cu_seqlens_q[b] + i) * p.q_stride + p.q_offset);
    }
    if (s.seqlen_k > 0)
      std::copy_n(s.data->q.begin() + size_t(s.seqlen_k - 1) * q_dim, q_dim,
                  p.decode_q.begin() + size_t(b) * p.q_stride + p.q_offset);
  }
  return p;
}

// The guard value written into out's padding columns: it must survive every call.
constexpr float kGuard = -12345.5f;

std::vector<float> run_prefill(const PagedBatch& p) {
  std::vector<float> out(size_t(p.total_q()) * p.out_stride, kGuard);
  prefill_attention_cpu(out.data(), p.out_stride, p.q.data() + p.q_offset, p.q_stride, p.k_cache.data(),
                        p.v_cache.data(), p.cu_seqlens_q.data(), p.cu_seqlens_k.data(), p.block_tables.data(),
                        p.table_width, p.num_seqs(), p.shape);
  return out;
}

std::vector<float> run_decode(const PagedBatch& p) {
  std::vector<float> out(size_t(p.num_seqs()) * p.out_stride, kGuard);
  decode_attention_cpu(out.data(), p.out_stride, p.decode_q.data() + p.q_offset, p.q_stride, p.k_cache.data(),
                       p.v_cache.data(), p.context_lens.data(), p.block_tables.data(), p.table_width,
                       p.num_seqs(), p.shape);
  return out;
}

// The reference rows of sequence b (its seqlen_q queries against its seqlen_k keys).
std::vector<double> reference_for(const PagedBatch& p, int b) {
  const SeqSpec& s = p.seqs[b];
  const float* q = s.data->q.data() + size_t(s.seqlen_k - s.seqlen_q) * p.q_dim();
  return reference_attention(q, s.seqlen_q, s.data->k.data(), s.data->v.data(), s.seqlen_k, p.shape);
}

// Every prefill row against the reference (one assertion for all rows: a wrong kernel fails most of
// them, and the summary names the worst and the first few), and the padding columns of out untouched.
void expect_prefill_matches_reference(const PagedBatch& p, const std::vector<float>& out) {
  test::MismatchSummary rows("query rows (relative error by row)");
  for (int b = 0; b < p.num_seqs(); b++) {
    std::vector<double> ref = reference_for(p, b);
    for (int i = 0; i < p.seqs[b].seqlen_q; i++) {
      const float* row = out.data() + size_t(p.cu_seqlens_q[b] + i) * p.out_stride;
      rows.check(relative_error(row, ref.data() + size_t(i) * p.q_dim(), p.q_dim()), kTol, [&] {
        return "sequence " + std::to_string(b) + " (seqlen_k " + std::to_string(p.seqs[b].seqlen_k) + ", seqlen_q " +
               std::to_string(p.seqs[b].seqlen_q) + ") query row " + std::to_string(i);
      });
      for (int64_t c = p.q_dim(); c < p.out_stride; c++) ASSERT_EQ(row[c], kGuard) << "out padding column " << c;
    }
  }
  EXPECT_TRUE(rows.result());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// store_kvcache

TEST(Ch05_StoreKvcache, WritesRowsToTheirSlotsAndSkipsMinusOne) {
  // K and V are views into fused qkv rows: [q (4 heads) | k (2 heads) | v (2 heads)], head_dim 8.
  const int num_heads = 4, num_kv_heads = 2, head_dim = 8, block_size = 16, num_blocks = 5;
  const int kv_dim = num_kv_heads * head_dim, q_dim = num_heads * head_dim;
  const int64_t row_stride = q_dim + 2 * kv_dim;  // 64
  const int num_slots = num_blocks * block_size;   // 80
  Rng rng(501);

  // 24 tokens: distinct slots spread over every block (slot 0 and the last slot included), every
  // fourth one -1 (a CUDA graph's padding row).
  std::vector<int32_t> all_slots(num_slots);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  for (int i = num_slots - 1; i > 0; i--) std::swap(all_slots[i], all_slots[rng.below(i + 1)]);
  const int num_tokens = 24;
  std::vector<int32_t> slot_mapping(all_slots.begin(), all_slots.begin() + num_tokens);
  slot_mapping[1] = 0;
  slot_mapping[2] = num_slots - 1;
  for (int i = 3; i < num_tokens; i += 4) slot_mapping[i] = -1;
  for (int i = 3; i < num_tokens; i++)  // keep them distinct after the two forced ones
    if (slot_mapping[i] == 0 || slot_mapping[i] == num_slots - 1) slot_mapping[i] = -1;

  std::vector<float> qkv = random_vector(size_t(num_tokens) * row_stride, rng);
  // Poison: two different bit patterns, so a K written into the V cache (or the reverse) shows.
  const float k_poison = -777.25f, v_poison = 999.75f;
  std::vector<float> k_cache(size_t(num_slots) * kv_dim, k_poison), v_cache(k_cache.size(), v_poison);

  store_kvcache_cpu(k_cache.data(), v_cache.data(), qkv.data() + q_dim, qkv.data() + q_dim + kv_dim, row_stride,
                    slot_mapping.data(), num_tokens, kv_dim);

  std::vector<int> writer(num_slots, -1);  // which token owns each slot
  for (int i = 0; i < num_tokens; i++)
    if (slot_mapping[i] >= 0) writer[slot_mapping[i]] = i;
  int written = 0;
  for (int slot = 0; slot < num_slots; slot++) {
    for (int c = 0; c < kv_dim; c++) {
      const float k = k_cache[size_t(slot) * kv_dim + c], v = v_cache[size_t(slot) * kv_dim + c];
      if (writer[slot] < 0) {
        ASSERT_EQ(k, k_poison) << "slot " << slot << " was not in slot_mapping, column " << c;
        ASSERT_EQ(v, v_poison) << "slot " << slot << " was not in slot_mapping, column " << c;
      } else {
        const float* row = qkv.data() + size_t(writer[slot]) * row_stride;
        ASSERT_EQ(k, row[q_dim + c]) << "slot " << slot << " K column " << c << " (token " << writer[slot] << ")";
        ASSERT_EQ(v, row[q_dim + kv_dim + c]) << "slot " << slot << " V column " << c;
      }
    }
    written += writer[slot] >= 0;
  }
  EXPECT_EQ(written, 18);  // 24 tokens, 6 of them -1 (i = 3, 7, 11, 15, 19, 23)
}

TEST(Ch05_StoreKvcache, AllPaddingWritesNothing) {
  const int kv_dim = 16, num_slots = 32;
  std::vector<float> k_cache(size_t(num_slots) * kv_dim, 3.5f), v_cache(k_cache.size(), 4.5f);
  Rng rng(502);
  std::vector<float> k = random_vector(4 * kv_dim, rng), v = random_vector(4 * kv_dim, rng);
  std::vector<int32_t> slot_mapping = {-1, -1, -1, -1};
  store_kvcache_cpu(k_cache.data(), v_cache.data(), k.data(), v.data(), kv_dim, slot_mapping.data(), 4, kv_dim);
  for (float x : k_cache) ASSERT_EQ(x, 3.5f);
  for (float x : v_cache) ASSERT_EQ(x, 4.5f);
}

// ---------------------------------------------------------------------------------------------------
// Known answers (no reference needed)

TEST(Ch05_Attention, OneKeyReturnsItsValue) {
  // softmax over a single score is exactly 1: out = v, whatever q and k are.
  const AttentionShape shape = make_shape(4, 2, 32, 16);
  Rng rng(511);
  SeqData seq = random_seq(1, shape, rng);
  PagedBatch p = make_batch(shape, {{&seq, 1, 1}}, Layout::kScrambled, rng);
  std::vector<float> out = run_prefill(p), dec = run_decode(p);
  std::vector<float> expected;  // (num_heads, head_dim): query head h reads KV head h / 2
  for (int h = 0; h < shape.num_heads; h++)
    expected.insert(expected.end(), seq.v.begin() + (h / 2) * shape.head_dim, seq.v.begin() + (h / 2 + 1) * shape.head_dim);
  const size_t dim = size_t(shape.head_dim);
  auto where = [&](size_t i) { return "head " + std::to_string(i / dim) + " dim " + std::to_string(i % dim); };
  EXPECT_TRUE(test::all_near(out.data(), expected.data(), expected.size(), 1e-6, where)) << "prefill";
  EXPECT_TRUE(test::all_near(dec.data(), expected.data(), expected.size(), 1e-6, where)) << "decode";
}

TEST(Ch05_Attention, EqualKeysGiveTheRunningMeanOfTheValues) {
  // Every position has the same key, so every score is the same and query i averages v_0 .. v_i
  // uniformly: a check of the causal mask that needs no softmax at all.
  const AttentionShape shape = make_shape(2, 1, 16, 16);
  Rng rng(512);
  SeqData seq = random_seq(40, shape, rng);
  for (int pos = 1; pos < seq.length; pos++)
    std::copy_n(seq.k.begin(), shape.head_dim, seq.k.begin() + size_t(pos) * shape.head_dim);
  PagedBatch p = make_batch(shape, {{&seq, 40, 40}}, Layout::kReversed, rng);
  std::vector<float> out = run_prefill(p);
  for (int i = 0; i < 40; i++)
    for (int h = 0; h < 2; h++)
      for (int d = 0; d < shape.head_dim; d++) {
        double mean = 0;
        for (int j = 0; j <= i; j++) mean += seq.v[size_t(j) * shape.head_dim + d];
        mean /= (i + 1);
        ASSERT_NEAR(out[size_t(i) * 32 + h * 16 + d], mean, 1e-6) << "query " << i << " head " << h << " dim " << d;
      }
}

TEST(Ch05_Attention, GqaQueryHeadReadsKvHeadHOverGroup) {
  // Values constant per KV head (KV head j holds j + 1 everywhere): the output of query head h is then
  // exactly h / group + 1, whatever the softmax weights.
  for (int group : {1, 2, 4, 8}) {
    SCOPED_TRACE("group size " + std::to_string(group));
    const AttentionShape shape = make_shape(8, 8 / group, 16, 16);
    Rng rng(513 + group);
    SeqData seq = random_seq(21, shape, rng);
    for (int pos = 0; pos < seq.length; pos++)
      for (int j = 0; j < shape.num_kv_heads; j++)
        for (int d = 0; d < shape.head_dim; d++)
          seq.v[(size_t(pos) * shape.num_kv_heads + j) * shape.head_dim + d] = float(j + 1);
    PagedBatch p = make_batch(shape, {{&seq, 21, 21}}, Layout::kInterleaved, rng);
    std::vector<float> out = run_prefill(p), dec = run_decode(p);
    // One check per (row, query head): the prefill's 21 rows and the decode row. A failure names the KV
    // head that the query head read (its output minus 1).
    test::MismatchSummary heads("(row, query head) pairs");
    auto check_row = [&](const float* row, const std::string& name) {
      for (int h = 0; h < 8; h++) {
        double deviation = 0;  // summed over the head's dims, so that a NaN shows
        for (int d = 0; d < 16; d++) deviation += std::abs(double(row[h * 16 + d]) - double(h / group + 1));
        heads.check(deviation, 1e-4, [&] {
          std::ostringstream s;
          s << name << " head " << h << " read KV head " << row[h * 16] - 1 << ", not " << h / group;
          return s.str();
        });
      }
    };
    for (int i = 0; i < 21; i++) check_row(out.data() + size_t(i) * p.out_stride, "prefill query " + std::to_string(i));
    check_row(dec.data(), "decode");
    ASSERT_TRUE(heads.result());
  }
}

// ---------------------------------------------------------------------------------------------------
// Prefill against the float64 reference

TEST(Ch05_Prefill, BlockSizes16And32WithRaggedLengths) {
  // Lengths around the block boundaries: 1, bs - 1, bs, bs + 1, 2 bs + 1, and ragged ones.
  for (int block_size : {16, 32}) {
    const AttentionShape shape = make_shape(4, 2, 64, block_size);
    Rng rng(520 + block_size);
    for (int length : {1, block_size - 1, block_size, block_size + 1, 2 * block_size + 1, 50, 77}) {
      SCOPED_TRACE("block_size " + std::to_string(block_size) + ", length " + std::to_string(length));
      SeqData seq = random_seq(length, shape, rng);
      PagedBatch p = make_batch(shape, {{&seq, length, length}}, Layout::kScrambled, rng);
      expect_prefill_matches_reference(p, run_prefill(p));
    }
  }
}

TEST(Ch05_Prefill, PhysicalBlockOrderIsInvisible) {
  // Three sequences whose blocks are handed out in four different physical orders; the output must match
  // the reference each time (and, for this one-query-at-a-time reference, be the same bits).
  for (int block_size : {16, 32}) {
    const AttentionShape shape = make_shape(4, 2, 32, block_size);
    Rng rng(530 + block_size);
    SeqData a = random_seq(70, shape, rng), b = random_seq(33, shape, rng), c = random_seq(100, shape, rng);
    std::vector<float> first;
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(std::string("block_size ") + std::to_string(block_size) + ", layout " + layout_name(layout));
      PagedBatch p = make_batch(shape, {{&a, 70, 70}, {&b, 33, 33}, {&c, 100, 100}}, layout, rng);
      std::vector<float> out = run_prefill(p);
      expect_prefill_matches_reference(p, out);
      if (first.empty()) first = out;
      EXPECT_EQ(0, std::memcmp(first.data(), out.data(), out.size() * sizeof(float)));
    }
  }
}

TEST(Ch05_Prefill, VarlenBatchOfDifferentLengths) {
  const AttentionShape shape = make_shape(8, 4, 64, 16);
  Rng rng(540);
  const std::vector<int> lengths = {1, 16, 33, 7, 64, 90};
  std::vector<SeqData> data;
  for (int n : lengths) data.push_back(random_seq(n, shape, rng));
  std::vector<SeqSpec> specs;
  for (const SeqData& d : data) specs.push_back({&d, d.length, d.length});
  for (Layout layout : {Layout::kInterleaved, Layout::kScrambled}) {
    SCOPED_TRACE(layout_name(layout));
    PagedBatch p = make_batch(shape, specs, layout, rng);
    expect_prefill_matches_reference(p, run_prefill(p));
  }
}

TEST(Ch05_Prefill, CachedPrefixGivesTheLastRowsOfTheFullPrefill) {
  // seqlen_q < seqlen_k: the queries are the last seqlen_q positions (a prefix-cache hit), and query i
  // sees keys 0 .. seqlen_k - seqlen_q + i. Their outputs are rows seqlen_k - seqlen_q .. of the full
  // prefill of the same sequence.
  const AttentionShape shape = make_shape(4, 1, 64, 16);
  Rng rng(550);
  const int length = 70;
  SeqData seq = random_seq(length, shape, rng);
  PagedBatch full_batch = make_batch(shape, {{&seq, length, length}}, Layout::kScrambled, rng);
  std::vector<float> full = run_prefill(full_batch);
  expect_prefill_matches_reference(full_batch, full);
  for (int seqlen_q : {1, 5, 16, 38, 69}) {
    SCOPED_TRACE("seqlen_q " + std::to_string(seqlen_q));
    PagedBatch p = make_batch(shape, {{&seq, length, seqlen_q}}, Layout::kReversed, rng);
    std::vector<float> out = run_prefill(p);
    expect_prefill_matches_reference(p, out);
    for (int i = 0; i < seqlen_q; i++) {
      const float* expected = full.data() + size_t(length - seqlen_q + i) * full_batch.out_stride;
      for (int c = 0; c < p.q_dim(); c++)
        ASSERT_NEAR(out[size_t(i) * p.out_stride + c], expected[c], 1e-6f) << "row " << i << " column " << c;
    }
  }
}

TEST(Ch05_Prefill, ChunkedPrefillEqualsOneShot) {
  // A 70-token prompt computed in chunks [0, 32), [32, 48), [48, 70): each chunk sees only the keys
  // stored so far (the cache holds positions 0 .. end - 1). The chunks' rows concatenated are the
  // one-shot prefill.
  const AttentionShape shape = make_shape(4, 2, 64, 16);
  Rng rng(560);
  SeqData seq = random_seq(70, shape, rng);
  PagedBatch one_shot = make_batch(shape, {{&seq, 70, 70}}, Layout::kSequential, rng);
  std::vector<float> full = run_prefill(one_shot);
  const int bounds[] = {0, 32, 48, 70};
  for (int c = 0; c < 3; c++) {
    SCOPED_TRACE("chunk [" + std::to_string(bounds[c]) + ", " + std::to_string(bounds[c + 1]) + ")");
    PagedBatch p = make_batch(shape, {{&seq, bounds[c + 1], bounds[c + 1] - bounds[c]}}, Layout::kScrambled, rng);
    std::vector<float> out = run_prefill(p);
    expect_prefill_matches_reference(p, out);
    for (int i = 0; i < bounds[c + 1] - bounds[c]; i++)
      for (int col = 0; col < p.q_dim(); col++)
        ASSERT_NEAR(out[size_t(i) * p.out_stride + col], full[size_t(bounds[c] + i) * one_shot.out_stride + col], 1e-6f)
            << "position " << bounds[c] + i;
  }
}

TEST(Ch05_Prefill, MixedBatchOfFullCachedAndSingleTokenSequences) {
  // One step of a scheduler: a whole prompt, a prefix hit, a chunk that ends a prompt, one new token.
  const AttentionShape shape = make_shape(8, 2, 32, 32);
  Rng rng(570);
  SeqData a = random_seq(40, shape, rng), b = random_seq(50, shape, rng), c = random_seq(65, shape, rng),
          d = random_seq(33, shape, rng);
  for (Layout layout : kAllLayouts) {
    SCOPED_TRACE(layout_name(layout));
    PagedBatch p = make_batch(shape, {{&a, 40, 40}, {&b, 50, 10}, {&c, 65, 33}, {&d, 33, 1}}, layout, rng);
    expect_prefill_matches_reference(p, run_prefill(p));
  }
}

TEST(Ch05_Prefill, GqaGroupSizes1To8) {
  for (int group : {1, 2, 4, 8}) {
    SCOPED_TRACE("group size " + std::to_string(group));
    const AttentionShape shape = make_shape(8, 8 / group, 32, 16);
    Rng rng(580 + group);
    SeqData a = random_seq(45, shape, rng), b = random_seq(17, shape, rng);
    PagedBatch p = make_batch(shape, {{&a, 45, 45}, {&b, 17, 9}}, Layout::kInterleaved, rng);
    expect_prefill_matches_reference(p, run_prefill(p));
  }
}

TEST(Ch05_Prefill, QwenShapeHeadDim128) {
  // Qwen3-0.6B's attention: 16 query heads, 8 KV heads, head_dim 128.
  const AttentionShape shape = make_shape(16, 8, 128, 16);
  Rng rng(585);
  SeqData a = random_seq(37, shape, rng), b = random_seq(20, shape, rng);
  PagedBatch p = make_batch(shape, {{&a, 37, 37}, {&b, 20, 4}}, Layout::kScrambled, rng);
  expect_prefill_matches_reference(p, run_prefill(p));
}

TEST(Ch05_Prefill, ScaleComesFromTheShape) {
  // A scale other than head_dim^-0.5 (the reference uses shape.scale too): an implementation that
  // recomputes 1/sqrt(head_dim) fails.
  for (float scale : {0.05f, 0.9f}) {
    AttentionShape shape = make_shape(4, 2, 64, 16);
    shape.scale = scale;
    Rng rng(590);
    SeqData seq = random_seq(30, shape, rng);
    PagedBatch p = make_batch(shape, {{&seq, 30, 30}}, Layout::kScrambled, rng);
    expect_prefill_matches_reference(p, run_prefill(p));
  }
}

TEST(Ch05_Prefill, ScoresInTheHundredsStayFinite) {
  // q on the integer grid [-512, 512] and k on the grid k/8 in [-1, 1]: every product and partial sum
  // (multiples of 1/8 below 2^15) is exact in fp32 and the scale 1/8 is a power of two, so the scores (hundreds: exp would overflow fp32
  // past 88) are exact and the only rounding left is the softmax's. A softmax without its max
  // subtracted returns inf/inf = NaN here.
  const AttentionShape shape = make_shape(4, 2, 64, 16);  // scale = 1/8
  Rng rng(595);
  SeqData seq = random_seq(50, shape, rng);
  for (float& x : seq.q) x = std::round(x * 512);
  for (float& x : seq.k) x = std::round(x * 8) / 8;
  double max_score = 0;
  for (int i = 0; i < 50; i++)
    for (int j = 0; j <= i; j++) {
      double dot = 0;
      for (int d = 0; d < 64; d++) dot += seq.q[size_t(i) * 256 + d] * seq.k[size_t(j) * 128 + d];
      max_score = std::max(max_score, std::abs(dot) / 8);
    }
  ASSERT_GT(max_score, 200) << "the test needs scores far beyond fp32 exp's range";
  PagedBatch p = make_batch(shape, {{&seq, 50, 50}}, Layout::kScrambled, rng);
  expect_prefill_matches_reference(p, run_prefill(p));
  PagedBatch d = make_batch(shape, {{&seq, 50, 1}}, Layout::kReversed, rng);
  std::vector<float> dec = run_decode(d);
  std::vector<double> ref = reference_for(d, 0);
  EXPECT_LE(relative_error(dec.data(), ref.data(), d.q_dim()), kTol);
}

TEST(Ch05_Prefill, QueryInsideAWiderQkvRowAndWiderOutRows) {
  // q_stride and out_stride wider than num_heads * head_dim: q is a view into a qkv row (NaN around
  // it) and out's extra columns hold a guard value that must survive.
  const AttentionShape shape = make_shape(4, 2, 32, 16);
  Rng rng(600);
  SeqData a = random_seq(25, shape, rng), b = random_seq(40, shape, rng);
  const int kv_dim = shape.num_kv_heads * shape.head_dim;
  PagedBatch p = make_batch(shape, {{&a, 25, 25}, {&b, 40, 8}}, Layout::kScrambled, rng, 3,
                            /*q_pad=*/4 * kv_dim, /*out_pad=*/24);
  EXPECT_EQ(p.q_stride, 4 * 32 + 4 * kv_dim);
  expect_prefill_matches_reference(p, run_prefill(p));
}

// ---------------------------------------------------------------------------------------------------
// Decode

TEST(Ch05_Decode, EqualsTheLastRowOfTheFullPrefill) {
  // One query per sequence at position context_len - 1, all keys visible: the last row of a prefill.
  for (int block_size : {16, 32}) {
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    const AttentionShape shape = make_shape(8, 2, 64, block_size);
    Rng rng(610 + block_size);
    const std::vector<int> lengths = {1, 15, 16, 17, 64, 100, 129};
    std::vector<SeqData> data;
    for (int n : lengths) data.push_back(random_seq(n, shape, rng));
    std::vector<SeqSpec> specs;
    for (const SeqData& d : data) specs.push_back({&d, d.length, d.length});
    test::MismatchSummary rows("decode rows (relative error by row)");
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(layout_name(layout));
      PagedBatch p = make_batch(shape, specs, layout, rng, 3, /*q_pad=*/16, /*out_pad=*/8);
      std::vector<float> full = run_prefill(p), dec = run_decode(p);
      for (int b = 0; b < p.num_seqs(); b++) {
        const float* last = full.data() + size_t(p.cu_seqlens_q[b + 1] - 1) * p.out_stride;
        const float* row = dec.data() + size_t(b) * p.out_stride;
        std::vector<double> ref = reference_for(p, b);
        rows.check(relative_error(row, ref.data() + size_t(lengths[b] - 1) * p.q_dim(), p.q_dim()), kTol, [&] {
          return std::string(layout_name(layout)) + " layout, sequence " + std::to_string(b) + " (context_len " +
                 std::to_string(lengths[b]) + ")";
        });
        for (int c = 0; c < p.q_dim(); c++) ASSERT_NEAR(row[c], last[c], 1e-6f) << "sequence " << b << " column " << c;
        for (int64_t c = p.q_dim(); c < p.out_stride; c++) ASSERT_EQ(row[c], kGuard) << "out padding column " << c;
      }
    }
    EXPECT_TRUE(rows.result());
  }
}

TEST(Ch05_Decode, ContextLenZeroWritesZeros) {
  // A padding row (context_len 0, block table all -1) between real ones: its output is zeros, even
  // though out held NaN before; the neighbours are unaffected.
  const AttentionShape shape = make_shape(4, 2, 32, 16);
  Rng rng(620);
  SeqData a = random_seq(20, shape, rng), c = random_seq(47, shape, rng);
  SeqData empty{0, {}, {}, {}};
  PagedBatch p = make_batch(shape, {{&a, 20, 1}, {&empty, 0, 0}, {&c, 47, 1}, {&empty, 0, 0}}, Layout::kScrambled, rng);
  for (int j = 0; j < p.table_width; j++) ASSERT_EQ(p.table(1)[j], -1);
  std::vector<float> out(size_t(p.num_seqs()) * p.out_stride, kNaN);
  decode_attention_cpu(out.data(), p.out_stride, p.decode_q.data(), p.q_stride, p.k_cache.data(), p.v_cache.data(),
                       p.context_lens.data(), p.block_tables.data(), p.table_width, p.num_seqs(), shape);
  for (int b : {1, 3})
    for (int c = 0; c < p.q_dim(); c++) ASSERT_EQ(out[size_t(b) * p.out_stride + c], 0.0f) << "row " << b << " col " << c;
  for (int b : {0, 2}) {
    std::vector<double> ref = reference_for(p, b);
    EXPECT_LE(relative_error(out.data() + size_t(b) * p.out_stride, ref.data(), p.q_dim()), kTol) << "row " << b;
  }
}

// ---------------------------------------------------------------------------------------------------
// The engine's sequence of calls: store_kvcache from qkv rows, then attention, chunk by chunk.

TEST(Ch05_Attention, StoreThenAttendChunkedPrefillAndDecodeSteps) {
  // Two sequences share a cache with interleaved blocks. Step 1 prefills A[0, 20) and B[0, 35); step 2
  // prefills A[20, 45) (a chunk after cached keys); then three decode steps append one token to each.
  // Every step stores K/V from fused qkv rows through slot_mapping (the test computes the slots), then
  // attends with q read from the same rows. Every output row is checked against the dense reference.
  const AttentionShape shape = make_shape(4, 2, 32, 16);
  const int q_dim = 128, kv_dim = 64, row_stride = q_dim + 2 * kv_dim;
  Rng rng(630);
  SeqData a = random_seq(48, shape, rng), b = random_seq(38, shape, rng);
  const int table_width = 4, num_blocks = 9;
  const std::vector<int32_t> tables = {7, 2, 5, 0,   // A: 48 tokens, 3 blocks (+ one unused entry)
                                       1, 8, 4, -1};  // B: 38 tokens, 3 blocks
  std::vector<float> k_cache(size_t(num_blocks) * 16 * kv_dim, kNaN), v_cache(k_cache.size(), kNaN);
  const SeqData* seqs[2] = {&a, &b};
  auto slot_of = [&](int s, int pos) { return tables[size_t(s) * table_width + pos / 16] * 16 + pos % 16; };

  // One step: sequence s computes positions [begin[s], end[s]).
  auto step = [&](const int begin[2], const int end[2], bool decode) {
    std::vector<float> qkv;
    std::vector<int32_t> slots, cu_q = {0}, cu_k = {0}, context;
    for (int s = 0; s < 2; s++) {
      for (int pos = begin[s]; pos < end[s]; pos++) {
        const SeqData& d = *seqs[s];
        qkv.insert(qkv.end(), d.q.begin() + size_t(pos) * q_dim, d.q.begin() + size_t(pos + 1) * q_dim);
        qkv.insert(qkv.end(), d.k.begin() + size_t(pos) * kv_dim, d.k.begin() + size_t(pos + 1) * kv_dim);
        qkv.insert(qkv.end(), d.v.begin() + size_t(pos) * kv_dim, d.v.begin() + size_t(pos + 1) * kv_dim);
        slots.push_back(slot_of(s, pos));
      }
      cu_q.push_back(cu_q.back() + end[s] - begin[s]);
      cu_k.push_back(cu_k.back() + end[s]);
      context.push_back(end[s]);
    }
    const int n = int(slots.size());
    test::MismatchSummary rows("output rows (relative error by row)");
    store_kvcache_cpu(k_cache.data(), v_cache.data(), qkv.data() + q_dim, qkv.data() + q_dim + kv_dim, row_stride,
                      slots.data(), n, kv_dim);
    std::vector<float> out(size_t(n) * q_dim, kNaN);
    if (decode)
      decode_attention_cpu(out.data(), q_dim, qkv.data(), row_stride, k_cache.data(), v_cache.data(), context.data(),
                           tables.data(), table_width, 2, shape);
    else
      prefill_attention_cpu(out.data(), q_dim, qkv.data(), row_stride, k_cache.data(), v_cache.data(), cu_q.data(),
                            cu_k.data(), tables.data(), table_width, 2, shape);
    for (int s = 0; s < 2; s++) {
      const SeqData& d = *seqs[s];
      const int seqlen_q = end[s] - begin[s];
      std::vector<double> ref =
          reference_attention(d.q.data() + size_t(begin[s]) * q_dim, seqlen_q, d.k.data(), d.v.data(), end[s], shape);
      for (int i = 0; i < seqlen_q; i++)
        rows.check(relative_error(out.data() + size_t(cu_q[s] + i) * q_dim, ref.data() + size_t(i) * q_dim, q_dim), kTol,
                   [&] { return "sequence " + std::to_string(s) + " position " + std::to_string(begin[s] + i); });
    }
    EXPECT_TRUE(rows.result()) << (decode ? "decode" : "prefill") << " step, positions [" << begin[0] << ", " << end[0]
                               << ") and [" << begin[1] << ", " << end[1] << ")";
  };
  {
    const int begin[2] = {0, 0}, end[2] = {20, 35};
    step(begin, end, false);
  }
  {
    const int begin[2] = {20, 35}, end[2] = {45, 35};  // B computes nothing this step
    step(begin, end, false);
  }
  for (int t = 0; t < 3; t++) {
    const int begin[2] = {45 + t, 35 + t}, end[2] = {46 + t, 36 + t};
    step(begin, end, true);
  }
}

// ---------------------------------------------------------------------------------------------------
// The CUDA kernel versions: their table and the rule that picks the kernel that runs (plain C++, so
// tested without a GPU; the kernels themselves are tested in attention_cuda_test.cpp).

TEST(Ch05_Versions, TableIsNumberedInOrderAndEachFileExists) {
  const std::vector<AttentionVersion>& table = attention_versions();
  ASSERT_GE(table.size(), 6u);
  for (size_t i = 0; i < table.size(); i++) {
    const AttentionVersion& v = table[i];
    EXPECT_EQ(v.number, int(i));
    const std::string name = v.name, prefix = "v" + std::to_string(i) + "_";
    EXPECT_EQ(name.rfind(prefix, 0), 0u) << name << " should start with " << prefix;
    EXPECT_TRUE(v.prefill || v.decode) << name << " implements no phase";
    EXPECT_GT(std::string(v.idea).size(), 10u) << name;
    const std::string file = std::string(NANOVLLM_SOURCE_DIR) + "/05_attention/" + name + ".cu";
    // A version holds its kernel, or (v10, v11) launches an earlier version's kernel with a new policy, and
    // then names that version's file.
    const std::string text = read_file(file);
    bool reuses_earlier = false;
    for (size_t j = 0; j < i; j++) reuses_earlier |= text.find(std::string(table[j].name) + ".cu") != std::string::npos;
    EXPECT_TRUE(text.find("__global__") != std::string::npos || reuses_earlier)
        << file << " holds no kernel and names no earlier version whose kernel it launches";
    const std::string readme = read_file(std::string(NANOVLLM_SOURCE_DIR) + "/05_attention/README.md");
    const std::string notes = read_file(std::string(NANOVLLM_SOURCE_DIR) + "/05_attention/NOTES.md");
    EXPECT_NE(readme.find(name), std::string::npos) << "README.md does not walk " << name;
    EXPECT_NE(notes.find(name), std::string::npos) << "NOTES.md has no row for " << name;
  }
  EXPECT_TRUE(table[0].prefill && table[0].decode) << "v0 is every phase's fallback";
  EXPECT_TRUE(table[size_t(kDefaultPrefillVersion)].prefill);
  EXPECT_TRUE(table[size_t(kDefaultDecodeVersion)].decode);
}

TEST(Ch05_Versions, DefaultAndPhaseFallbacks) {
  const AttentionShape qwen = make_shape(16, 8, 128, 256);
  const auto prefill = AttentionPhase::Prefill, decode = AttentionPhase::Decode;
  EXPECT_EQ(attention_version_for(prefill, kAttentionVersionDefault, qwen), kDefaultPrefillVersion);
  EXPECT_EQ(attention_version_for(decode, kAttentionVersionDefault, qwen), kDefaultDecodeVersion);
  for (const AttentionVersion& v : attention_versions()) {
    // A version runs in the phases it implements; in the others the phase's default runs.
    EXPECT_EQ(attention_version_for(prefill, v.number, qwen), v.prefill ? v.number : kDefaultPrefillVersion) << v.name;
    EXPECT_EQ(attention_version_for(decode, v.number, qwen), v.decode ? v.number : kDefaultDecodeVersion) << v.name;
  }
}

TEST(Ch05_Versions, ShapesTheFastKernelsLackRunV0) {
  const auto prefill = AttentionPhase::Prefill, decode = AttentionPhase::Decode;
  for (int head_dim : {32, 80, 96, 256}) {
    const AttentionShape s = make_shape(8, 2, head_dim, 16);
    for (int requested : {kAttentionVersionDefault, 1, 2, 5, 6}) {
      EXPECT_EQ(attention_version_for(prefill, requested, s), 0) << "head_dim " << head_dim << " v" << requested;
      EXPECT_EQ(attention_version_for(decode, requested, s), 0) << "head_dim " << head_dim << " v" << requested;
    }
  }
  // Decode blocks hold at most 8 query heads per KV head; prefill tiles take any group.
  const AttentionShape mqa16 = make_shape(16, 1, 128, 16), mqa8 = make_shape(8, 1, 64, 16);
  EXPECT_EQ(attention_version_for(decode, kAttentionVersionDefault, mqa16), 0);
  EXPECT_EQ(attention_version_for(decode, kAttentionVersionDefault, mqa8), kDefaultDecodeVersion);
  EXPECT_EQ(attention_version_for(prefill, kAttentionVersionDefault, mqa16), kDefaultPrefillVersion);
  EXPECT_EQ(attention_version_for(prefill, 1, mqa16), 1);
  // v9-v11 copy 16-key tiles that must not cross a KV block: at a block of 8 tokens they would read the
  // next physical block's keys. v5 and v12 handle a ragged block themselves; v1-v8 find every key's slot.
  const AttentionShape blocks_of_8 = make_shape(16, 8, 128, 8);
  for (int requested : {kAttentionVersionDefault, 9, 10, 11})
    EXPECT_EQ(attention_version_for(decode, requested, blocks_of_8), 0) << "v" << requested;
  EXPECT_EQ(attention_version_for(decode, 6, blocks_of_8), 6);
  EXPECT_EQ(attention_version_for(prefill, kAttentionVersionDefault, blocks_of_8), kDefaultPrefillVersion);
}

TEST(Ch05_Versions, UnknownVersionsAndHeadDimsAreErrors) {
  const AttentionShape s = make_shape(8, 2, 128, 16);
  const int past_end = int(attention_versions().size());
  EXPECT_NE(test::error_of([&] { attention_version_for(AttentionPhase::Decode, past_end, s); })
                .find("does not exist"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { attention_version_for(AttentionPhase::Prefill, -2, s); }), "");
  EXPECT_NE(test::error_of([&] { attention_version_for(AttentionPhase::Prefill, 0, make_shape(2, 1, 512, 16)); })
                .find("head_dim 512"),
            std::string::npos);
  // A group count of 0 divided by zero (SIGFPE); heads not a multiple of the KV heads gave a truncated group.
  EXPECT_EQ(test::error_of([&] { attention_version_for(AttentionPhase::Decode, 0, make_shape(8, 0, 128, 16)); }),
            "attention: 8 query heads do not make groups of 0 KV heads");
  EXPECT_EQ(test::error_of([&] { attention_version_for(AttentionPhase::Decode, 0, make_shape(8, 3, 128, 16)); }),
            "attention: 8 query heads do not make groups of 3 KV heads");
}

// The phases of each version, as README.md walks them and NOTES.md tabulates them: v0 and v1 run both, v5 and v12
// (tensor-core FlashAttention-2) prefill only, v2-v4 and v6-v11 (split-K and what builds on it) decode only.
TEST(Ch05_Versions, EachVersionRunsThePhasesItsChapterSays) {
  const std::vector<AttentionVersion>& table = attention_versions();
  ASSERT_EQ(table.size(), 13u);
  for (const AttentionVersion& v : table) {
    const bool both = v.number <= 1, prefill_only = v.number == 5 || v.number == 12;
    EXPECT_EQ(v.prefill, both || prefill_only) << v.name;
    EXPECT_EQ(v.decode, !prefill_only) << v.name;
  }
}

// v1-v8 find every key's slot one by one, so any block size suits them; only v9-v11 need blocks of whole 16-key tiles
// (attention_versions.cpp). At a block of 8 tokens every decode version up to 8 runs as asked.
TEST(Ch05_Versions, DecodeVersionsBeforeV9TakeAnyBlockSize) {
  const AttentionShape blocks_of_8 = make_shape(16, 8, 128, 8);
  for (int requested : {1, 2, 3, 4, 6, 7, 8})
    EXPECT_EQ(attention_version_for(AttentionPhase::Decode, requested, blocks_of_8), requested) << "v" << requested;
}

// A head_dim below 1 and a KV block of fewer than 1 token are shapes no kernel takes: errors naming them, never a
// version picked for them (v0 "takes any shape", but not an empty one).
TEST(Ch05_Versions, AnEmptyHeadOrBlockIsAnError) {
  EXPECT_EQ(test::error_of([] { attention_version_for(AttentionPhase::Prefill, 0, make_shape(2, 1, 0, 16)); }),
            "head_dim 0 is not supported by the CUDA attention kernels (1 to 256)");
  EXPECT_EQ(test::error_of([] { attention_version_for(AttentionPhase::Decode, 0, make_shape(2, 1, 64, 0)); }),
            "attention: a KV block of 0 tokens");
}
