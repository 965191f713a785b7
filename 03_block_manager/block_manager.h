// block_manager.h: the paged KV cache's bookkeeping and the prefix cache (nano-vllm:
// engine/block_manager.py; article, "fourth stop").
//
// The KV cache is num_blocks physical blocks of block_size token slots each. A sequence owns a block
// table: logical block i of its tokens lives in physical block block_table[i], so token t's K/V sit in
// slot block_table[t / block_size] * block_size + t % block_size.
//
// Prefix cache: once a block is full and its K/V computed, it is keyed by a chained hash of its tokens
// (and, through the chain, of every token before it). A later request whose leading blocks hash the same
// (and really hold the same token ids) reuses them instead of recomputing. Freed blocks keep their hash
// and tokens until they are handed out again, so a finished request's prefix stays reusable (lazy
// eviction, oldest-freed reused first).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "01_sequence/sequence.h"

namespace nanovllm {

struct Block {
  int block_id;
  int ref_count = 0;          // sequences whose block table holds this block
  bool has_hash = false;      // set once the block is full and computed (nano-vllm: hash != -1)
  uint64_t hash = 0;
  std::vector<int32_t> token_ids;  // (block_size,) the tokens behind `hash`, to confirm a hit; empty until hashed

  // Handed out fresh to one owner: no hash until it is full again.
  void reset() {
    ref_count = 1;
    has_hash = false;
    hash = 0;
    token_ids.clear();
  }
};

class BlockManager {
 public:
  // num_blocks >= 1 and block_size >= 1, else throws Error.
  BlockManager(int num_blocks, int block_size);

  // nano-vllm's compute_hash: xxh64 (seed 0) over the previous block's hash as 8 little-endian bytes
  // (absent for the first block: has_prefix = false), then the block's token ids as int64 little-endian.
  static uint64_t compute_hash(const int32_t* token_ids, int num_tokens, bool has_prefix, uint64_t prefix);

  // For a sequence with no blocks yet: how many of its leading blocks are in the prefix cache, or -1 if
  // the free blocks cannot hold the rest. The last block never counts as a hit, even when full, so that
  // prefill always computes at least one token (and has logits to sample from).
  int can_allocate(const Sequence& seq) const;
  // Gives the sequence blocks for all its tokens: the first num_cached_blocks from the prefix cache (as
  // can_allocate just found them, with no allocation since: those blocks must still be cached), the rest
  // fresh. Sets num_cached_tokens to the cached part.
  void allocate(Sequence& seq, int num_cached_blocks);
  // Drops the sequence's hold on its blocks (last block first, so its tail is evicted before its prefix)
  // and clears its block table and num_cached_tokens.
  void deallocate(Sequence& seq);

  // Decode: the token just appended (num_tokens() includes it, its K/V not yet written) needs a new block
  // exactly when it is the first of one: (num_tokens - 1) % block_size == 0 (nano-vllm writes
  // len(seq) % block_size == 1, the same for any block size but 1). can_append: whether a free block is there
  // for it if so; may_append gives it one (call it only where can_append said true).
  bool needs_block(int num_tokens) const { return (num_tokens - 1) % block_size_ == 0; }
  bool can_append(const Sequence& seq) const;
  void may_append(Sequence& seq);

  // After a step: hashes the full blocks this step filled, [num_cached_tokens / block_size, (num_cached_tokens
  // + num_scheduled_tokens) / block_size), each chained to the hash of the block before it, which an earlier
  // step hashed. Called before num_cached_tokens advances.
  void hash_blocks(Sequence& seq);

  int num_free_blocks() const { return int(free_block_ids_.size()); }
  int num_blocks() const { return int(blocks_.size()); }
  int block_size() const { return block_size_; }
  const Block& block(int block_id) const { return blocks_[block_id]; }

  // The block the prefix cache maps `hash` to, or -1.
  int cached_block(uint64_t hash) const {
    auto it = hash_to_block_id_.find(hash);
    return it == hash_to_block_id_.end() ? -1 : it->second;
  }

  // Total prefix-cache hits since construction, for readers and --trace.
  int64_t total_hit_blocks() const { return total_hit_blocks_; }

 private:
  int allocate_block();              // pops the oldest free block, dropping its stale hash entry
  void deallocate_block(int block_id);

  int block_size_;
  std::vector<Block> blocks_;                          // (num_blocks,)
  std::unordered_map<uint64_t, int> hash_to_block_id_; // hash of a full, computed block -> its id
  std::deque<int> free_block_ids_;                     // reuse order: front is the oldest freed
  std::vector<bool> used_;                             // (num_blocks,) ref_count > 0
  int64_t total_hit_blocks_ = 0;
};

}  // namespace nanovllm
