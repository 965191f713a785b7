// block_manager.cpp: blocks, reference counts and the prefix cache (nano-vllm: engine/block_manager.py).
#include "03_block_manager/block_manager.h"

#include <algorithm>
#include <cassert>

#include "03_block_manager/xxh64.h"

namespace nanovllm {

BlockManager::BlockManager(int num_blocks, int block_size)
    : block_size_(block_size), used_(size_t(num_blocks), false) {
  if (num_blocks < 1) fail("the KV cache needs at least one block, got ", num_blocks);
  if (block_size < 1) fail("a KV block holds at least one token, got a block size of ", block_size);
  blocks_.reserve(num_blocks);
  for (int i = 0; i < num_blocks; i++) {
    blocks_.emplace_back();
    blocks_.back().block_id = i;
    free_block_ids_.push_back(i);
  }
}

uint64_t BlockManager::compute_hash(const int32_t* token_ids, int num_tokens, bool has_prefix,
                                    uint64_t prefix) {
  // Staged as the exact bytes nano-vllm hands to xxhash: [prefix u64 LE] ++ [token as int64 LE]...
  std::vector<uint8_t> bytes;
  bytes.reserve(8 * size_t(num_tokens + 1));
  auto put_u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; i++) bytes.push_back(uint8_t(v >> (8 * i)));
  };
  if (has_prefix) put_u64(prefix);
  for (int t = 0; t < num_tokens; t++) put_u64(uint64_t(int64_t(token_ids[t])));  // sign-extend, as numpy
  return xxh64(bytes.data(), bytes.size(), 0);
}

// A hit needs the hash in the table *and* the same token ids: a hash collision reads as a miss.
static bool block_holds(const Block& block, const int32_t* token_ids, int n) {
  return int(block.token_ids.size()) == n && std::equal(token_ids, token_ids + n, block.token_ids.begin());
}

int BlockManager::can_allocate(const Sequence& seq) const {
  int num_cached_blocks = 0;
  int num_new_blocks = seq.num_blocks();
  uint64_t h = 0;
  for (int i = 0; i < seq.num_blocks() - 1; i++) {  // the last block is never matched
    h = compute_hash(seq.block(i), block_size_, i > 0, h);
    auto it = hash_to_block_id_.find(h);
    if (it == hash_to_block_id_.end() || !block_holds(blocks_[it->second], seq.block(i), block_size_)) break;
    num_cached_blocks++;
    // A hit on a block in use is shared for free; a hit on a freed block still takes a free block.
    if (used_[it->second]) num_new_blocks--;
  }
  return num_free_blocks() >= num_new_blocks ? num_cached_blocks : -1;
}

void BlockManager::allocate(Sequence& seq, int num_cached_blocks) {
  assert(seq.block_table.empty());
  uint64_t h = 0;
  for (int i = 0; i < num_cached_blocks; i++) {
    h = compute_hash(seq.block(i), block_size_, i > 0, h);
    int block_id = hash_to_block_id_.at(h);  // can_allocate just found it
    Block& block = blocks_[block_id];
    if (used_[block_id]) {
      block.ref_count++;
    } else {  // a cached block that was free: take it out of the free queue, keeping its contents
      block.ref_count = 1;
      free_block_ids_.erase(std::find(free_block_ids_.begin(), free_block_ids_.end(), block_id));
      used_[block_id] = true;
    }
    seq.block_table.push_back(block_id);
  }
  for (int i = num_cached_blocks; i < seq.num_blocks(); i++) seq.block_table.push_back(allocate_block());
  seq.num_cached_tokens = num_cached_blocks * block_size_;
  seq.num_prefix_hit_blocks += num_cached_blocks;
  total_hit_blocks_ += num_cached_blocks;
}

int BlockManager::allocate_block() {
  assert(!free_block_ids_.empty());
  int block_id = free_block_ids_.front();
  free_block_ids_.pop_front();
  Block& block = blocks_[block_id];
  assert(block.ref_count == 0);
  // Its old contents are about to be overwritten: forget the hash, unless a newer block took it over.
  if (block.has_hash) {
    auto it = hash_to_block_id_.find(block.hash);
    if (it != hash_to_block_id_.end() && it->second == block_id) hash_to_block_id_.erase(it);
  }
  block.reset();
  used_[block_id] = true;
  return block_id;
}

void BlockManager::deallocate_block(int block_id) {
  assert(blocks_[block_id].ref_count == 0);
  used_[block_id] = false;
  free_block_ids_.push_back(block_id);
}

void BlockManager::deallocate(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    Block& block = blocks_[*it];
    block.ref_count--;
    if (block.ref_count == 0) deallocate_block(*it);
  }
  seq.num_cached_tokens = 0;
  seq.block_table.clear();
}

bool BlockManager::can_append(const Sequence& seq) const {
  return num_free_blocks() >= (needs_block(seq.num_tokens()) ? 1 : 0);
}

void BlockManager::may_append(Sequence& seq) {
  if (needs_block(seq.num_tokens())) seq.block_table.push_back(allocate_block());
}

void BlockManager::hash_blocks(Sequence& seq) {
  int start = seq.num_cached_tokens / block_size_;
  int end = (seq.num_cached_tokens + seq.num_scheduled_tokens) / block_size_;
  if (start == end) return;
  // The chain continues from the block before `start`, which an earlier step already hashed.
  bool has_prefix = start > 0;
  assert(!has_prefix || blocks_[seq.block_table[start - 1]].has_hash);
  uint64_t h = has_prefix ? blocks_[seq.block_table[start - 1]].hash : 0;
  for (int i = start; i < end; i++) {
    Block& block = blocks_[seq.block_table[i]];
    h = compute_hash(seq.block(i), block_size_, has_prefix, h);
    has_prefix = true;
    block.has_hash = true;
    block.hash = h;
    block.token_ids.assign(seq.block(i), seq.block(i) + block_size_);
    hash_to_block_id_[h] = block.block_id;  // a later identical block takes the entry over
  }
}

}  // namespace nanovllm
