// llm_engine.h: the entry of the engine (nano-vllm: engine/llm_engine.py, llm.py; article, "first
// stop"). generate() queues every prompt and calls step() until all are done; each step is
//
//   auto [seqs, is_prefill] = scheduler.schedule()        which sequences, prefill or decode (02)
//   model_runner.launch(seqs, is_prefill)                 one forward pass and a sample each (04),
//   tokens = model_runner.collect()                         queued, then its tokens read back
//   scheduler.postprocess(seqs, tokens, is_prefill)       append tokens, retire finished sequences
//
// Beyond nano-vllm, steps overlap (EngineConfig::overlap_steps): while step n runs, step n + 1 is
// scheduled and launched before step n's tokens reach the host, wherever its batch does not depend on those
// tokens: a decode step after a decode step, its input tokens read from the sampler's output on the device
// (Scheduler::schedule_ahead), or a prefill after a prefill (Scheduler::schedule_prefill_ahead). The host's
// work between two steps then runs beside the device's; the outputs are the same.
//
// It sits in chapter 01 because a reader starts here, but it calls every other chapter: the Makefile
// builds chapter 01 on top of all the others (deps_01).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "01_sequence/engine_config.h"
#include "01_sequence/sequence.h"

namespace nanovllm {

class ModelRunner;
class Scheduler;
class Tokenizer;

struct GenerateOutput {
  int64_t seq_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> token_ids;  // the completion, EOS included when it ended the sequence
  std::string text;                // the completion decoded (special tokens kept; ids the tokenizer lacks
                                   // decode to nothing), when a tokenizer is loaded
  int num_prefix_hit_blocks = 0;   // blocks of this request found in the prefix cache
  int num_preemptions = 0;
  RequestTimes times;              // arrival, first completion token, finish (steady clock)
};

// Totals over the engine's life, for the progress line, --trace and benchmarks.
struct EngineStats {
  int64_t steps = 0, prefill_steps = 0, decode_steps = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  int64_t decode_context_tokens = 0;  // sum of context lengths over decode steps: the K/V tokens read
  int64_t overlapped_steps = 0;       // decode steps launched before the step before's tokens were read
  int64_t overlapped_prefill_steps = 0;  // prefill steps launched so, after a prefill step
  double prefill_seconds = 0, decode_seconds = 0;
  // Of decode_seconds: the model runner queuing each step (inputs, uploads, launches) and waiting for
  // its tokens (ModelRunner::RunTimes). The rest is the scheduler and the bookkeeping of the step, host
  // work during which a GPU waits: what scheduling step n + 1 while step n runs could hide.
  double decode_queue_seconds = 0, decode_wait_seconds = 0;
};

class LLMEngine {
 public:
  // Loads the model (the runner sizes the KV cache), then builds the scheduler over that cache.
  explicit LLMEngine(EngineConfig config);
  ~LLMEngine();

  // Queues a request; returns its seq_id. Throws Error for an empty prompt, a token id outside the
  // vocabulary, invalid sampling parameters, or a request that can never fit (see Scheduler::add).
  int64_t add_request(std::vector<int32_t> prompt_token_ids, const SamplingParams& params);
  bool is_finished() const;  // no request left, and no step in flight

  // One engine step: the requests that finished in it, and nano-vllm's signed token count (tokens
  // computed if this was a prefill step, minus the number of sequences if a decode step):
  //   auto [outputs, num_tokens] = engine.step();
  // Call it only while !is_finished(). The step whose tokens it reads is step n; step n + 1 may be launched
  // before they are read (the overlap), and is then read by the next call. `logits`, if given, receives the
  // (rows, vocab) fp32 logits step n sampled from, one row per row of its batch (rows of requests retired
  // before it ran included), and nothing is launched ahead.
  std::pair<std::vector<GenerateOutput>, int> step(std::vector<float>* logits = nullptr);

  // Runs prompts to completion; outputs in prompt order. params has one entry per prompt, or one for all.
  // progress: once every request is accepted, print describe() and then redraw a one-line progress bar
  // on stderr when it is a terminal (as nano-vllm's tqdm bar); lines printed with log() (base/log.h)
  // appear above it, never glued to it.
  std::vector<GenerateOutput> generate(const std::vector<std::vector<int32_t>>& prompts,
                                       const std::vector<SamplingParams>& params, bool progress = false);
  // generate()'s second half, for a caller that queued the requests itself with add_request (to name each
  // request's own origin in add_request's errors, as `nanovllm generate --requests` does): steps until every
  // request is done; outputs in the order of `ids`. progress as generate's.
  std::vector<GenerateOutput> run_to_completion(const std::vector<int64_t>& ids, bool progress = false);
  // The same for text prompts, encoded with the tokenizer (nano-vllm's add_request(str)).
  std::vector<GenerateOutput> generate(const std::vector<std::string>& prompts,
                                       const std::vector<SamplingParams>& params, bool progress = false);

  // The tokenizer of the model folder (or config.tokenizer), or nullptr when there is none.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

  // One line for the user: where the engine runs and what KV cache it got, e.g.
  //   device cpu: 6 KV blocks of 16 tokens (0.3 MiB)
  std::string describe() const;

  const EngineConfig& config() const { return config_; }
  const EngineStats& stats() const { return stats_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  ModelRunner& model_runner() { return *model_runner_; }
  int vocab_size() const;

 private:
  std::string trace_line(const std::vector<Sequence*>& seqs, bool is_prefill, int64_t preemptions_before,
                         const std::map<int64_t, int>& hits_before) const;
  bool may_overlap() const;

  // A step launched on the model runner whose tokens have not been read yet.
  struct LaunchedStep {
    // every row of the launched batch, in row order; a sequence retired after the launch keeps its row, whose
    // token is dropped
    std::vector<Sequence*> seqs;
    bool is_prefill = false;
  };
  // step()'s parts. launch_ahead: schedules and launches step n + 1 before step n's tokens are read, where its
  // batch needs none of them, adding the launch's host time to queue_seconds; returns its batch (in in_flight_),
  // or nothing. record_step: the step's statistics. take_finished: the outputs of the requests step n finished,
  // stamped `now`; frees the requests nothing refers to any longer.
  std::vector<Sequence*> launch_ahead(const LaunchedStep& current, double& queue_seconds);
  void record_step(bool is_prefill, int scheduled_tokens, int64_t context_tokens, double seconds, double queue_seconds);
  std::vector<GenerateOutput> take_finished(const std::vector<Sequence*>& seqs, const std::vector<bool>& was_finished,
                                            const std::vector<Sequence*>& next, std::chrono::steady_clock::time_point now);
  std::unique_ptr<LaunchedStep> in_flight_;  // launched by the last step() ahead of its tokens, or null
  std::vector<int64_t> retired_in_flight_;  // finished, but still in in_flight_'s batch: erased after it

  EngineConfig config_;
  std::unique_ptr<ModelRunner> model_runner_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<int64_t, std::unique_ptr<Sequence>> sequences_;  // requests not yet returned
  int64_t next_seq_id_ = 0;
  EngineStats stats_;
};

// nano-vllm's `class LLM(LLMEngine): pass`.
using LLM = LLMEngine;

}  // namespace nanovllm
