// llm_engine.cpp: LLMEngine's constructor, add_request, step and generate (nano-vllm: engine/llm_engine.py).
#include "01_sequence/llm_engine.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "01_sequence/base/files.h"
#include "01_sequence/base/log.h"
#include "01_sequence/tokenizer/tokenizer.h"
#include "02_scheduler/scheduler.h"
#include "04_model_runner/model_runner.h"
#include "07_sampler/sampler.h"

namespace nanovllm {

LLMEngine::LLMEngine(EngineConfig config) : config_(std::move(config)) {
  config_.validate();
  const std::string tokenizer_dir = config_.tokenizer.empty() ? config_.model : config_.tokenizer;
  if (!config_.tokenizer.empty() || optional_file_exists(tokenizer_dir + "/tokenizer.json"))
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(tokenizer_dir));
  model_runner_ = std::make_unique<ModelRunner>(config_);  // sets num_kvcache_blocks, eos, max_model_len
  scheduler_ = std::make_unique<Scheduler>(config_);
  if (tokenizer_ && tokenizer_->vocab_size() > vocab_size())
    fail("the tokenizer in ", tokenizer_dir, " has ", tokenizer_->vocab_size(), " tokens but the model's vocabulary only ",
         vocab_size());
}

LLMEngine::~LLMEngine() = default;

std::string LLMEngine::describe() const {
  char line[160];
  const int tp = config_.tensor_parallel_size;
  std::snprintf(line, sizeof line, "device %s%s: %d KV blocks of %d tokens (%.1f MiB)%s", config_.device.c_str(),
                tp > 1 ? (", " + std::to_string(tp) + " tensor-parallel ranks").c_str() : "",
                config_.num_kvcache_blocks, config_.kvcache_block_size,
                double(model_runner_->kv_cache_bytes()) / (1 << 20),
                model_runner_->graph_batch_sizes().empty() ? "" : ", CUDA graphs for decode");
  return line;
}

int LLMEngine::vocab_size() const { return model_runner_->model_config().vocab_size; }

bool LLMEngine::is_finished() const { return scheduler_->is_finished() && !in_flight_; }

bool LLMEngine::may_overlap() const {
  return config_.overlap_steps && !config_.trace && config_.tensor_parallel_size == 1;
}

int64_t LLMEngine::add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
  const int64_t id = next_seq_id_;
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab_size())
      fail("request ", id, ": token id ", t, " is outside the vocabulary [0, ", vocab_size(), ")");
  // A request without a seed gets one derived from the engine's seed and its id: reproducible, and
  // different for every request.
  uint64_t seed = params.seed ? *params.seed : mix64(config_.seed ^ mix64(uint64_t(id)));
  auto seq = std::make_unique<Sequence>(id, std::move(prompt), params, seed, config_.kvcache_block_size);
  seq->times.arrival = std::chrono::steady_clock::now();
  scheduler_->add(seq.get());
  next_seq_id_++;
  sequences_[id] = std::move(seq);
  return id;
}

// nano-vllm's step is the four calls of llm_engine.h's header: schedule and launch (the `if (!in_flight_)`
// block), collect, postprocess. The rest is the overlap (in_flight_, launch_ahead, finish_ahead: chapter
// 02's "Beyond nano-vllm"), --trace, the statistics (record_step) and the outputs (take_finished); with
// --no-overlap, in_flight_ is always null here and `next` always empty, and the step reads as nano-vllm's.
std::pair<std::vector<GenerateOutput>, int> LLMEngine::step(std::vector<float>* logits) {
  if (is_finished()) fail("LLMEngine::step: no request left to run (is_finished())");
  const int64_t preemptions_before = scheduler_->num_preemptions();
  std::map<int64_t, int> hits_before;  // for --trace: prefix-cache hits of each request before this step
  if (config_.trace)
    for (const auto& [id, seq] : sequences_) hits_before[id] = seq->num_prefix_hit_blocks;
  auto t0 = std::chrono::steady_clock::now();
  std::string trace;
  // The host's time queuing the launches made in this step (this step's own, where nothing was in flight,
  // and the next one's): the runner's last_run_times() holds only the latest launch, which, after a step
  // that launched none ahead, was made in the step before.
  double queue_seconds = 0;
  if (!in_flight_) {  // the plain loop, or the first step after a prefill or a wait
    auto [seqs, is_prefill] = scheduler_->schedule();
    if (config_.trace) trace = trace_line(seqs, is_prefill, preemptions_before, hits_before);
    model_runner_->launch(seqs, is_prefill);
    queue_seconds += model_runner_->last_run_times().queue_seconds;
    in_flight_ = std::make_unique<LaunchedStep>(LaunchedStep{seqs, is_prefill});
  }
  const std::unique_ptr<LaunchedStep> current = std::move(in_flight_);
  const std::vector<Sequence*>& seqs = current->seqs;
  const bool is_prefill = current->is_prefill;
  // Counted before launch_ahead: its schedule_*_ahead marks this step computed, which zeroes num_scheduled_tokens.
  int scheduled_tokens = 0;
  int64_t context_tokens = 0;
  for (const Sequence* s : seqs)
    if (!s->is_finished()) scheduled_tokens += is_prefill ? s->num_scheduled_tokens : 1, context_tokens += s->num_tokens();
  const std::vector<Sequence*> next = logits ? std::vector<Sequence*>() : launch_ahead(*current, queue_seconds);

  std::vector<int32_t> tokens = model_runner_->collect();
  if (logits) model_runner_->download_logits(int(seqs.size()), logits);  // nothing launched since
  for (size_t i = 0; i < seqs.size(); i++)  // the sampler's -1: a NaN in the logits, or no finite maximum
    if (tokens[i] < 0 && !seqs[i]->is_finished())
      fail("step ", stats_.steps + 1, ": non-finite logits (NaN or Inf) for request ", seqs[i]->seq_id,
           ": the model's arithmetic overflowed (its weights are finite: loading checks every one)");
  std::vector<bool> was_finished;  // rows of sequences retired before this step ran: computed and dropped
  for (const Sequence* s : seqs) was_finished.push_back(s->is_finished());
  if (!next.empty()) scheduler_->finish_ahead(seqs, tokens, is_prefill);
  else scheduler_->postprocess(seqs, tokens, is_prefill);

  // The step's tokens exist from here on: this one clock read times the step and stamps its requests.
  const auto t1 = std::chrono::steady_clock::now();
  record_step(is_prefill, scheduled_tokens, context_tokens, std::chrono::duration<double>(t1 - t0).count(),
              queue_seconds);
  if (!trace.empty()) log("%s", trace.c_str());
  return {take_finished(seqs, was_finished, next, t1), is_prefill ? scheduled_tokens : -scheduled_tokens};
}

// The overlap: step n + 1 scheduled and launched now, before step n's tokens are read, when its batch needs
// none of them: a decode step after a decode step, its input tokens step n's, taken on the device from the row
// of each sequence; or a prefill after a prefill, of requests that were waiting.
std::vector<Sequence*> LLMEngine::launch_ahead(const LaunchedStep& current, double& queue_seconds) {
  if (!may_overlap()) return {};
  const std::vector<Sequence*>& seqs = current.seqs;
  std::vector<Sequence*> next =
      current.is_prefill ? scheduler_->schedule_prefill_ahead(seqs) : scheduler_->schedule_ahead(seqs);
  if (next.empty()) return next;
  std::vector<int32_t> input_rows;
  if (!current.is_prefill) {
    // Both batches keep the running queue's order, so each sequence's row in step n is found by walking on.
    size_t row = 0;
    for (const Sequence* s : next) {
      while (row < seqs.size() && seqs[row] != s) row++;
      if (row == seqs.size()) fail("internal: a sequence scheduled ahead was not in the step before");
      input_rows.push_back(int32_t(row));
    }
  }
  model_runner_->launch(next, current.is_prefill, input_rows);
  queue_seconds += model_runner_->last_run_times().queue_seconds;
  in_flight_ = std::make_unique<LaunchedStep>(LaunchedStep{next, current.is_prefill});
  (current.is_prefill ? stats_.overlapped_prefill_steps : stats_.overlapped_steps)++;
  return next;
}

void LLMEngine::record_step(bool is_prefill, int scheduled_tokens, int64_t context_tokens, double seconds,
                            double queue_seconds) {
  // A step whose every row was dropped (all its sequences stopped at EOS a step late) is not counted.
  if (is_prefill) {
    stats_.steps++, stats_.prefill_steps++;
    stats_.prefill_tokens += scheduled_tokens, stats_.prefill_seconds += seconds;
  } else if (scheduled_tokens > 0) {
    stats_.steps++, stats_.decode_steps++;
    stats_.decode_tokens += scheduled_tokens, stats_.decode_seconds += seconds;
    stats_.decode_context_tokens += context_tokens;
    stats_.decode_queue_seconds += queue_seconds;
    stats_.decode_wait_seconds += model_runner_->last_run_times().wait_seconds;
  }
}

std::vector<GenerateOutput> LLMEngine::take_finished(const std::vector<Sequence*>& seqs,
                                                     const std::vector<bool>& was_finished,
                                                     const std::vector<Sequence*>& next,
                                                     std::chrono::steady_clock::time_point now) {
  std::vector<GenerateOutput> finished;
  std::vector<int64_t> retired_now;
  for (size_t i = 0; i < seqs.size(); i++) {
    Sequence* s = seqs[i];
    if (was_finished[i]) continue;
    // The first completion token: after the prefill step (or last chunk) of the prompt. A preempted
    // sequence keeps its tokens and this time; its recompute makes no new first token.
    if (s->num_completion_tokens() > 0 && s->times.first_token == std::chrono::steady_clock::time_point())
      s->times.first_token = now;
    if (!s->is_finished()) continue;
    s->times.finished = now;
    GenerateOutput out;
    out.seq_id = s->seq_id;
    out.prompt_token_ids.assign(s->token_ids.begin(), s->token_ids.begin() + s->num_prompt_tokens);
    out.token_ids = s->completion_token_ids();
    out.num_prefix_hit_blocks = s->num_prefix_hit_blocks;
    out.num_preemptions = s->num_preemptions;
    out.times = s->times;
    if (tokenizer_) out.text = tokenizer_->decode(out.token_ids, /*skip_unknown=*/true);  // ids past the tokenizer: ""
    finished.push_back(std::move(out));
    // A request retired by EOS here is still in the step now in flight: it is erased after that one.
    const bool in_next = std::find(next.begin(), next.end(), s) != next.end();
    if (in_next) retired_now.push_back(s->seq_id);
    else sequences_.erase(s->seq_id);
  }
  // Requests retired a step ago whose row the step just read still held: nothing refers to them now.
  for (int64_t id : retired_in_flight_) sequences_.erase(id);
  retired_in_flight_ = std::move(retired_now);
  return finished;
}

std::string LLMEngine::trace_line(const std::vector<Sequence*>& seqs, bool is_prefill, int64_t preemptions_before,
                                  const std::map<int64_t, int>& hits_before) const {
  // Called after schedule(), before the step runs: counters still show what this step will compute.
  std::ostringstream line;
  int tokens = 0;
  for (const Sequence* s : seqs) tokens += s->num_scheduled_tokens;
  line << "[step " << stats_.steps + 1 << "] " << (is_prefill ? "prefill" : "decode") << ": " << counted(seqs.size(), "seq")
       << ", " << counted(tokens, "token");
  if (is_prefill) {
    line << " |";
    for (const Sequence* s : seqs) {
      line << " seq " << s->seq_id << " [" << s->num_cached_tokens << ", " << s->num_cached_tokens + s->num_scheduled_tokens
           << ")";
      if (s->num_cached_tokens + s->num_scheduled_tokens < s->num_tokens()) line << " chunk of " << s->num_tokens();
      const int hits = s->num_prefix_hit_blocks - hits_before.at(s->seq_id);  // found in this step's allocation
      if (hits > 0) line << " prefix-hit " << hits << (hits == 1 ? " block" : " blocks");
      line << ";";
    }
  }
  int64_t preempted = scheduler_->num_preemptions() - preemptions_before;
  if (preempted > 0) line << " | preempted " << preempted << " (to the front of the waiting queue)";
  line << " | free blocks " << scheduler_->block_manager().num_free_blocks() << "/"
       << scheduler_->block_manager().num_blocks();
  return line.str();
}

std::vector<GenerateOutput> LLMEngine::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                const std::vector<SamplingParams>& params, bool progress) {
  if (params.size() != 1 && params.size() != prompts.size())
    fail("generate: ", params.size(), " sampling params for ", prompts.size(), " prompts");
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); i++) ids.push_back(add_request(prompts[i], params.size() == 1 ? params[0] : params[i]));
  return run_to_completion(ids, progress);
}

std::vector<GenerateOutput> LLMEngine::run_to_completion(const std::vector<int64_t>& ids, bool progress) {
  if (progress) log("%s", describe().c_str());
  std::map<int64_t, GenerateOutput> done;
  while (!is_finished()) {
    auto t0 = std::chrono::steady_clock::now();
    auto [finished, num_tokens] = step();
    for (GenerateOutput& out : finished) done[out.seq_id] = std::move(out);
    if (progress) {
      // nano-vllm's tqdm postfix: instantaneous rates of this step, scheduling time included.
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char line[128];
      std::snprintf(line, sizeof line, "Generating: %zu/%zu [%s: %d tok/s]", done.size(), ids.size(),
                    num_tokens > 0 ? "Prefill" : "Decode", int((num_tokens > 0 ? num_tokens : -num_tokens) / dt));
      show_progress(line);
    }
  }
  if (progress) end_progress();
  std::vector<GenerateOutput> outputs;
  for (int64_t id : ids) outputs.push_back(std::move(done.at(id)));
  return outputs;
}

std::vector<GenerateOutput> LLMEngine::generate(const std::vector<std::string>& prompts,
                                                const std::vector<SamplingParams>& params, bool progress) {
  if (!tokenizer_) fail("text prompts need a tokenizer: no tokenizer.json in ", config_.model, " (give --tokenizer DIR)");
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& p : prompts) ids.push_back(tokenizer_->encode(p));
  return generate(ids, params, progress);
}

}  // namespace nanovllm
