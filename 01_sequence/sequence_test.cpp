// Chapter 01's subject: Sequence and its counters, SamplingParams and EngineConfig validation, and the
// entry (LLMEngine: add_request, step, generate) on a tiny golden checkpoint on the CPU. The numbers are
// worked by hand from nano-vllm's definitions (engine/sequence.py, engine/llm_engine.py).
#include "01_sequence/sequence.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "01_sequence/cli/serving_metrics.h"
#include "01_sequence/engine_config.h"
#include "01_sequence/llm_engine.h"
#include "02_scheduler/scheduler.h"
#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

// Greedy for exactly max_tokens: a sampled EOS does not end the request early, so counts are known in advance.
SamplingParams greedy_all(int max_tokens) {
  SamplingParams p = greedy(max_tokens);
  p.ignore_eos = true;
  return p;
}

EngineConfig tiny_engine() {
  EngineConfig c;
  c.model = golden_dir("tiny-qwen3-a");
  c.device = "cpu";
  c.kvcache_block_size = 16;
  c.num_kvcache_blocks = 64;
  return c;
}

}  // namespace

TEST(Ch01_Sequence, BlocksOfTokens) {
  // 40 tokens in blocks of 16: blocks [0,16) [16,32) [32,40), the last holding 8.
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; i++) prompt[size_t(i)] = 100 + i;
  Sequence seq(7, prompt, greedy(4), 0, 16);
  EXPECT_EQ(seq.num_tokens(), 40);
  EXPECT_EQ(seq.num_prompt_tokens, 40);
  EXPECT_EQ(seq.num_completion_tokens(), 0);
  EXPECT_EQ(seq.num_blocks(), 3);
  EXPECT_EQ(seq.last_block_num_tokens(), 8);
  EXPECT_EQ(seq.block(1)[0], 116);
  EXPECT_EQ(seq.block(2)[7], 139);
  EXPECT_EQ(seq.last_token, 139);
  EXPECT_EQ(seq.status, SequenceStatus::WAITING);
  EXPECT_EQ(seq.num_cached_tokens, 0);
  EXPECT_TRUE(seq.block_table.empty());
}

TEST(Ch01_Sequence, AppendingCrossesABlockBoundary) {
  // 32 tokens fill two blocks exactly; the 33rd opens a third holding 1 token.
  Sequence seq(0, std::vector<int32_t>(32, 5), greedy(4), 0, 16);
  EXPECT_EQ(seq.num_blocks(), 2);
  EXPECT_EQ(seq.last_block_num_tokens(), 16);
  seq.append_token(9);
  EXPECT_EQ(seq.num_blocks(), 3);
  EXPECT_EQ(seq.last_block_num_tokens(), 1);
  EXPECT_EQ(seq.last_token, 9);
  EXPECT_EQ(seq.num_completion_tokens(), 1);
  EXPECT_EQ(seq.completion_token_ids(), std::vector<int32_t>{9});
}

TEST(Ch01_Sequence, BadRequestsAreNamed) {
  EXPECT_EQ(error_of([] { Sequence(3, {}, greedy(1), 0, 16); }), "request 3: the prompt is empty");
  SamplingParams p = greedy(1);
  p.temperature = -1;
  EXPECT_EQ(error_of([&] { Sequence(0, {1}, p, 0, 16); }), "temperature must be >= 0 (0 = greedy), got -1");
  // A block holds at least one token: with 0, num_blocks() would divide by zero.
  EXPECT_EQ(error_of([] { Sequence(0, {1}, greedy(1), 0, 0); }), "block size must be >= 1, got 0");
  EXPECT_EQ(error_of([] { Sequence(0, {1}, greedy(1), 0, 1); }), "");
}

TEST(Ch01_SamplingParams, ValidationNamesTheField) {
  SamplingParams p;
  EXPECT_EQ(error_of([&] { p.validate(); }), "");
  p.max_tokens = 0;
  EXPECT_EQ(error_of([&] { p.validate(); }), "max_tokens must be >= 1, got 0");
  p = SamplingParams();
  p.top_k = -2;
  EXPECT_EQ(error_of([&] { p.validate(); }), "top_k must be >= 0 (0 = off), got -2");
  p = SamplingParams();
  p.top_p = 0;
  EXPECT_NE(error_of([&] { p.validate(); }).find("top_p must be in (0, 1]"), std::string::npos);
  p = SamplingParams();
  p.temperature = 0;
  EXPECT_TRUE(p.is_greedy());
  EXPECT_EQ(error_of([&] { p.validate(); }), "");  // 0 is greedy, not an error
}

TEST(Ch01_SamplingParams, EachRangeIsCheckedAtItsEdgesAndAgainstNaN) {
  // The ranges of sampling_params.h, one value on each side of each edge: temperature >= 0 and finite (a NaN
  // compares false with everything, so "temperature < 0" alone lets it through, and an infinite temperature
  // makes every logit 0), top_k >= 0 (-1, vLLM's "off", is not this engine's 0), top_p in (0, 1] (the float
  // just above 1 and a NaN are outside it). These reach the engine from the library API, which no flag parser guards.
  auto error_with = [](auto set) {
    SamplingParams p;
    set(p);
    return error_of([&] { p.validate(); });
  };
  const std::string temperature = "temperature must be >= 0 (0 = greedy), got ";
  EXPECT_EQ(error_with([](SamplingParams& p) { p.temperature = NAN; }).rfind(temperature, 0), 0u);
  EXPECT_EQ(error_with([](SamplingParams& p) { p.temperature = INFINITY; }).rfind(temperature, 0), 0u);
  EXPECT_EQ(error_with([](SamplingParams& p) { p.temperature = 1e30f; }), "");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_k = -1; }), "top_k must be >= 0 (0 = off), got -1");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_k = 0; }), "");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.max_tokens = 1; }), "");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_p = 1; }), "");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_p = std::nextafter(0.0f, 1.0f); }), "");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_p = std::nextafter(1.0f, 2.0f); }),
            "top_p must be in (0, 1], got 1.00000012");  // 1 + 2^-23, printed to 9 digits so that it is not "1"
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_p = 1.5f; }), "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(error_with([](SamplingParams& p) { p.top_p = NAN; }).rfind("top_p must be in (0, 1], got ", 0), 0u);
}

TEST(Ch01_EngineConfig, ValidationNamesTheSetting) {
  EngineConfig c;
  EXPECT_EQ(error_of([&] { c.validate(); }), "");
  c.kvcache_block_size = 24;
  EXPECT_EQ(error_of([&] { c.validate(); }), "block size must be a positive multiple of 16, got 24");
  c = EngineConfig();
  c.tensor_parallel_size = 9;
  EXPECT_EQ(error_of([&] { c.validate(); }), "tensor_parallel_size must be in [1, 8], got 9");
  c = EngineConfig();
  c.linear_version = 9;
  EXPECT_EQ(error_of([&] { c.validate(); }), "linear_version must be in [1, 8], got 9");
  c = EngineConfig();
  c.device = "tpu";
  EXPECT_EQ(error_of([&] { c.validate(); }), "device must be cpu or cuda, got 'tpu'");
  c = EngineConfig();
  c.collectives = "nccl";
  EXPECT_EQ(error_of([&] { c.validate(); }), "collectives must be spin or events, got 'nccl'");
}

TEST(Ch01_EngineConfig, EachSettingIsCheckedAtTheLowEndOfItsRange) {
  // The test above checks the high ends; a bound left out at the low end (a count of 0, a block size of 0,
  // which "% 16 == 0" alone accepts) went unnoticed. Each setting one past its low end, and at it; and
  // gpu_memory_utilization, which the test above leaves out, one past its high end too.
  auto error_with = [](auto set) {
    EngineConfig c;
    set(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_EQ(error_with([](EngineConfig& c) { c.max_num_batched_tokens = 0; }), "max_num_batched_tokens must be >= 1, got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.max_num_seqs = 0; }), "max_num_seqs must be >= 1, got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.max_model_len = 0; }), "max_model_len must be >= 1, got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.cpu_memory_mib = 0; }), "cpu_memory_mib must be >= 1, got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.tensor_parallel_size = 0; }), "tensor_parallel_size must be in [1, 8], got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.linear_version = 0; }), "linear_version must be in [1, 8], got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.kvcache_block_size = 0; }),
            "block size must be a positive multiple of 16, got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.kvcache_block_size = -16; }),
            "block size must be a positive multiple of 16, got -16");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.num_kvcache_blocks = 0; }), "kv cache blocks must be >= 1, got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.num_kvcache_blocks = -2; }), "kv cache blocks must be >= 1, got -2");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.gpu_memory_utilization = 0; }),
            "gpu_memory_utilization must be in (0, 1], got 0");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.gpu_memory_utilization = 1.5f; }),
            "gpu_memory_utilization must be in (0, 1], got 1.5");
  // The low ends themselves are taken (-1 blocks: as many as memory allows).
  EXPECT_EQ(error_with([](EngineConfig& c) {
              c.max_num_batched_tokens = c.max_num_seqs = c.max_model_len = c.cpu_memory_mib = 1;
              c.tensor_parallel_size = c.linear_version = c.num_kvcache_blocks = 1;
              c.kvcache_block_size = 16;
              c.gpu_memory_utilization = 1;
            }),
            "");
  EXPECT_EQ(error_with([](EngineConfig& c) { c.num_kvcache_blocks = -1; }), "");
}

TEST(Ch01_LLMEngine, StepCountsTokensLikeNanoVllm) {
  // nano-vllm's step() returns the prefill's token count, or minus the number of sequences in decode.
  LLMEngine engine(tiny_engine());
  engine.add_request({1, 2, 3, 4, 5}, greedy(3));
  engine.add_request({6, 7}, greedy(3));
  auto [finished, num_tokens] = engine.step();  // one prefill step for both prompts
  EXPECT_TRUE(finished.empty());
  EXPECT_EQ(num_tokens, 7);
  std::tie(finished, num_tokens) = engine.step();  // a decode step of two sequences
  EXPECT_EQ(num_tokens, -2);
  std::tie(finished, num_tokens) = engine.step();  // the third token: both finish
  ASSERT_EQ(finished.size(), 2u);
  EXPECT_EQ(finished[0].token_ids.size(), 3u);
  EXPECT_TRUE(engine.is_finished());
  // A step with nothing to run is the caller's mistake, named as such (it read as an internal error).
  try {
    engine.step();
    ADD_FAILURE() << "step() ran with nothing to run";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "LLMEngine::step: no request left to run (is_finished())");
  }
}

TEST(Ch01_LLMEngine, GenerateReturnsOutputsInPromptOrder) {
  // The same prompt alone and inside a batch gives the same greedy tokens, in its own slot.
  LLMEngine engine(tiny_engine());
  const std::vector<int32_t> a = {11, 12, 13, 14}, b = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  std::vector<GenerateOutput> alone = engine.generate(std::vector<std::vector<int32_t>>{b}, {greedy(5)});
  std::vector<GenerateOutput> both = engine.generate(std::vector<std::vector<int32_t>>{a, b}, {greedy(5)});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].prompt_token_ids, a);
  EXPECT_EQ(both[1].prompt_token_ids, b);
  EXPECT_EQ(both[1].token_ids, alone[0].token_ids);
}

TEST(Ch01_LLMEngine, RequestTimesComeFromTheStepsThatMadeTheTokens) {
  // A token budget of 16 (chunked prefill, scheduler.cpp): A (5 tokens) is prefilled in step 1; B (40
  // tokens) cannot join it and is prefilled alone in chunks of 16, 16 and 8, steps 2 to 4, its first
  // token coming with the last chunk; then decode: step 5 gives both their second token (B, max_tokens
  // 2, finishes), step 6 gives A its third (A finishes). Each time the engine stamps must fall inside
  // the step that made the token, which the test times from outside.
  EngineConfig config = tiny_engine();
  config.max_num_batched_tokens = 16;
  LLMEngine engine(config);
  const SamplingParams three = greedy_all(3), two = greedy_all(2);
  std::vector<int32_t> b_prompt(40);
  for (int i = 0; i < 40; i++) b_prompt[size_t(i)] = 100 + i;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point added = Clock::now();
  engine.add_request({1, 2, 3, 4, 5}, three);
  engine.add_request(b_prompt, two);
  const Clock::time_point queued = Clock::now();
  std::vector<std::pair<Clock::time_point, Clock::time_point>> step_times;  // [start, end] of steps 1, 2, ...
  std::map<int64_t, GenerateOutput> done;
  std::map<int64_t, size_t> finished_in;  // request -> the step (1-based) that returned it
  while (!engine.is_finished()) {
    const Clock::time_point start = Clock::now();
    auto [finished, num_tokens] = engine.step();
    step_times.push_back({start, Clock::now()});
    for (GenerateOutput& o : finished) finished_in[o.seq_id] = step_times.size(), done[o.seq_id] = std::move(o);
  }
  ASSERT_EQ(step_times.size(), 6u);
  EXPECT_EQ(finished_in, (std::map<int64_t, size_t>{{0, 6}, {1, 5}}));
  auto in_step = [&](Clock::time_point t, size_t step) {
    return step_times[step - 1].first <= t && t <= step_times[step - 1].second;
  };
  for (const auto& [id, o] : done) {
    EXPECT_TRUE(added <= o.times.arrival && o.times.arrival <= queued) << "request " << id;
    EXPECT_TRUE(in_step(o.times.finished, finished_in[id])) << "request " << id;
  }
  EXPECT_TRUE(in_step(done[0].times.first_token, 1));  // A: its prefill step
  EXPECT_TRUE(in_step(done[1].times.first_token, 4));  // B: its last chunk, not its first
}

TEST(Ch01_LLMEngine, ServingMetricsOfARunStayInsideItsWallTime) {
  // Over a generate() of requests of different lengths: every request's TTFT and its whole latency are
  // within generate()'s wall time, and a 99th percentile is never below the median.
  LLMEngine engine(tiny_engine());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 6; i++) {
    prompts.push_back(std::vector<int32_t>(size_t(3 + 7 * i), 10 + i));
    params.push_back(greedy_all(2 + 3 * i));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<GenerateOutput> outputs = engine.generate(prompts, params);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<RequestTiming> timings;
  for (const GenerateOutput& o : outputs) {
    auto since_t0 = [&](std::chrono::steady_clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
    timings.push_back({since_t0(o.times.arrival), since_t0(o.times.first_token), since_t0(o.times.finished),
                       int(o.token_ids.size())});
    const RequestTiming& r = timings.back();
    EXPECT_TRUE(0 <= r.arrival && r.arrival < r.first_token && r.first_token < r.finished && r.finished <= wall)
        << "request " << o.seq_id << ": " << r.arrival << " " << r.first_token << " " << r.finished << " of " << wall;
  }
  const ServingMetrics m = serving_metrics(timings);
  EXPECT_EQ(m.requests, 6);
  EXPECT_EQ(m.tpot_requests, 6);  // every request outputs at least 2 tokens
  EXPECT_GT(m.ttft_median, 0);
  EXPECT_LE(m.ttft_median, m.ttft_p99);
  EXPECT_LE(m.ttft_p99, wall);
  EXPECT_GT(m.tpot_median, 0);
  EXPECT_LE(m.tpot_median, m.tpot_p99);
  EXPECT_LE(m.tpot_p99, wall);
}

TEST(Ch01_LLMEngine, HostTimesOfDecodeStepsLieInsideThem) {
  // EngineStats splits the decode steps' time into queuing launches, waiting for tokens and the rest
  // (bench prints the three). Each part is timed inside the steps, so none may be negative and the two
  // timed parts never exceed the whole: a launch counted in a step that did not make it (the last step of
  // the overlapped loop, which launches none ahead) broke this in one to three of these 24 runs on the CPU, where
  // a launch is the whole forward pass.
  LLMEngine engine(tiny_engine());
  ASSERT_TRUE(engine.config().overlap_steps);
  for (int run = 0; run < 24; run++) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i <= run % 4; i++) {
      prompts.push_back(std::vector<int32_t>(size_t(4 + 5 * i), 20 + i));
      params.push_back(greedy_all(3 + 4 * i + run % 3));
    }
    const EngineStats before = engine.stats();
    engine.generate(prompts, params);
    const EngineStats& after = engine.stats();
    const double queue = after.decode_queue_seconds - before.decode_queue_seconds;
    const double wait = after.decode_wait_seconds - before.decode_wait_seconds;
    const double whole = after.decode_seconds - before.decode_seconds;
    EXPECT_GE(queue, 0) << "run " << run;
    EXPECT_GE(wait, 0) << "run " << run;
    EXPECT_LE(queue + wait, whole) << "run " << run;
  }
  EXPECT_GT(engine.stats().overlapped_steps, 0) << "the loop never launched a step ahead";
  // On the CPU a launch is the whole forward pass: the time queuing decode steps cannot be nothing.
  EXPECT_GT(engine.stats().decode_queue_seconds, 0);
}

TEST(Ch01_LLMEngine, AddRequestRefusesIdsOutsideTheVocabulary) {
  LLMEngine engine(tiny_engine());
  EXPECT_EQ(error_of([&] { engine.add_request({1, 512}, greedy(1)); }),
            "request 0: token id 512 is outside the vocabulary [0, 512)");
  EXPECT_TRUE(engine.is_finished());  // nothing was queued
}

TEST(Ch01_LLMEngine, StatsCountTheTokensOfEachPhase) {
  // Worked by hand: prompts of 5 and 2 tokens, 3 tokens each (EOS ignored). One prefill step of 7 tokens
  // makes the first tokens; two decode steps make the other two of each. A decode step reads the K/V of
  // every token of a sequence, the one it feeds included (nano-vllm's context_lens = len(seq)): 6 + 3 in
  // the first, 7 + 4 in the second, 20 in all. The overlapped loop and the plain one count alike.
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped loop" : "plain loop");
    EngineConfig config = tiny_engine();
    config.overlap_steps = overlap;
    LLMEngine engine(config);
    const SamplingParams three = greedy_all(3);
    engine.generate(std::vector<std::vector<int32_t>>{{1, 2, 3, 4, 5}, {6, 7}}, {three});
    const EngineStats& s = engine.stats();
    EXPECT_EQ(s.prefill_steps, 1);
    EXPECT_EQ(s.prefill_tokens, 7);
    EXPECT_EQ(s.decode_steps, 2);
    EXPECT_EQ(s.decode_tokens, 4);
    EXPECT_EQ(s.decode_context_tokens, 20);
    EXPECT_EQ(s.steps, 3);
  }
}

TEST(Ch01_LLMEngine, ChunkedPrefillStepsCountOnlyTheirChunk) {
  // nano-vllm's prefill count is sum(num_scheduled_tokens): with a budget of 16, a 40-token prompt is
  // computed in chunks of 16, 16 and 8, and each step returns its chunk, not the whole prompt.
  EngineConfig config = tiny_engine();
  config.max_num_batched_tokens = 16;
  LLMEngine engine(config);
  const SamplingParams two = greedy_all(2);
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; i++) prompt[size_t(i)] = 100 + i;
  engine.add_request(prompt, two);
  std::vector<int> counts;
  while (!engine.is_finished()) counts.push_back(engine.step().second);
  EXPECT_EQ(counts, (std::vector<int>{16, 16, 8, -1}));
  EXPECT_EQ(engine.stats().prefill_tokens, 40);
}

TEST(Ch01_LLMEngine, RequestsStoppedByEosAreReturnedOnceAndTheirDroppedRowsCountNothing) {
  // The overlapped loop learns of an EOS a step late: the step launched ahead computes a row for the
  // stopped request and drops it. Worked from nano-vllm's definitions, whichever loop runs: every request
  // is returned by exactly one step; the prefill steps count the prompts' tokens, the decode steps one
  // token per completion token after the first (step() returns minus that), as the statistics do; and
  // once is_finished(), a new request is prefilled by the very next step, nothing left over.
  const std::vector<int32_t> a = {1, 2, 3, 4, 5}, b = {6, 7};
  SamplingParams stops;  // a: sampled from a seed of its own, the same tokens in any batch
  stops.temperature = 1.0f;
  stops.max_tokens = 10;
  stops.seed = 7;
  SamplingParams free_run = stops, runs_on = greedy(8);
  free_run.ignore_eos = runs_on.ignore_eos = true;
  const std::vector<int32_t> a_free = LLMEngine(tiny_engine()).generate({a}, {free_run})[0].token_ids;
  // The EOS: the first token of a's free run first met at index 2 or later, so that a stops in a decode
  // step read while the next one is in flight.
  size_t stop = 2;
  while (stop < a_free.size() && std::find(a_free.begin(), a_free.begin() + long(stop), a_free[stop]) !=
                                     a_free.begin() + long(stop))
    stop++;
  ASSERT_LT(stop, a_free.size());
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped loop" : "plain loop");
    EngineConfig config = tiny_engine();
    config.overlap_steps = overlap;
    config.eos = {a_free[stop]};
    LLMEngine engine(config);
    engine.add_request(a, stops);
    engine.add_request(b, runs_on);
    std::map<int64_t, int> returned;
    std::map<int64_t, std::vector<int32_t>> tokens;
    int prefill_tokens = 0, decode_tokens = 0;
    while (!engine.is_finished()) {
      auto [finished, num_tokens] = engine.step();
      if (num_tokens > 0) prefill_tokens += num_tokens;
      else decode_tokens -= num_tokens;
      for (const GenerateOutput& o : finished) returned[o.seq_id]++, tokens[o.seq_id] = o.token_ids;
    }
    EXPECT_EQ(returned, (std::map<int64_t, int>{{0, 1}, {1, 1}}));
    EXPECT_EQ(tokens[0], std::vector<int32_t>(a_free.begin(), a_free.begin() + long(stop) + 1));  // EOS kept
    ASSERT_EQ(tokens[1].size(), 8u);
    EXPECT_EQ(prefill_tokens, 7);
    EXPECT_EQ(decode_tokens, int(stop) + 7);  // a: stop + 1 tokens, b: 8, less each one's first
    EXPECT_EQ(engine.stats().decode_tokens, decode_tokens);
    const int decode_steps = std::max(int(stop), 7);  // a decodes stop tokens, b 7, side by side
    EXPECT_EQ(engine.stats().decode_steps, decode_steps);
    if (overlap) {
      EXPECT_GT(engine.stats().overlapped_steps, 0) << "no step was launched ahead: the test lost its point";
    }
    // a alone stops at the EOS again, after stop more decode steps (a step whose only row is dropped is
    // no decode step); then the next request's prefill is the very next step.
    engine.add_request(a, stops);
    while (!engine.is_finished()) engine.step();
    EXPECT_EQ(engine.stats().decode_steps, decode_steps + int(stop));
    engine.add_request(b, runs_on);
    EXPECT_EQ(engine.step().second, 2);
  }
}

TEST(Ch01_LLMEngine, RefusedRequestsTakeNoId) {
  // Ids count the requests accepted, in order of arrival (sequence.h): a refused request, whether refused
  // for a token id (add_request) or for its length (Scheduler::add), does not take one, and a negative
  // token id is outside the vocabulary as much as one past its end.
  EngineConfig config = tiny_engine();
  config.max_model_len = 64;
  LLMEngine engine(config);
  EXPECT_EQ(error_of([&] { engine.add_request({3, -1}, greedy(1)); }),
            "request 0: token id -1 is outside the vocabulary [0, 512)");
  EXPECT_EQ(error_of([&] { engine.add_request(std::vector<int32_t>(62, 1), greedy(4)); }),
            "request 0: prompt (62 tokens) + max_tokens (4) exceeds max_model_len (64)");
  EXPECT_EQ(engine.add_request({1, 2}, greedy(1)), 0);
  EXPECT_EQ(engine.add_request({3}, greedy(1)), 1);
}

TEST(Ch01_LLMEngine, RequestsWithoutASeedDrawDifferentStreams) {
  // add_request derives a request's seed from the engine's seed and its id: reproducible from one engine
  // to the next, and different for every request, so that the same prompt sampled twice in one run is not
  // the same completion twice.
  SamplingParams sampled;
  sampled.temperature = 2.0f;
  sampled.max_tokens = 16;
  sampled.ignore_eos = true;
  const std::vector<std::vector<int32_t>> same_prompt_twice = {{1, 2, 3}, {1, 2, 3}};
  const std::vector<GenerateOutput> first = LLMEngine(tiny_engine()).generate(same_prompt_twice, {sampled});
  const std::vector<GenerateOutput> again = LLMEngine(tiny_engine()).generate(same_prompt_twice, {sampled});
  EXPECT_NE(first[0].token_ids, first[1].token_ids);
  EXPECT_EQ(first[0].token_ids, again[0].token_ids);
  EXPECT_EQ(first[1].token_ids, again[1].token_ids);
}

TEST(Ch01_LLMEngine, GenerateTakesOneParamsPerPromptOrOneForAll) {
  // params has one entry per prompt (each request its own max_tokens here), or one for all; any other
  // count is the caller's mistake, named.
  LLMEngine engine(tiny_engine());
  const std::vector<SamplingParams> params = {greedy_all(2), greedy_all(5), greedy_all(3)};
  const std::vector<std::vector<int32_t>> prompts = {{1, 2}, {3, 4, 5}, {6}};
  std::vector<GenerateOutput> outputs = engine.generate(prompts, params);
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[0].token_ids.size(), 2u);
  EXPECT_EQ(outputs[1].token_ids.size(), 5u);
  EXPECT_EQ(outputs[2].token_ids.size(), 3u);
  EXPECT_EQ(error_of([&] { engine.generate(prompts, {params[0], params[1]}); }),
            "generate: 2 sampling params for 3 prompts");
  EXPECT_TRUE(engine.is_finished());  // nothing was queued
}

TEST(Ch01_LLMEngine, RunToCompletionReturnsOutputsInTheOrderOfItsIds) {
  // run_to_completion's outputs follow `ids` as given, not the order the requests arrived in.
  LLMEngine engine(tiny_engine());
  const SamplingParams two = greedy_all(2), four = greedy_all(4);
  const int64_t first = engine.add_request({1, 2, 3}, two);
  const int64_t second = engine.add_request({4, 5}, four);
  std::vector<GenerateOutput> outputs = engine.run_to_completion({second, first});
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].seq_id, second);
  EXPECT_EQ(outputs[0].prompt_token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(outputs[0].token_ids.size(), 4u);
  EXPECT_EQ(outputs[1].seq_id, first);
  EXPECT_EQ(outputs[1].token_ids.size(), 2u);
}

TEST(Ch01_LLMEngine, OutputsCountTheirPreemptions) {
  // A pool of 4 blocks of 16 tokens and two requests that each grow to 16 + 40 - 1 = 55 tokens (4 blocks):
  // both cannot run together to the end. nano-vllm preempts the newest running sequence, so the second is
  // preempted once, waits (its recompute needs more blocks than are free) until the first finishes, then
  // runs alone; the first never is. Each output carries its own count.
  EngineConfig config = tiny_engine();
  config.num_kvcache_blocks = 4;
  LLMEngine engine(config);
  const SamplingParams forty = greedy_all(40);
  std::vector<GenerateOutput> outputs =
      engine.generate({std::vector<int32_t>(16, 3), std::vector<int32_t>(16, 4)}, {forty});
  ASSERT_GT(engine.scheduler().num_preemptions(), 0) << "the pool did not preempt: the test lost its point";
  EXPECT_EQ(engine.scheduler().num_preemptions(), 1);
  EXPECT_EQ(outputs[0].num_preemptions, 0);
  EXPECT_EQ(outputs[1].num_preemptions, 1);
  EXPECT_EQ(outputs[0].token_ids.size(), 40u);
  EXPECT_EQ(outputs[1].token_ids.size(), 40u);
}
