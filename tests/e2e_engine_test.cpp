// The whole engine (scheduler + block manager + model runner + sampler) on the CPU:
//  - greedy generation reproduces Hugging Face's greedy tokens (golden), up to the first step whose
//    golden top-1/top-2 margin is below the CPU path's noise (1e-3);
//  - the same greedy outputs, token for token, whatever the block size, batching, token budget (chunked
//    prefill) and KV pool size (preemption), and with prompts sharing a prefix (prefix-cache hits);
//  - seeded sampling is reproducible and does not depend on scheduling;
//  - random workloads (prompt and output lengths at block edges, shared and repeated prompts, greedy and
//    seeded requests) give the same tokens under tight pools, budgets and batch limits;
//  - a request's top_k / top_p reach the sampler, and requests without a seed draw their own tokens;
//  - generate gives each prompt its own params and returns outputs in prompt order; a caller stepping the
//    engine itself gets each request once, and its first-token time after its last prefill chunk;
//  - bad requests are refused with clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>

#include "01_sequence/llm_engine.h"
#include "02_scheduler/scheduler.h"
#include "04_model_runner/model_runner.h"
#include "tests/test_util.h"

using namespace nanovllm;

namespace {

struct Golden {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> tokens;   // 24 greedy steps each
  std::vector<std::vector<double>> margins;
};

Golden load_golden(const std::string& model) {
  Json golden = test::read_json(test::data_path("golden/" + model + ".golden.json"));
  Golden g;
  for (const Json& c : golden.at("cases").as_array()) {
    std::vector<int32_t> prompt, tokens;
    std::vector<double> margins;
    for (const Json& id : c.at("prompt_ids").as_array()) prompt.push_back(int32_t(id.as_int64()));
    for (const Json& s : c.at("greedy").as_array()) {
      tokens.push_back(int32_t(s.at("token").as_int64()));
      margins.push_back(s.at("margin").as_double());
    }
    g.prompts.push_back(prompt), g.tokens.push_back(tokens), g.margins.push_back(margins);
  }
  return g;
}

EngineConfig config_for(const std::string& model) {
  EngineConfig c;
  c.model = test::data_path("golden/" + model);
  c.device = "cpu";
  return c;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

std::vector<std::vector<int32_t>> completions(const std::vector<GenerateOutput>& outputs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& o : outputs) out.push_back(o.token_ids);
  return out;
}

}  // namespace

TEST(E2E_Engine, GreedyMatchesTransformersUpToTheNoiseMargin) {
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load_golden(model);
    LLMEngine engine(config_for(model));
    auto outputs = engine.generate(g.prompts, {greedy(24)});
    ASSERT_EQ(outputs.size(), g.prompts.size());
    for (size_t i = 0; i < g.prompts.size(); i++) {
      // max_tokens 24 with ignore_eos: exactly 24 tokens, as many as the golden steps.
      ASSERT_EQ(outputs[i].token_ids.size(), 24u) << model << " case " << i;
      ASSERT_EQ(g.tokens[i].size(), 24u) << model << " case " << i;
      for (size_t step = 0; step < 24; step++) {
        ASSERT_EQ(outputs[i].token_ids[step], g.tokens[i][step]) << model << " case " << i << " step " << step;
        if (g.margins[i][step] < 1e-3) break;  // beyond this the reference itself is a coin toss
      }
    }
  }
}

TEST(E2E_Engine, SameGreedyOutputsUnderEveryEngineShape) {
  // Reference: default engine, all prompts at once. Then every combination of block size, batching,
  // tiny token budget (chunked prefill) and tiny KV pool (preemption) must give identical tokens.
  Golden g = load_golden("tiny-qwen3-b");
  const int kTokens = 12;
  std::vector<std::vector<int32_t>> reference = completions(LLMEngine(config_for("tiny-qwen3-b")).generate(g.prompts, {greedy(kTokens)}));
  int64_t preemptions = 0, chunks = 0;
  for (int block_size : {16, 64, 256}) {
    for (bool one_at_a_time : {false, true}) {
      for (bool tiny_budget : {false, true}) {
        for (bool tiny_pool : {false, true}) {
          EngineConfig c = config_for("tiny-qwen3-b");
          c.kvcache_block_size = block_size;
          if (tiny_budget) c.max_num_batched_tokens = 100;
          // The longest request needs ceil((600 + 12 - 1) / bs) blocks; give little more than that.
          if (tiny_pool) c.num_kvcache_blocks = ceil_div(600 + kTokens - 1, block_size) + 1;
          SCOPED_TRACE("block " + std::to_string(block_size) + (one_at_a_time ? " one-at-a-time" : " batched") +
                       (tiny_budget ? " budget-100" : "") + (tiny_pool ? " tiny-pool" : ""));
          LLMEngine engine(c);
          std::vector<std::vector<int32_t>> got;
          if (one_at_a_time) {
            for (const auto& prompt : g.prompts) got.push_back(engine.generate({prompt}, {greedy(kTokens)})[0].token_ids);
          } else {
            got = completions(engine.generate(g.prompts, {greedy(kTokens)}));
          }
          EXPECT_EQ(got, reference);
          preemptions += engine.scheduler().num_preemptions();
          chunks += engine.scheduler().num_chunked_prefills();
        }
      }
    }
  }
  EXPECT_GT(preemptions, 0) << "no configuration preempted: the test lost its point";
  EXPECT_GT(chunks, 0) << "no configuration chunked a prefill";
}

TEST(E2E_Engine, TensorParallelRanksGiveTheSameGreedyTokens) {
  // 2 and 4 ranks (4 only where the heads split: tiny-qwen3-a), with chunking and preemption on top.
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load_golden(model);
    const std::vector<std::vector<int32_t>> reference = completions(LLMEngine(config_for(model)).generate(g.prompts, {greedy(12)}));
    for (int tp : model == "tiny-qwen3-a" ? std::vector<int>{2, 4} : std::vector<int>{2}) {
      SCOPED_TRACE(model + " tp " + std::to_string(tp));
      EngineConfig c = config_for(model);
      c.tensor_parallel_size = tp;
      c.kvcache_block_size = 16;
      c.max_num_batched_tokens = 100;
      c.num_kvcache_blocks = ceil_div(600 + 12 - 1, 16) + 1;
      LLMEngine engine(c);
      EXPECT_EQ(completions(engine.generate(g.prompts, {greedy(12)})), reference);
      // Every rank ran every step.
      ASSERT_EQ(engine.model_runner().rank_steps().size(), size_t(tp));
      for (int64_t steps : engine.model_runner().rank_steps()) EXPECT_EQ(steps, engine.stats().steps);
    }
  }
}

TEST(E2E_Engine, SharedPrefixHitsTheCacheAndChangesNothing) {
  Golden g = load_golden("tiny-qwen3-a");
  std::vector<int32_t> prefix = g.prompts.back();  // 600 tokens
  prefix.resize(300);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; i++) {
    std::vector<int32_t> p = prefix;
    for (int k = 0; k <= i * 7; k++) p.push_back(int32_t((37 * k + i) % 512));
    prompts.push_back(p);
  }
  EngineConfig c = config_for("tiny-qwen3-a");
  c.kvcache_block_size = 64;
  // One at a time, so that each later request finds the earlier ones' blocks computed and hashed.
  LLMEngine cached(c);
  std::vector<std::vector<int32_t>> got;
  std::vector<int> hits;
  for (const auto& p : prompts) {
    auto out = cached.generate({p}, {greedy(8)});
    got.push_back(out[0].token_ids);
    hits.push_back(out[0].num_prefix_hit_blocks);
  }
  // 300 shared tokens = 4 full blocks of 64; the first request has nothing to hit.
  EXPECT_EQ(hits, (std::vector<int>{0, 4, 4, 4}));
  EXPECT_EQ(cached.scheduler().block_manager().total_hit_blocks(), 12);
  // The same prompts each in a fresh engine (no cache at all) give the same tokens.
  for (size_t i = 0; i < prompts.size(); i++)
    EXPECT_EQ(LLMEngine(c).generate({prompts[i]}, {greedy(8)})[0].token_ids, got[i]) << "prompt " << i;
}

TEST(E2E_Engine, SeededSamplingIsReproducibleAndIndependentOfScheduling) {
  Golden g = load_golden("tiny-qwen3-a");
  SamplingParams p;
  p.temperature = 0.8f;
  p.max_tokens = 16;
  p.ignore_eos = true;
  EngineConfig c = config_for("tiny-qwen3-a");
  c.seed = 42;
  auto a = completions(LLMEngine(c).generate(g.prompts, {p}));
  auto b = completions(LLMEngine(c).generate(g.prompts, {p}));
  EXPECT_EQ(a, b);
  // A tiny pool and budget change every step's batch, not the tokens.
  EngineConfig tight = c;
  tight.kvcache_block_size = 16;
  tight.num_kvcache_blocks = 40;
  tight.max_num_batched_tokens = 64;
  LLMEngine tight_engine(tight);
  EXPECT_EQ(completions(tight_engine.generate(g.prompts, {p})), a);
  EXPECT_GT(tight_engine.scheduler().num_preemptions(), 0);
  // Another seed draws other tokens.
  c.seed = 43;
  EXPECT_NE(completions(LLMEngine(c).generate(g.prompts, {p})), a);
  // A request's own seed wins over the engine's.
  p.seed = 7;
  auto own1 = completions(LLMEngine(c).generate({g.prompts[2]}, {p}));
  c.seed = 99;
  auto own2 = completions(LLMEngine(c).generate({g.prompts[2]}, {p}));
  EXPECT_EQ(own1, own2);
}

TEST(E2E_Engine, EosStopsGenerationUnlessIgnored) {
  // Model a's config says eos = 2. Find the greedy continuation, then declare its 3rd token an EOS id.
  Golden g = load_golden("tiny-qwen3-a");
  EngineConfig c = config_for("tiny-qwen3-a");
  std::vector<int32_t> free_run = LLMEngine(c).generate({g.prompts[3]}, {greedy(10)})[0].token_ids;
  c.eos = {free_run[2]};
  SamplingParams stop = greedy(10);
  stop.ignore_eos = false;
  std::vector<int32_t> stopped = LLMEngine(c).generate({g.prompts[3]}, {stop})[0].token_ids;
  size_t first = std::find(free_run.begin(), free_run.end(), free_run[2]) - free_run.begin();
  EXPECT_EQ(stopped, std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));  // EOS kept
  // Unless ignored: with the same EOS id, ignore_eos runs to max_tokens, through the EOS, as the free run did.
  ASSERT_EQ(free_run.size(), 10u);
  EXPECT_EQ(LLMEngine(c).generate({g.prompts[3]}, {greedy(10)})[0].token_ids, free_run);
}

TEST(E2E_Engine, OverlappedStepsChangeNoOutput) {
  // The plain loop (overlap_steps off, nano-vllm's) is the reference for the overlapped one, where decode
  // step n + 1 is launched before step n's tokens are read. Requests of different lengths, some stopped by
  // EOS (which the overlapped loop learns of a step late: that step computes a row for them and drops it),
  // greedy and sampled, in the default engine and in one with a pool and budget small enough to chunk and to
  // preempt (where the overlapped loop must wait for the tokens before it schedules).
  Golden g = load_golden("tiny-qwen3-a");
  std::vector<std::vector<int32_t>> prompts = g.prompts;
  for (int i = 0; i < 4; i++) {  // short prompts, so that their requests decode beside the long ones' prefills
    std::vector<int32_t> p;
    for (int k = 0; k < 5 + i; k++) p.push_back(int32_t((37 * k + 11 * i + 1) % 512));
    prompts.push_back(p);
  }
  EngineConfig c = config_for("tiny-qwen3-a");
  c.seed = 5;
  // An EOS id the free runs meet: the third greedy token of the fourth prompt.
  c.eos = {LLMEngine(c).generate({g.prompts[3]}, {greedy(10)})[0].token_ids[2]};
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < prompts.size(); i++) {
    SamplingParams p = greedy(10 + int(5 * i % 17));
    p.ignore_eos = i % 2 == 0;
    if (i % 3 == 2) p.temperature = 0.9f;
    params.push_back(p);
  }
  for (bool tight : {false, true}) {
    EngineConfig base = c;
    if (tight) base.kvcache_block_size = 16, base.num_kvcache_blocks = 40, base.max_num_batched_tokens = 64;
    SCOPED_TRACE(tight ? "small pool and budget" : "default engine");
    EngineConfig plain_config = base;
    plain_config.overlap_steps = false;
    LLMEngine plain(plain_config), overlapped(base);
    const std::vector<GenerateOutput> want = plain.generate(prompts, params);
    const std::vector<GenerateOutput> got = overlapped.generate(prompts, params);
    EXPECT_EQ(completions(got), completions(want));
    bool some_eos = false;
    for (size_t i = 0; i < want.size(); i++)
      some_eos |= int(want[i].token_ids.size()) < params[i].max_tokens;
    EXPECT_TRUE(some_eos) << "no request stopped at EOS: the test lost a case";
    EXPECT_EQ(plain.stats().overlapped_steps, 0);
    EXPECT_GT(overlapped.stats().overlapped_steps, 0) << "the overlapped loop never overlapped";
    EXPECT_EQ(overlapped.stats().decode_steps, plain.stats().decode_steps);
    EXPECT_EQ(overlapped.scheduler().num_preemptions(), plain.scheduler().num_preemptions());
    if (tight) {
      EXPECT_GT(plain.scheduler().num_preemptions(), 0) << "the small pool did not preempt";
      EXPECT_LT(overlapped.stats().overlapped_steps, overlapped.stats().decode_steps - 1)
          << "some steps must have waited for their tokens";
    }
  }
}

TEST(E2E_Engine, PrefillsLaunchedAheadChangeNoOutputNorTheSchedule) {
  // A prefill launched before the tokens of the prefill ahead of it are read (Scheduler::schedule_prefill_ahead)
  // against the plain loop: requests that ignore EOS (so none finishes at its first token, and prefills may go
  // ahead), greedy and sampled, prompts split into chunks by a small budget, in a pool that holds them all and
  // in one small enough to preempt. The tokens, and the steps and preemptions, must be the plain loop's.
  Golden g = load_golden("tiny-qwen3-a");
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < g.prompts.size(); i++) {
    SamplingParams p = greedy(4 + int(7 * i % 13));
    if (i % 2) p.temperature = 0.9f;
    params.push_back(p);
  }
  for (bool tight : {false, true}) {
    EngineConfig base = config_for("tiny-qwen3-a");
    base.seed = 3, base.max_num_batched_tokens = 24;
    if (tight) base.kvcache_block_size = 16, base.num_kvcache_blocks = 40;
    SCOPED_TRACE(tight ? "small pool" : "default pool");
    EngineConfig plain_config = base;
    plain_config.overlap_steps = false;
    LLMEngine plain(plain_config), overlapped(base);
    EXPECT_EQ(completions(overlapped.generate(g.prompts, params)), completions(plain.generate(g.prompts, params)));
    EXPECT_EQ(plain.stats().overlapped_prefill_steps, 0);
    EXPECT_GT(overlapped.stats().overlapped_prefill_steps, 0) << "no prefill was launched ahead";
    EXPECT_EQ(overlapped.stats().prefill_steps, plain.stats().prefill_steps);
    EXPECT_EQ(overlapped.stats().decode_steps, plain.stats().decode_steps);
    EXPECT_EQ(overlapped.scheduler().num_preemptions(), plain.scheduler().num_preemptions());
    EXPECT_GT(plain.scheduler().num_chunked_prefills(), 0) << "no prompt was chunked";
    if (tight) {
      EXPECT_GT(plain.scheduler().num_preemptions(), 0) << "the small pool did not preempt";
    }
  }
}

TEST(E2E_Engine, RequestsAddedWhileAStepIsInFlightGetThePlainLoopsTokens) {
  // A caller driving step() itself may add a request between two calls, when the overlapped loop has
  // already launched the next decode step without it. That step runs as launched; the new request waits
  // for the one after (in the plain loop it would be prefilled at once). Tokens are the same either way
  // (the CPU's results do not depend on the batch), every request finishes and every block comes back.
  Golden g = load_golden("tiny-qwen3-a");
  auto drive = [&](bool overlap) {
    EngineConfig c = config_for("tiny-qwen3-a");
    c.overlap_steps = overlap;
    LLMEngine engine(c);
    std::map<int64_t, std::vector<int32_t>> out;
    auto take = [&](const std::vector<GenerateOutput>& finished) {
      for (const GenerateOutput& o : finished) out[o.seq_id] = o.token_ids;
    };
    engine.add_request(g.prompts[0], greedy(9));
    engine.add_request(g.prompts[1], greedy(5));
    for (int i = 0; i < 3; i++) take(engine.step().first);  // a prefill, then two decode steps
    engine.add_request(g.prompts[2], greedy(7));
    while (!engine.is_finished()) take(engine.step().first);
    EXPECT_EQ(engine.scheduler().block_manager().num_free_blocks(), engine.scheduler().block_manager().num_blocks());
    return std::make_pair(out, engine.stats().overlapped_steps);
  };
  const auto [plain, plain_ahead] = drive(false);
  const auto [overlapped, ahead] = drive(true);
  EXPECT_EQ(overlapped, plain);
  EXPECT_EQ(overlapped.size(), 3u);
  EXPECT_EQ(plain_ahead, 0);
  EXPECT_GT(ahead, 0);
}

TEST(E2E_Engine, BadRequestsAreRefusedWithClearErrors) {
  EngineConfig c = config_for("tiny-qwen3-a");
  c.max_model_len = 64;
  LLMEngine engine(c);
  auto message = [&](std::vector<int32_t> prompt, SamplingParams p) -> std::string {
    try {
      engine.add_request(prompt, p);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  SamplingParams p = greedy(4);
  EXPECT_EQ(message({1, 512}, p), "request 0: token id 512 is outside the vocabulary [0, 512)");
  EXPECT_EQ(message({-1, 1}, p), "request 0: token id -1 is outside the vocabulary [0, 512)");  // a row before the embedding's
  EXPECT_EQ(message({}, p), "request 0: the prompt is empty");
  EXPECT_EQ(message(std::vector<int32_t>(62, 1), p),
            "request 0: prompt (62 tokens) + max_tokens (4) exceeds max_model_len (64)");
  p.temperature = -1;
  EXPECT_EQ(message({1}, p), "temperature must be >= 0 (0 = greedy), got -1");
  EXPECT_TRUE(engine.is_finished());  // nothing was queued
}

TEST(E2E_Engine, RandomWorkloadsGiveTheSameTokensUnderTightShapes) {
  // Seeded random workloads on tiny-qwen3-b (vocab 1,000: its greedy tokens vary, so a wrong row shows):
  // prompt lengths and max_tokens at block edges (15, 16, 17, 31, 32, 33), prompts sharing a prefix of one or
  // two blocks or repeated whole, greedy requests and sampled ones with their own seeds, some stopping at EOS.
  // The default engine is the reference; three tight shapes must give every request the same tokens.
  std::mt19937 rng(2026);
  const auto pick = [&](std::initializer_list<int> choices) {
    return *(choices.begin() + std::uniform_int_distribution<size_t>(0, choices.size() - 1)(rng));
  };
  const auto token = [&] { return int32_t(std::uniform_int_distribution<int>(1, 999)(rng)); };
  int64_t preemptions = 0, chunks = 0, hits = 0, stopped_early = 0;
  EngineConfig base = config_for("tiny-qwen3-b");
  for (int32_t id = 7; id < 1000; id += 10) base.eos.push_back(id);  // 100 EOS ids: ~10% of random tokens stop
  for (int workload = 0; workload < 8; workload++) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    int longest = 0;  // the most tokens one request holds: prompt + max_tokens - 1
    const int n = pick({2, 3, 5, 8});
    for (int i = 0; i < n; i++) {
      std::vector<int32_t> p;
      if (!prompts.empty() && rng() % 3 == 0) {  // a prefix of an earlier prompt, or all of it
        const std::vector<int32_t>& earlier = prompts[rng() % prompts.size()];
        const int shared = std::min(int(earlier.size()), pick({16, 32, int(earlier.size())}));
        p.assign(earlier.begin(), earlier.begin() + shared);
      }
      const int more = pick({0, 1, 15, 16, 17, 31, 32, 33, int(1 + rng() % 120)});
      for (int k = 0; k < more || p.empty(); k++) p.push_back(token());
      SamplingParams sp = greedy(pick({1, 2, 15, 16, 17, int(1 + rng() % 24)}));
      sp.ignore_eos = rng() % 2 == 0;
      if (i % 2 == 1) {
        sp.temperature = 1.0f;
        sp.seed = rng();
      }
      longest = std::max(longest, int(p.size()) + sp.max_tokens - 1);
      prompts.push_back(p);
      params.push_back(sp);
    }
    const auto run = [&](const EngineConfig& c) {
      LLMEngine engine(c);
      auto got = completions(engine.generate(prompts, params));
      preemptions += engine.scheduler().num_preemptions();
      chunks += engine.scheduler().num_chunked_prefills();
      hits += engine.scheduler().block_manager().total_hit_blocks();
      return got;
    };
    const std::vector<std::vector<int32_t>> reference = run(base);
    for (size_t i = 0; i < prompts.size(); i++) stopped_early += int(reference[i].size()) < params[i].max_tokens;
    EngineConfig tight = base;  // a pool one block over the longest request, and a budget of 17 tokens
    tight.kvcache_block_size = 16;
    tight.num_kvcache_blocks = ceil_div(longest, 16) + 1;
    tight.max_num_batched_tokens = 17;
    EngineConfig two_seqs = base;  // two sequences a step, the plain loop
    two_seqs.kvcache_block_size = 32;
    two_seqs.max_num_seqs = 2;
    two_seqs.overlap_steps = false;
    EngineConfig plain_tight = tight;  // the plain loop, a little more room
    plain_tight.num_kvcache_blocks += 2;
    plain_tight.max_num_batched_tokens = 40;
    plain_tight.overlap_steps = false;
    for (const EngineConfig* c : {&tight, &two_seqs, &plain_tight}) {
      SCOPED_TRACE("workload " + std::to_string(workload) + ", block " + std::to_string(c->kvcache_block_size) +
                   ", " + std::to_string(c->num_kvcache_blocks) + " blocks, budget " +
                   std::to_string(c->max_num_batched_tokens) + ", max_num_seqs " + std::to_string(c->max_num_seqs));
      EXPECT_EQ(run(*c), reference);
    }
  }
  EXPECT_GT(preemptions, 0) << "no shape preempted: the test lost its point";
  EXPECT_GT(chunks, 0) << "no shape chunked a prefill";
  EXPECT_GT(hits, 0) << "no prompt hit the prefix cache";
  EXPECT_GT(stopped_early, 0) << "no request stopped at an EOS";
}

TEST(E2E_Engine, TopKOfOneAndATinyTopPSampleTheGreedyTokens) {
  // A request's top_k and top_p reach the sampler (ModelRunner::fill_sampling): top_k = 1 keeps only the most
  // likely token, and top_p = 1e-6 keeps the smallest set whose probability reaches it, the most likely token
  // alone (07_sampler), so at temperature 1 both must give the greedy tokens. Plain temperature-1 sampling with
  // the same seed draws other tokens: were top_k or top_p dropped on the way, the tokens would be those.
  Golden g = load_golden("tiny-qwen3-b");
  const std::vector<std::vector<int32_t>> prompts(g.prompts.begin() + 1, g.prompts.begin() + 5);
  EngineConfig c = config_for("tiny-qwen3-b");
  c.seed = 11;
  const std::vector<std::vector<int32_t>> want = completions(LLMEngine(c).generate(prompts, {greedy(8)}));
  SamplingParams sampled = greedy(8);
  sampled.temperature = 1.0f;
  SamplingParams top_k = sampled, top_p = sampled;
  top_k.top_k = 1;
  top_p.top_p = 1e-6f;
  EXPECT_EQ(completions(LLMEngine(c).generate(prompts, {top_k})), want) << "top_k 1";
  EXPECT_EQ(completions(LLMEngine(c).generate(prompts, {top_p})), want) << "top_p 1e-6";
  EXPECT_NE(completions(LLMEngine(c).generate(prompts, {sampled})), want) << "sampling must differ from greedy here";
}

TEST(E2E_Engine, RequestsWithoutASeedDrawTheirOwnTokens) {
  // A request without a seed gets one derived from the engine's seed and its id (add_request): the same
  // prompt asked twice at temperature 1 must not draw the same completion (with one seed for every request,
  // both would be the same tokens: the same logits and the same noise at every position). 16 tokens over
  // tiny-qwen3-b's 1,000 ids: a chance match of all of them is out of the question.
  Golden g = load_golden("tiny-qwen3-b");
  EngineConfig c = config_for("tiny-qwen3-b");
  c.seed = 42;
  SamplingParams p = greedy(16);
  p.temperature = 1.0f;
  const auto got = completions(LLMEngine(c).generate({g.prompts[2], g.prompts[2]}, {p}));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[0], got[1]);
}

TEST(E2E_Engine, GenerateGivesEachPromptItsOwnParamsAndOutputsInPromptOrder) {
  // generate with one SamplingParams per prompt: prompt i runs with params[i]. With ignore_eos, a request
  // gives exactly max_tokens tokens, so the lengths show whose params each ran with; the longest request is
  // given first, so that it finishes last, and the outputs still come in the prompts' order, each with its
  // own prompt (not its prompt and completion). A count of params that is neither 1 nor the prompts' is refused.
  Golden g = load_golden("tiny-qwen3-a");
  const std::vector<std::vector<int32_t>> prompts = {g.prompts[3], g.prompts[1], g.prompts[2]};
  LLMEngine engine(config_for("tiny-qwen3-a"));
  const std::vector<GenerateOutput> out = engine.generate(prompts, {greedy(9), greedy(2), greedy(5)});
  ASSERT_EQ(out.size(), 3u);
  const size_t lengths[3] = {9, 2, 5};
  for (size_t i = 0; i < 3; i++) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    EXPECT_EQ(out[i].seq_id, int64_t(i));
    EXPECT_EQ(out[i].prompt_token_ids, prompts[i]);
    EXPECT_EQ(out[i].token_ids.size(), lengths[i]);
  }
  EXPECT_EQ(test::error_of([&] { engine.generate(prompts, {greedy(1), greedy(1), greedy(1), greedy(1)}); }),
            "generate: 4 sampling params for 3 prompts");
  EXPECT_EQ(test::error_of([&] { engine.generate(prompts, {greedy(1), greedy(1)}); }),
            "generate: 2 sampling params for 3 prompts");
}

TEST(E2E_Engine, SteppingReturnsEachRequestOnceAndItsFirstTokenAfterItsLastChunk) {
  // A caller driving step() itself (streaming) gets each finished request once. In the overlapped loop a
  // request stopped by EOS still has a row in the step launched ahead: that row is dropped, not returned again,
  // and the engine is not finished until that step is collected, so that a request added then is prefilled by
  // the next step (not left behind a stale step). A prompt of 600 tokens under a budget of 256 is prefilled in
  // three chunks (256, 256, 88): its first completion token comes from the third step, so its first-token time
  // is after the second step returned.
  Golden g = load_golden("tiny-qwen3-a");
  EngineConfig c = config_for("tiny-qwen3-a");
  // An EOS id that prompt 2's greedy run first meets at its third token or later (as a decode step's token,
  // while the overlapped loop has the step after in flight).
  const std::vector<int32_t> free_run = LLMEngine(c).generate({g.prompts[2]}, {greedy(10)})[0].token_ids;
  size_t k = 2;
  while (k < free_run.size() && std::count(free_run.begin(), free_run.begin() + ptrdiff_t(k), free_run[k]) > 0) k++;
  ASSERT_LT(k, free_run.size()) << "no new token in the free run to stop at";
  c.eos = {free_run[k]};
  c.max_num_batched_tokens = 256;
  LLMEngine engine(c);
  ASSERT_TRUE(engine.config().overlap_steps);
  SamplingParams stop = greedy(10);
  stop.ignore_eos = false;
  engine.add_request(g.prompts[2], stop);       // stops at EOS, before the others
  engine.add_request(g.prompts[3], greedy(8));  // run on past it
  engine.add_request(g.prompts[1], greedy(8));
  std::map<int64_t, int> returned;
  while (!engine.is_finished())
    for (const GenerateOutput& o : engine.step().first) returned[o.seq_id]++;
  EXPECT_EQ(returned, (std::map<int64_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_GT(engine.stats().overlapped_steps, 0) << "the overlapped loop never overlapped";

  // One request that stops at EOS, alone: when its EOS is read, the step after is already in flight.
  engine.add_request(g.prompts[2], stop);
  std::vector<GenerateOutput> stopped;
  while (!engine.is_finished())
    for (GenerateOutput& o : engine.step().first) stopped.push_back(std::move(o));
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].token_ids, std::vector<int32_t>(free_run.begin(), free_run.begin() + ptrdiff_t(k) + 1));
  const std::vector<int32_t>& prompt = g.prompts.back();  // 600 tokens
  ASSERT_EQ(prompt.size(), 600u);
  const int64_t id = engine.add_request(prompt, greedy(1));
  std::vector<std::chrono::steady_clock::time_point> after;
  std::vector<GenerateOutput> finished;
  std::vector<int> tokens;
  while (!engine.is_finished()) {
    auto [out, n] = engine.step();
    after.push_back(std::chrono::steady_clock::now());
    tokens.push_back(n);
    for (GenerateOutput& o : out) finished.push_back(std::move(o));
  }
  EXPECT_EQ(tokens, (std::vector<int>{256, 256, 88})) << "the new request's prefill chunks, and nothing else";
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].seq_id, id);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_GT(finished[0].times.first_token, after[1]) << "the first token was stamped at a chunk's step";
  EXPECT_LE(finished[0].times.first_token, finished[0].times.finished);
}
