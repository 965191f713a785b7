// BlockManager: allocation, prefix-cache hits (and the last-block rule), lazy eviction, stale hashes,
// decode growth. Block size 16 keeps the token lists short; the rules do not depend on it.
#include "03_block_manager/block_manager.h"

#include <gtest/gtest.h>

#include <numeric>

using namespace nanovllm;

namespace {

constexpr int kBS = 16;

std::vector<int32_t> iota_tokens(int n, int32_t start = 0) {
  std::vector<int32_t> v(size_t(n), 0);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Sequence make_seq(int64_t id, std::vector<int32_t> tokens) {
  SamplingParams params;
  return Sequence(id, std::move(tokens), params, 0, kBS);
}

// What one step does to a sequence's cache state: compute n tokens, then postprocess's bookkeeping.
void compute(BlockManager& bm, Sequence& seq, int n) {
  seq.num_scheduled_tokens = n;
  bm.hash_blocks(seq);
  seq.num_cached_tokens += n;
  seq.num_scheduled_tokens = 0;
}

// Allocates (with whatever the prefix cache offers) and computes the whole prompt.
int prefill(BlockManager& bm, Sequence& seq) {
  int hits = bm.can_allocate(seq);
  EXPECT_GE(hits, 0);
  bm.allocate(seq, hits);
  compute(bm, seq, seq.num_tokens() - seq.num_cached_tokens);
  return hits;
}

}  // namespace

TEST(Ch03_BlockManager, AllocatesCeilTokensOverBlockSizeInFifoOrder) {
  BlockManager bm(10, kBS);
  Sequence s = make_seq(0, iota_tokens(40));  // 40 tokens -> 3 blocks (16 + 16 + 8)
  EXPECT_EQ(s.num_blocks(), 3);
  EXPECT_EQ(s.last_block_num_tokens(), 8);
  EXPECT_EQ(bm.can_allocate(s), 0);
  bm.allocate(s, 0);
  EXPECT_EQ(s.block_table, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.num_cached_tokens, 0);
  EXPECT_EQ(bm.num_free_blocks(), 7);
  for (int id : s.block_table) EXPECT_EQ(bm.block(id).ref_count, 1);
}

TEST(Ch03_BlockManager, RefusesWhenFreeBlocksRunShort) {
  BlockManager bm(2, kBS);
  Sequence s = make_seq(0, iota_tokens(33));  // 3 blocks
  EXPECT_EQ(bm.can_allocate(s), -1);
}

TEST(Ch03_BlockManager, OnlyFullComputedBlocksAreHashed) {
  BlockManager bm(10, kBS);
  Sequence s = make_seq(0, iota_tokens(40));
  bm.allocate(s, 0);
  compute(bm, s, 20);  // a chunk: block 0 full, block 1 partly computed
  EXPECT_TRUE(bm.block(s.block_table[0]).has_hash);
  EXPECT_FALSE(bm.block(s.block_table[1]).has_hash);
  compute(bm, s, 20);  // the rest: block 1 full, block 2 partial
  EXPECT_TRUE(bm.block(s.block_table[1]).has_hash);
  EXPECT_FALSE(bm.block(s.block_table[2]).has_hash);
  // The chain: block 1's hash is over block 0's hash plus its own tokens.
  uint64_t h0 = BlockManager::compute_hash(s.block(0), kBS, false, 0);
  EXPECT_EQ(bm.block(s.block_table[0]).hash, h0);
  EXPECT_EQ(bm.block(s.block_table[1]).hash, BlockManager::compute_hash(s.block(1), kBS, true, h0));
}

TEST(Ch03_BlockManager, SharedPrefixHitsInUseBlocks) {
  BlockManager bm(10, kBS);
  std::vector<int32_t> prefix = iota_tokens(32);
  Sequence a = make_seq(0, concat(prefix, iota_tokens(5, 1000)));  // 37 tokens, 3 blocks
  EXPECT_EQ(prefill(bm, a), 0);
  Sequence b = make_seq(1, concat(prefix, iota_tokens(9, 2000)));  // same 2 leading blocks, other tail
  // Two hits on blocks in use: only the tail block is new, so 1 free block would be enough.
  EXPECT_EQ(bm.can_allocate(b), 2);
  bm.allocate(b, 2);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_NE(b.block_table[2], a.block_table[2]);
  EXPECT_EQ(bm.block(a.block_table[0]).ref_count, 2);
  EXPECT_EQ(b.num_cached_tokens, 32);
  EXPECT_EQ(b.num_prefix_hit_blocks, 2);
  EXPECT_EQ(bm.total_hit_blocks(), 2);
  EXPECT_EQ(bm.num_free_blocks(), 10 - 4);
}

TEST(Ch03_BlockManager, HitsStopAtFirstMiss) {
  BlockManager bm(10, kBS);
  Sequence a = make_seq(0, iota_tokens(50));
  prefill(bm, a);
  std::vector<int32_t> t = iota_tokens(50);
  t[20] = 9999;  // block 1 differs, so block 2 cannot hit either (its chained hash differs)
  Sequence b = make_seq(1, t);
  EXPECT_EQ(bm.can_allocate(b), 1);
}

TEST(Ch03_BlockManager, LastBlockNeverCountsEvenWhenFullAndCached) {
  BlockManager bm(10, kBS);
  Sequence a = make_seq(0, iota_tokens(48));  // exactly 3 full blocks, all hashed after prefill
  prefill(bm, a);
  for (int id : a.block_table) EXPECT_TRUE(bm.block(id).has_hash);
  Sequence b = make_seq(1, iota_tokens(48));  // the identical prompt
  // Full hit would leave nothing to compute (nano-vllm #144): blocks 0-1 hit, block 2 is recomputed.
  EXPECT_EQ(bm.can_allocate(b), 2);
  bm.allocate(b, 2);
  EXPECT_EQ(b.num_cached_tokens, 32);
  EXPECT_EQ(b.num_tokens() - b.num_cached_tokens, 16);
}

TEST(Ch03_BlockManager, FreedBlocksStayHitsUntilReused) {
  BlockManager bm(4, kBS);
  Sequence a = make_seq(0, iota_tokens(40));  // blocks 0,1 hashed; 2 partial
  prefill(bm, a);
  std::vector<int> a_blocks = a.block_table;
  bm.deallocate(a);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_TRUE(a.block_table.empty());
  EXPECT_EQ(a.num_cached_tokens, 0);

  Sequence b = make_seq(1, iota_tokens(40));
  // Hits on free blocks do not lower the number of free blocks needed: 3 needed, 4 free.
  EXPECT_EQ(bm.can_allocate(b), 2);
  bm.allocate(b, 2);
  EXPECT_EQ(b.block_table[0], a_blocks[0]);
  EXPECT_EQ(b.block_table[1], a_blocks[1]);
  EXPECT_EQ(bm.block(a_blocks[0]).ref_count, 1);
  EXPECT_EQ(bm.num_free_blocks(), 1);
  // Taken back from the free queue, those blocks are in use again: a third request with the same prefix
  // shares them for free and needs only its own tail block, the 1 left.
  Sequence c = make_seq(2, iota_tokens(33));
  EXPECT_EQ(bm.can_allocate(c), 2);
  // Preempted and allocated again (as the scheduler recomputes it), b hits the same 2 blocks once more:
  // its counter sums the hits of every allocation, 2 + 2.
  compute(bm, b, b.num_tokens() - b.num_cached_tokens);
  bm.deallocate(b);
  bm.allocate(b, bm.can_allocate(b));
  EXPECT_EQ(b.num_cached_tokens, 32);
  EXPECT_EQ(b.num_prefix_hit_blocks, 4);
  EXPECT_EQ(bm.total_hit_blocks(), 4);
}

TEST(Ch03_BlockManager, HitOnFreeBlocksStillNeedsFreeBlocks) {
  BlockManager bm(3, kBS);
  Sequence a = make_seq(0, iota_tokens(40));
  prefill(bm, a);
  bm.deallocate(a);
  Sequence filler = make_seq(1, iota_tokens(10, 500));  // takes the oldest free block: a's tail, block 2
  prefill(bm, filler);
  EXPECT_EQ(filler.block_table, std::vector<int>{2});
  Sequence b = make_seq(2, iota_tokens(40));  // 2 hits on free blocks + 1 new = 3 > 2 free
  EXPECT_EQ(bm.can_allocate(b), -1);
}

TEST(Ch03_BlockManager, DeallocateFreesTailFirst) {
  BlockManager bm(3, kBS);
  Sequence a = make_seq(0, iota_tokens(40));
  prefill(bm, a);  // blocks 0, 1, 2
  bm.deallocate(a);  // free queue now 2, 1, 0: the prefix survives longest
  Sequence b = make_seq(1, iota_tokens(16, 700));
  bm.allocate(b, bm.can_allocate(b));
  EXPECT_EQ(b.block_table, std::vector<int>{2});
  Sequence c = make_seq(2, iota_tokens(16, 800));
  bm.allocate(c, bm.can_allocate(c));
  EXPECT_EQ(c.block_table, std::vector<int>{1});
}

TEST(Ch03_BlockManager, ReusedBlockDropsItsStaleHash) {
  BlockManager bm(2, kBS);
  Sequence a = make_seq(0, iota_tokens(20));  // block 0 full + hashed, block 1 partial
  prefill(bm, a);
  uint64_t h = bm.block(0).hash;
  EXPECT_EQ(bm.cached_block(h), 0);
  bm.deallocate(a);  // free: 1, 0
  EXPECT_EQ(bm.cached_block(h), 0);  // freed but still cached
  Sequence x = make_seq(1, iota_tokens(32, 100));  // takes both blocks, overwriting block 0's contents
  bm.allocate(x, bm.can_allocate(x));
  EXPECT_EQ(bm.cached_block(h), -1);  // the entry went with the contents
  EXPECT_FALSE(bm.block(0).has_hash);
  bm.deallocate(x);
  Sequence b = make_seq(2, iota_tokens(20));  // a's prefix is gone: no hit
  EXPECT_EQ(bm.can_allocate(b), 0);
}

TEST(Ch03_BlockManager, StaleEntryOnlyRemovedIfItStillPointsAtTheBlock) {
  // Two identical prompts in one step each get their own blocks (nothing is hashed until computed); the
  // later hash_blocks takes the table entry over. Reusing the first copy must not unmap the second
  // (nano-vllm #163).
  BlockManager bm(4, kBS);
  Sequence a = make_seq(0, iota_tokens(20));
  Sequence b = make_seq(1, iota_tokens(20));
  bm.allocate(a, bm.can_allocate(a));
  bm.allocate(b, bm.can_allocate(b));
  compute(bm, a, 20);
  compute(bm, b, 20);  // hash(block 0) -> b's block
  int a_block0 = a.block_table[0];
  int b_block0 = b.block_table[0];
  ASSERT_NE(a_block0, b_block0);
  bm.deallocate(a);  // free: [unused..., a1, a0]
  // Drain the free queue so that a's block 0 is handed out again.
  std::vector<Sequence> fillers;
  fillers.reserve(4);
  while (bm.num_free_blocks() > 0) {
    fillers.push_back(make_seq(10 + int64_t(fillers.size()), iota_tokens(5, 9000)));
    bm.allocate(fillers.back(), 0);
  }
  EXPECT_EQ(bm.cached_block(b.block_table.empty() ? 0 : bm.block(b_block0).hash), b_block0);
  Sequence c = make_seq(3, iota_tokens(20));
  for (auto& f : fillers) bm.deallocate(f);
  EXPECT_EQ(bm.can_allocate(c), 1);  // still hits b's copy
  bm.allocate(c, 1);
  EXPECT_EQ(c.block_table[0], b_block0);
}

TEST(Ch03_BlockManager, DecodeNeedsANewBlockExactlyAtBlockBoundaries) {
  BlockManager bm(3, kBS);
  Sequence s = make_seq(0, iota_tokens(16));
  prefill(bm, s);
  EXPECT_EQ(s.block_table.size(), 1u);
  s.append_token(1);  // 17 tokens: token 16 starts block 1
  EXPECT_TRUE(bm.can_append(s));
  bm.may_append(s);
  EXPECT_EQ(s.block_table.size(), 2u);
  compute(bm, s, 1);
  for (int i = 0; i < 15; i++) {  // tokens 17..31 fit in block 1
    s.append_token(1);
    bm.may_append(s);
    compute(bm, s, 1);
  }
  EXPECT_EQ(s.block_table.size(), 2u);
  EXPECT_TRUE(bm.block(s.block_table[1]).has_hash);  // filled by decode, hashed by postprocess
  s.append_token(1);  // 33 tokens: needs block 2, the last free one
  EXPECT_TRUE(bm.can_append(s));
  bm.may_append(s);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  compute(bm, s, 1);
  s.append_token(1);  // 34: still in block 2
  EXPECT_TRUE(bm.can_append(s));
}

// Whatever the block size, decode keeps a table of ceil(num_tokens / block_size) blocks: a block of one token
// included, where nano-vllm's len(seq) % block_size == 1 would never add one.
TEST(Ch03_BlockManager, DecodeKeepsCeilTokensOverBlockSizeAtEveryBlockSize) {
  for (int bs : {1, 2, 3, 16}) {
    BlockManager bm(64, bs);
    Sequence s(0, iota_tokens(5), SamplingParams(), 0, bs);
    prefill(bm, s);
    EXPECT_EQ(int(s.block_table.size()), ceil_div(5, bs)) << "block size " << bs;
    for (int i = 0; i < 20; i++) {
      s.append_token(1);
      ASSERT_TRUE(bm.can_append(s));
      bm.may_append(s);
      EXPECT_EQ(int(s.block_table.size()), ceil_div(s.num_tokens(), bs)) << "block size " << bs << ", " << s.num_tokens() << " tokens";
      compute(bm, s, 1);
    }
  }
  EXPECT_THROW(BlockManager(4, 0), Error);
  EXPECT_THROW(BlockManager(0, kBS), Error);  // a cache of no blocks could never hold a token
}

TEST(Ch03_BlockManager, CanAppendFailsWithoutFreeBlockAtBoundary) {
  BlockManager bm(1, kBS);
  Sequence s = make_seq(0, iota_tokens(16));
  prefill(bm, s);
  s.append_token(1);
  EXPECT_FALSE(bm.can_append(s));
}
