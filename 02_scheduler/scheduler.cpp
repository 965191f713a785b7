// scheduler.cpp: prefill first, token budget, chunks, preemption (nano-vllm: engine/scheduler.py).
#include "02_scheduler/scheduler.h"

#include <algorithm>
#include <cassert>

namespace nanovllm {

Scheduler::Scheduler(const EngineConfig& config)
    : max_num_seqs_(config.max_num_seqs),
      max_num_batched_tokens_(config.max_num_batched_tokens),
      max_model_len_(config.max_model_len),
      max_position_embeddings_(config.max_position_embeddings),
      block_size_(config.kvcache_block_size),
      eos_(config.eos),
      block_manager_(config.num_kvcache_blocks, config.kvcache_block_size) {}

void Scheduler::add(Sequence* seq) {
  // The longest this sequence can get: its prompt plus max_tokens, of which the last sampled token is
  // never fed back, so its K/V never needs a slot. In 64 bits: both terms may be near INT32_MAX.
  const int64_t max_len = int64_t(seq->num_prompt_tokens) + seq->params.max_tokens;
  if (max_len > max_model_len_)
    fail("request ", seq->seq_id, ": prompt (", counted(seq->num_prompt_tokens, "token"), ") + max_tokens (",
         seq->params.max_tokens, ") exceeds max_model_len (", max_model_len_,
         max_model_len_ == max_position_embeddings_ ? ", the model's max_position_embeddings" : "", ")");
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

  // Decode: one token for each of the first max_num_seqs running sequences, preempting from the back when blocks
  // run out.
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

void Scheduler::mark_computed(Sequence* seq) {
  block_manager_.hash_blocks(*seq);
  seq->num_cached_tokens += seq->num_scheduled_tokens;
  seq->num_scheduled_tokens = 0;
}

void Scheduler::take_token(Sequence* seq, int32_t token_id) {
  if (seq->last_token == kPendingToken) seq->set_last_token(token_id);  // scheduled ahead: the placeholder's token
  else seq->append_token(token_id);
  bool finished = (!seq->params.ignore_eos && is_eos(token_id)) ||
                  seq->num_completion_tokens() == seq->params.max_tokens;
  if (finished) {
    seq->status = SequenceStatus::FINISHED;
    block_manager_.deallocate(*seq);
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  }
}

void Scheduler::postprocess(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& token_ids,
                            bool is_prefill) {
  assert(seqs.size() == token_ids.size());
  for (size_t i = 0; i < seqs.size(); i++) {
    Sequence* seq = seqs[i];
    if (seq->is_finished()) continue;  // retired after an overlapped step had taken it: its row is dropped
    mark_computed(seq);
    if (is_prefill && seq->num_cached_tokens < seq->num_tokens()) continue;  // a chunk: no token yet
    take_token(seq, token_ids[i]);
  }
}

std::vector<Sequence*> Scheduler::schedule_ahead(const std::vector<Sequence*>& launched) {
  // A waiting request would make step n + 1 a prefill; more running sequences than max_num_seqs would make
  // schedule() take only the first of them: either way step n + 1 is not the whole running queue.
  if (!waiting_.empty() || int(running_.size()) > max_num_seqs_) return {};
  // Every running sequence ran in step n (so its token of step n exists, in the sampler's output): an
  // overlapped step's batch is the running queue, and retiring only removes from it.
  size_t found = 0;
  for (const Sequence* seq : launched) found += !seq->is_finished();
  if (found != running_.size()) return {};
  auto goes_on = [](const Sequence* seq) { return seq->num_completion_tokens() + 1 < seq->params.max_tokens; };
  int blocks_needed = 0, going_on = 0;  // as can_append, for every sequence at once, after its placeholder
  for (const Sequence* seq : running_) {
    going_on += goes_on(seq);
    blocks_needed += goes_on(seq) && block_manager_.needs_block(seq->num_tokens() + 1);
  }
  if (going_on == 0 || blocks_needed > block_manager_.num_free_blocks()) return {};

  std::vector<Sequence*> next;
  for (Sequence* seq : running_) {
    mark_computed(seq);
    if (!goes_on(seq)) continue;  // its token of step n is its last: finish_ahead appends it and retires it
    seq->append_token(kPendingToken);
    seq->num_scheduled_tokens = 1;
    block_manager_.may_append(*seq);
    next.push_back(seq);
  }
  return next;
}

std::vector<Sequence*> Scheduler::schedule_prefill_ahead(const std::vector<Sequence*>& launched) {
  if (waiting_.empty()) return {};
  for (const Sequence* seq : launched) {
    const bool completes_prompt = seq->num_cached_tokens + seq->num_scheduled_tokens == seq->num_tokens();
    const bool may_finish = !seq->params.ignore_eos || seq->num_completion_tokens() + 1 >= seq->params.max_tokens;
    if (completes_prompt && may_finish) return {};  // its token of step n may free its blocks
  }
  // The head's blocks: step n's hashes (mark_computed, below) can only add prefix hits, so a head that fits
  // now fits then, and schedule() takes the prefill branch.
  const Sequence* head = waiting_.front();
  if (head->block_table.empty() && block_manager_.can_allocate(*head) == -1) return {};
  for (Sequence* seq : launched) mark_computed(seq);
  auto [next, is_prefill] = schedule();
  if (!is_prefill) fail("internal: a prefill scheduled ahead became a decode step");
  return next;
}

void Scheduler::finish_ahead(const std::vector<Sequence*>& launched, const std::vector<int32_t>& token_ids,
                             bool is_prefill) {
  assert(launched.size() == token_ids.size());
  for (size_t i = 0; i < launched.size(); i++) {
    Sequence* seq = launched[i];
    if (seq->is_finished()) continue;
    if (is_prefill && seq->num_cached_tokens < seq->num_tokens()) continue;  // a chunk: no token yet
    take_token(seq, token_ids[i]);
  }
}

}  // namespace nanovllm
