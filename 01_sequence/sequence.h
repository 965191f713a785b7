// sequence.h: one request and everything the engine knows about it (nano-vllm: engine/sequence.py).
//
// Three counters drive the whole engine (article, "second stop"):
//   num_tokens()          prompt + generated tokens so far (nano-vllm's len(seq))
//   num_cached_tokens     tokens whose K/V are already in the paged cache: prefix-cache hits, chunks
//                         computed in earlier steps, and everything before the last token in decode
//   num_scheduled_tokens  tokens this step computes: [num_cached_tokens, num_cached_tokens + scheduled)
// Prefix hits, chunked prefill, decode and recompute after preemption are all that one case.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "01_sequence/sampling_params.h"

namespace nanovllm {

enum class SequenceStatus { WAITING, RUNNING, FINISHED };

// A token sampled on the device and not yet on the host (the overlapped loop, 02_scheduler's
// schedule_ahead). Never a token id; the sampler's own "no token" is -1.
constexpr int32_t kPendingToken = -2;

// When a request arrived (LLMEngine::add_request), got its first completion token and finished, on the
// steady clock: what a serving user waits for (bench reports time to first token and time per output
// token from them, 01_sequence/cli/serving_metrics.h). LLMEngine::step sets the last two from the one
// clock read that ends each step; a default time_point means "not yet".
struct RequestTimes {
  std::chrono::steady_clock::time_point arrival, first_token, finished;
};

class Sequence {
 public:
  // A new request: WAITING, nothing cached, no blocks. block_size is the engine's KV block size (passed
  // in, not a global: nano-vllm's class attribute is how its tensor-parallel workers got it wrong).
  Sequence(int64_t id, std::vector<int32_t> prompt_token_ids, const SamplingParams& sampling, uint64_t sampling_seed,
           int kv_block_size)
      : seq_id(id),
        token_ids(std::move(prompt_token_ids)),
        last_token(token_ids.empty() ? -1 : token_ids.back()),
        num_prompt_tokens(int(token_ids.size())),
        params(sampling),
        seed(sampling_seed),
        block_size(kv_block_size) {
    if (token_ids.empty()) fail("request ", id, ": the prompt is empty");
    if (block_size < 1) fail("block size must be >= 1, got ", block_size);
    params.validate();
  }

  int num_tokens() const { return int(token_ids.size()); }
  int num_completion_tokens() const { return num_tokens() - num_prompt_tokens; }
  bool is_finished() const { return status == SequenceStatus::FINISHED; }

  // Blocks needed for all tokens so far: ceil(num_tokens / block_size).
  int num_blocks() const { return ceil_div(num_tokens(), block_size); }
  // Tokens in the last block, 1..block_size.
  int last_block_num_tokens() const { return num_tokens() - (num_blocks() - 1) * block_size; }
  // Token ids of logical block i (the last one may be partial: last_block_num_tokens() of them).
  const int32_t* block(int i) const { return token_ids.data() + size_t(i) * block_size; }

  void append_token(int32_t token_id) {
    token_ids.push_back(token_id);
    last_token = token_id;
  }
  // The overlapped loop (02_scheduler, schedule_ahead) appends kPendingToken for a token still on the
  // device, and gives it its value here once it is on the host.
  void set_last_token(int32_t token_id) {
    token_ids.back() = token_id;
    last_token = token_id;
  }
  std::vector<int32_t> completion_token_ids() const {
    return std::vector<int32_t>(token_ids.begin() + num_prompt_tokens, token_ids.end());
  }

  const int64_t seq_id;       // unique in this engine, increasing in order of arrival
  SequenceStatus status = SequenceStatus::WAITING;
  std::vector<int32_t> token_ids;  // (num_tokens,) prompt then completion
  int32_t last_token;
  const int num_prompt_tokens;
  int num_cached_tokens = 0;
  int num_scheduled_tokens = 0;
  std::vector<int> block_table;    // (num_blocks,) physical KV block ids, in logical order
  const SamplingParams params;
  const uint64_t seed;             // this request's random stream (07_sampler)
  const int block_size;

  // Counters for readers (the article's first exercise prints the first one).
  int num_prefix_hit_blocks = 0;  // blocks found in the prefix cache, over all (re)allocations
  int num_preemptions = 0;
  RequestTimes times;             // set by the engine, not by the scheduler
};

}  // namespace nanovllm
