// scheduler.cpp: prefill first, token budget, chunks, preemption (nano-vllm: engine/scheduler.py).
#include "02_scheduler/scheduler.h"

#include <algorithm>
#include <cassert>

namespace nanovllm {

Scheduler::Scheduler(const EngineConfig& config)
    : max_num_seqs_(config.max_num_seqs),
      max_num_batched_tokens_(config.max_num_batched_tokens),
      max_model_len_(config.max_model_len),
      block_size_(config.kvcache_block_size),
      eos_(config.eos),
      block_manager_(config.num_kvcache_blocks, config.kvcache_block_size) {}

void Scheduler::add(Sequence* seq) {
  // The longest this sequence can get: its prompt plus max_tokens, of which the last sampled token is
  // never fed back, so its K/V never needs a slot. In 64 bits: both terms may be near INT32_MAX.
  const int64_t max_len = int64_t(seq->num_prompt_tokens) + seq->params.max_tokens;
  if (max_len > max_model_len_)
    fail("request ", seq->seq_id, ": prompt (", seq->num_prompt_tokens, " tokens) + max_tokens (",
         seq->params.max_tokens, ") exceeds max_model_len (", max_model_len_, ")");
  const int64_t blocks_needed = ceil_div<int64_t>(max_len - 1, block_size_);
  if (blocks_needed > block_manager_.num_blocks())
    fail("request ", seq->seq_id, ": needs ", blocks_needed, " KV blocks of ", block_size_,
         " tokens but the cache has only ", block_manager_.num_blocks());
  if (seq->block_size != block_size_)
    fail("request ", seq->seq_id, ": block size ", seq->block_size, " differs from the engine's ", block_size_);
  waiting_.push_back(seq);
}

std::pair<std::vector<Sequence*>, bool> Scheduler::schedule() {
  std::vector<Sequence*> scheduled;

  // Prefill: the head of the waiting queue, as many as fit.
  int num_batched_tokens = 0;
  while (!waiting_.empty() && int(scheduled.size()) < max_num_seqs_) {
    Sequence* seq = waiting_.front();
    int remaining = max_num_batched_tokens_ - num_batched_tokens;
    if (remaining == 0) break;
    int num_cached_blocks = 0;
    int num_tokens;  // tokens still to compute for this sequence
    if (seq->block_table.empty()) {  // new, or preempted: look up the prefix cache
      num_cached_blocks = block_manager_.can_allocate(*seq);
      if (num_cached_blocks == -1) break;  // not enough free blocks: wait for some to be released
      num_tokens = seq->num_tokens() - num_cached_blocks * block_size_;
    } else {  // the rest of a prefill chunked in an earlier step
      num_tokens = seq->num_tokens() - seq->num_cached_tokens;
    }
    if (remaining < num_tokens && !scheduled.empty()) break;  // only the first sequence may be chunked
    if (seq->block_table.empty()) block_manager_.allocate(*seq, num_cached_blocks);
    seq->num_scheduled_tokens = std::min(num_tokens, remaining);
    num_batched_tokens += seq->num_scheduled_tokens;
    if (seq->num_cached_tokens + seq->num_scheduled_tokens == seq->num_tokens()) {
      seq->status = SequenceStatus::RUNNING;
      waiting_.pop_front();
      running_.push_back(seq);
    } else {
      num_chunked_prefills_++;  // stays at the head of waiting_; the budget is spent, so the loop ends
    }
    scheduled.push_back(seq);
  }
  if (!scheduled.empty()) return {scheduled, true};

  // Decode: one token for each running sequence, preempting from the back when blocks run out.
  while (!running_.empty() && int(scheduled.size()) < max_num_seqs_) {
    Sequence* seq = running_.front();
    running_.pop_front();
    bool preempted_itself = false;
    while (!block_manager_.can_append(*seq)) {
      if (!running_.empty()) {
        preempt(running_.back());
        running_.pop_back();
      } else {
        preempt(seq);
        preempted_itself = true;
        break;
      }
    }
    if (preempted_itself) continue;
    seq->num_scheduled_tokens = 1;
    block_manager_.may_append(*seq);
    scheduled.push_back(seq);
  }
  // add() refused every request that cannot run alone, so the first sequence can always get its block
  // once everything behind it is preempted: a decode step is never empty (nano-vllm issue #274). Should
  // that ever break, fail with an error rather than abort.
  if (scheduled.empty()) fail("internal: the scheduler found nothing to run while requests remain");
  running_.insert(running_.begin(), scheduled.begin(), scheduled.end());  // same order as before
  return {scheduled, false};
}

void Scheduler::preempt(Sequence* seq) {
  seq->status = SequenceStatus::WAITING;
  seq->num_preemptions++;
  num_preemptions_++;
  block_manager_.deallocate(*seq);
  waiting_.push_front(seq);
}

bool Scheduler::is_eos(int32_t token_id) const {
  return std::find(eos_.begin(), eos_.end(), token_id) != eos_.end();
}

void Scheduler::postprocess(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& token_ids,
                            bool is_prefill) {
  assert(seqs.size() == token_ids.size());
  for (size_t i = 0; i < seqs.size(); i++) {
    Sequence* seq = seqs[i];
    block_manager_.hash_blocks(*seq);
    seq->num_cached_tokens += seq->num_scheduled_tokens;
    seq->num_scheduled_tokens = 0;
    if (is_prefill && seq->num_cached_tokens < seq->num_tokens()) continue;  // a chunk: no token yet
    seq->append_token(token_ids[i]);
    bool finished = (!seq->params.ignore_eos && is_eos(token_ids[i])) ||
                    seq->num_completion_tokens() == seq->params.max_tokens;
    if (finished) {
      seq->status = SequenceStatus::FINISHED;
      block_manager_.deallocate(*seq);
      running_.erase(std::find(running_.begin(), running_.end(), seq));
    }
  }
}

}  // namespace nanovllm
