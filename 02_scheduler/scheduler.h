// scheduler.h: which sequences run in the next step, and what happens after it (nano-vllm:
// engine/scheduler.py; article, "third stop").
//
// Policy, exactly nano-vllm bb823b3's:
//  - A step is all prefill or all decode, never mixed. Prefill goes first: while anything waits and fits,
//    the step is a prefill step.
//  - Prefill takes waiting sequences first come first served, up to max_num_seqs sequences and
//    max_num_batched_tokens tokens. Only the first sequence of a step may be cut short (chunked); a later
//    one that does not fit whole waits for the next step.
//  - Decode advances the first max_num_seqs running sequences (all of them, if fewer) by one token each; the
//    rest wait, in order, until one ahead of them finishes or is preempted. When the KV cache has no block
//    for a sequence's next token, the most recently started running sequence is preempted: its blocks are
//    released and it goes back to the front of the waiting queue, to be recomputed (its full blocks may
//    come back from the prefix cache, if no other sequence has taken them meanwhile).
// Beyond nano-vllm: a request that could never run (longer than max_model_len, or needing more KV blocks
// than exist) is refused by add() instead of crashing or deadlocking later.
#pragma once

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "01_sequence/engine_config.h"
#include "01_sequence/sequence.h"
#include "03_block_manager/block_manager.h"

namespace nanovllm {

class Scheduler {
 public:
  // config.num_kvcache_blocks must be set (the model runner computes it from memory).
  explicit Scheduler(const EngineConfig& config);

  // Queues a new request; the scheduler keeps the pointer, so `seq` must outlive its run (LLMEngine owns
  // it). Throws Error if it can never be scheduled, or if its block size is not the engine's.
  void add(Sequence* seq);
  bool is_finished() const { return waiting_.empty() && running_.empty(); }

  // Picks the next step's sequences and sets their num_scheduled_tokens. Returns them and whether the
  // step is a prefill, as nano-vllm's `seqs, is_prefill = scheduler.schedule()`:
  //   auto [seqs, is_prefill] = scheduler.schedule();
  // Never returns an empty batch while work remains.
  std::pair<std::vector<Sequence*>, bool> schedule();

  // After the model ran: hashes newly full blocks, advances num_cached_tokens, appends each sampled
  // token (none for a prefill chunk that has not reached the end of its prompt: that sample is
  // discarded), and retires sequences that hit EOS or max_tokens, releasing their blocks.
  // A sequence retired earlier, whose row an overlapped step still computed (below), is passed over.
  // token_ids (seqs.size(),): row i's sampled id.
  void postprocess(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& token_ids, bool is_prefill);

  // Beyond nano-vllm, the overlapped loop (LLMEngine::step, EngineConfig::overlap_steps): step n + 1 (a
  // decode step after a decode step, a prefill after a prefill) scheduled while step n runs, before its
  // tokens reach the host.
  //
  // schedule_ahead(launched), where `launched` is decode step n: when step n + 1 needs none of step n's
  // tokens to be chosen (nothing waits for a prefill, and every sequence that goes on finds a free block if
  // it needs one, so nobody is preempted), does step n's postprocess up to its tokens (hashes, cached
  // counts), gives every sequence that goes on kPendingToken as its token of step n and the block it needs,
  // and returns step n + 1's decode batch: the running queue in order, less the sequences whose token of
  // step n is their max_tokens-th. Otherwise it changes nothing and returns an empty batch: the caller
  // waits for the tokens and calls postprocess as usual.
  std::vector<Sequence*> schedule_ahead(const std::vector<Sequence*>& launched);
  // schedule_prefill_ahead(launched), where `launched` is prefill step n: step n + 1 when it is another
  // prefill that schedule() would choose the same without step n's tokens. That holds when a request waits
  // whose prefill can start (the head of the waiting queue finds its blocks) and no sequence whose prompt
  // step n completes can finish at that token (each has ignore_eos and more than one token to go), since
  // only such a finish would free blocks before schedule() runs. Then it does step n's postprocess up to
  // its tokens and returns schedule()'s prefill batch; otherwise it changes nothing and returns none.
  std::vector<Sequence*> schedule_prefill_ahead(const std::vector<Sequence*>& launched);
  // The rest of step n's postprocess, once its tokens are on the host: each kPendingToken replaced by its
  // token (appended, for a sequence that did not go on, or whose prompt prefill step n completed), and the
  // sequences that hit EOS or max_tokens retired. A sequence retired by EOS here is still in step n + 1,
  // whose row for it is computed and dropped. A prefill chunk that did not complete its prompt gets no token.
  void finish_ahead(const std::vector<Sequence*>& launched, const std::vector<int32_t>& token_ids,
                    bool is_prefill = false);

  const BlockManager& block_manager() const { return block_manager_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::deque<Sequence*>& running() const { return running_; }

  // Counters for readers and --trace.
  int64_t num_preemptions() const { return num_preemptions_; }
  int64_t num_chunked_prefills() const { return num_chunked_prefills_; }  // chunks that left a remainder

 private:
  // Back to WAITING at the front of waiting_, its blocks released. running_ is not touched: the caller,
  // which is walking that queue, takes the sequence out of it (or already has).
  void preempt(Sequence* seq);
  bool is_eos(int32_t token_id) const;
  // postprocess in its two halves: what the step computed (newly full blocks hashed, num_cached_tokens
  // advanced), then its token (appended; the sequence retired if that was its last).
  void mark_computed(Sequence* seq);
  void take_token(Sequence* seq, int32_t token_id);

  int max_num_seqs_;
  int max_num_batched_tokens_;
  int max_model_len_;
  int max_position_embeddings_;  // the model's (0: not known), named by add()'s error where it set max_model_len_
  int block_size_;
  std::vector<int32_t> eos_;
  BlockManager block_manager_;
  std::deque<Sequence*> waiting_;  // not yet (fully) prefilled, or preempted; front is scheduled first
  std::deque<Sequence*> running_;  // prefilled, decoding; back is the most recently started
  int64_t num_preemptions_ = 0;
  int64_t num_chunked_prefills_ = 0;
};

}  // namespace nanovllm
