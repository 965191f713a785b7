// The engine on the GPU against Hugging Face's golden data (bf16 path: logits within 2e-2 relative
// error; greedy tokens equal up to the first step whose golden margin is below 0.25, the bf16 noise),
// in every engine shape: CUDA graphs on and off, chunked prefill, preemption, block sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <utility>

#include "01_sequence/llm_engine.h"
#include "02_scheduler/scheduler.h"
#include "04_model_runner/backend.h"
#include "04_model_runner/model_runner.h"
#include "04_model_runner/profiler.h"
#ifdef NANOVLLM_CUDA
#include "06_tensor_parallel/linear.h"
#endif
#include "tests/test_util.h"

using namespace nanovllm;

namespace {

// The tensor-parallel test's ranks share one GPU and wait for each other inside spinning kernels: load
// every kernel when the CUDA context starts, not lazily at first launch (01_sequence/cli/main.cpp says
// why). This runs before main(), so before the first CUDA call of this test binary.
const int kEagerKernels = setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);

struct Golden {
  std::vector<std::vector<int32_t>> prompts, tokens;
  std::vector<std::vector<double>> logits, margins;
};

Golden load(const std::string& model) {
  Json golden = test::read_json(test::data_path("golden/" + model + ".golden.json"));
  Golden g;
  for (const Json& c : golden.at("cases").as_array()) {
    std::vector<int32_t> prompt, tokens;
    std::vector<double> logits, margins;
    for (const Json& id : c.at("prompt_ids").as_array()) prompt.push_back(int32_t(id.as_int64()));
    for (const Json& v : c.at("last_logits").as_array()) logits.push_back(v.as_double());
    for (const Json& s : c.at("greedy").as_array()) {
      tokens.push_back(int32_t(s.at("token").as_int64()));
      margins.push_back(s.at("margin").as_double());
    }
    g.prompts.push_back(prompt), g.tokens.push_back(tokens), g.logits.push_back(logits), g.margins.push_back(margins);
  }
  return g;
}

EngineConfig gpu_config(const std::string& model) {
  EngineConfig c;
  c.model = test::data_path("golden/" + model);
  c.device = "cuda";
  c.gpu_memory_utilization = 0.3f;  // leave the GPU to others; the tiny models need little
  c.max_num_seqs = 64;
  return c;
}

// Greedy tokens agree with the golden ones up to, not including, the first step whose golden margin (top-1
// minus top-2 logit) is under 0.25: that step's own argmax is within the bf16 path's noise (its logits are
// within 2e-2 relative error, about 0.1 here), and every later step follows from it.
void expect_golden_greedy(const Golden& g, const std::vector<GenerateOutput>& outputs, const std::string& what) {
  for (size_t i = 0; i < g.prompts.size(); i++)
    for (size_t step = 0; step < g.tokens[i].size(); step++) {
      if (g.margins[i][step] < 0.25) break;
      ASSERT_EQ(outputs[i].token_ids[step], g.tokens[i][step]) << what << ": case " << i << " step " << step;
    }
}

// ||got - want|| / ||want|| (the bf16 path's tolerance is 2e-2).
double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t v = 0; v < want.size(); v++) num += (got[v] - want[v]) * (got[v] - want[v]), den += want[v] * want[v];
  return std::sqrt(num / den);
}

SamplingParams greedy(int n) {
  SamplingParams p;
  p.temperature = 0, p.max_tokens = n, p.ignore_eos = true;
  return p;
}

// Whether this GPU runs v6 (compute capability 9.0, code built for sm_90a), and v7's projections that prefetch
// their weights: what the tests of those paths may skip on. Where the GPU runs them, the backend must take
// them; a test skips on the GPU, never on what the backend says (a backend that stopped fusing would skip).
bool gpu_runs_wgmma() {
#ifdef NANOVLLM_CUDA
  return linear_wgmma_available();
#else
  return false;
#endif
}

bool gpu_runs_prefetch() {
#ifdef NANOVLLM_CUDA
  return linear_prefetch_available();
#else
  return false;
#endif
}

// A tensor-parallel engine against the golden data: the last-token logits of every third prompt
// within the bf16 tolerance, greedy tokens up to the golden margin, and every rank ran every step.
void expect_ranks_match_golden(LLMEngine& engine, const Golden& g, const std::string& what) {
  for (size_t i = 0; i < g.prompts.size(); i += 3) {
    engine.add_request(g.prompts[i], greedy(1));
    std::vector<float> logits;
    while (!engine.is_finished()) engine.step(&logits);
    EXPECT_LE(relative_error(logits, g.logits[i]), 2e-2) << what << " case " << i;
  }
  const auto outputs = engine.generate(g.prompts, {greedy(24)});
  expect_golden_greedy(g, outputs, what);
  ASSERT_EQ(int(engine.model_runner().rank_steps().size()), engine.config().tensor_parallel_size) << what;
  for (int64_t steps : engine.model_runner().rank_steps()) EXPECT_EQ(steps, engine.stats().steps) << what;
}

}  // namespace

TEST(E2E_Gpu, LogitsMatchTransformers) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load(model);
    LLMEngine engine(gpu_config(model));
    for (size_t i = 0; i < g.prompts.size(); i++) {
      engine.add_request(g.prompts[i], greedy(1));
      std::vector<float> logits;
      while (!engine.is_finished()) engine.step(&logits);
      EXPECT_LE(relative_error(logits, g.logits[i]), 2e-2) << model << " case " << i;
    }
  }
}

// On a GPU with v6, steps of 9 to 128 sequences sample inside the LM head's kernel and write no logits
// (04_model_runner/NOTES.md, section 5); logits asked for after such a step are written then, by the same
// kernel from the hidden states the step left. Each golden prompt twice (16 sequences): the prefill's logits
// against the golden ones, and every greedy token the argmax of its row, in the prefill and in a decode
// step replayed from a CUDA graph.
TEST(E2E_Gpu, LogitsAfterAStepSampledInTheLmHead) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (!gpu_runs_wgmma()) GTEST_SKIP() << "this GPU does not run v6, whose LM head samples";
  const Golden g = load("tiny-qwen3-a");
  LLMEngine engine(gpu_config("tiny-qwen3-a"));
  std::vector<int64_t> ids;
  for (int copy = 0; copy < 2; copy++)
    for (const auto& prompt : g.prompts) ids.push_back(engine.add_request(prompt, greedy(2)));
  const size_t rows = ids.size();
  bool samples_in_lm_head = false;  // what the test is about: these steps sample in the LM head's kernel
  engine.model_runner().wrap_backend([&](std::unique_ptr<Backend> b) {
    samples_in_lm_head = b->fuses_linear_sample(int64_t(rows));
    return b;
  });
  ASSERT_TRUE(samples_in_lm_head) << rows << " rows on a GPU that runs v6: the LM head samples";
  std::vector<std::vector<int32_t>> argmax_by_step;  // [step][row]
  std::map<int64_t, std::vector<int32_t>> tokens;
  while (!engine.is_finished()) {
    std::vector<float> logits;
    for (const GenerateOutput& out : engine.step(&logits).first) tokens[out.seq_id] = out.token_ids;
    ASSERT_EQ(logits.size() % rows, 0u) << "every step runs all 16 sequences";
    const size_t vocab = logits.size() / rows;
    std::vector<int32_t> argmax(rows);
    for (size_t r = 0; r < rows; r++) {
      const auto row = logits.begin() + ptrdiff_t(r * vocab);
      argmax[r] = int32_t(std::max_element(row, row + ptrdiff_t(vocab)) - row);
      if (argmax_by_step.empty()) {
        const std::vector<float> own(row, row + ptrdiff_t(vocab));
        EXPECT_LE(relative_error(own, g.logits[r % g.prompts.size()]), 2e-2) << "prefill row " << r;
      }
    }
    argmax_by_step.push_back(argmax);
  }
  ASSERT_EQ(argmax_by_step.size(), 2u);
  for (size_t r = 0; r < rows; r++)
    for (size_t step = 0; step < 2; step++)
      EXPECT_EQ(tokens[ids[r]].at(step), argmax_by_step[step][r]) << "row " << r << " step " << step;
}

TEST(E2E_Gpu, GreedyMatchesTransformersInEveryEngineShape) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  int64_t preemptions = 0, chunks = 0;
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load(model);
    for (bool eager : {false, true}) {
      for (int block_size : {16, 256}) {
        for (bool tight : {false, true}) {
          EngineConfig c = gpu_config(model);
          c.enforce_eager = eager;
          c.kvcache_block_size = block_size;
          if (tight) {
            c.max_num_batched_tokens = 100;  // chunked prefill
            c.num_kvcache_blocks = ceil_div(600 + 24 - 1, block_size) + 1;  // preemption
          }
          LLMEngine engine(c);
          std::string what = model + (eager ? " eager" : " graphs") + " block " + std::to_string(block_size) +
                             (tight ? " tight" : "");
          expect_golden_greedy(g, engine.generate(g.prompts, {greedy(24)}), what);
          preemptions += engine.scheduler().num_preemptions();
          chunks += engine.scheduler().num_chunked_prefills();
          if (!eager) {
            EXPECT_FALSE(engine.model_runner().graph_batch_sizes().empty());
          }
        }
      }
    }
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(chunks, 0);
}

TEST(E2E_Gpu, FusedProjectionsAtBatchOneMatchTransformers) {
  // --linear-version 7: at one row each projection takes in the norm, the SiLU and the residual add
  // around it (Backend::fuses_around_linear, 06_tensor_parallel/linear_prefetch.cu). One prompt at a time,
  // so that every decode step is one row, under CUDA graphs and eager; the one-token prompts' prefills are
  // one row too.
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (!gpu_runs_prefetch()) GTEST_SKIP() << "this GPU has no fused projections (compute capability 9.0 or later)";
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load(model);
    for (bool eager : {false, true}) {
      EngineConfig c = gpu_config(model);
      c.linear_version = 7;
      c.enforce_eager = eager;
      LLMEngine engine(c);
      bool fuses = false;  // what the backend says about one row (asked through the wrapper hook)
      engine.model_runner().wrap_backend([&](std::unique_ptr<Backend> b) {
        fuses = b->fuses_around_linear(1);
        return b;
      });
      ASSERT_TRUE(fuses) << model << ": linear version 7 fuses one row on a GPU that has the fused projections";
      const std::string what = model + (eager ? " eager" : " graphs") + ", linear version 7, one prompt at a time";
      std::vector<GenerateOutput> outputs;
      for (const auto& prompt : g.prompts) outputs.push_back(engine.generate({prompt}, {greedy(24)})[0]);
      expect_golden_greedy(g, outputs, what);
      for (size_t i = 0; i < g.prompts.size(); i++) {
        if (g.prompts[i].size() != 1) continue;
        engine.add_request(g.prompts[i], greedy(1));
        std::vector<float> logits;
        while (!engine.is_finished()) engine.step(&logits);
        EXPECT_LE(relative_error(logits, g.logits[i]), 2e-2) << what << " case " << i;
      }
    }
  }
}

// What `ask` says of an engine's backend (asked through the wrapper hook, before the engine generates).
bool backend_says(LLMEngine& engine, const std::function<bool(const Backend&)>& ask) {
  bool answer = false;
  engine.model_runner().wrap_backend([&](std::unique_ptr<Backend> b) {
    answer = ask(*b);
    return b;
  });
  return answer;
}

// The golden prompts `copies` times over in one generate call, so that every decode step has that many
// times their rows (max_num_seqs raised to hold them all), under graphs and eager; every copy must give the golden greedy tokens. `runs` is asked
// of each engine's backend before it generates (false: the GPU cannot run what the test is about, and the
// helper returns false at once). linear_version 0: the engine's default.
bool golden_copies_match(const std::string& model, int copies, const std::function<bool(const Backend&, int64_t rows)>& runs,
                         int linear_version = 0) {
  Golden g = load(model);
  std::vector<std::vector<int32_t>> prompts;
  for (int c = 0; c < copies; c++) prompts.insert(prompts.end(), g.prompts.begin(), g.prompts.end());
  for (bool eager : {false, true}) {
    EngineConfig c = gpu_config(model);
    c.enforce_eager = eager;
    c.max_num_seqs = std::max(c.max_num_seqs, int(prompts.size()));  // every copy in every decode step
    if (linear_version != 0) c.linear_version = linear_version;
    LLMEngine engine(c);
    if (!backend_says(engine, [&](const Backend& b) { return runs(b, int64_t(prompts.size())); })) return false;
    const std::string what = model + (eager ? " eager, " : " graphs, ") + std::to_string(prompts.size()) + " sequences";
    std::vector<GenerateOutput> outputs = engine.generate(prompts, {greedy(24)});
    EXPECT_EQ(outputs.size(), prompts.size()) << what;
    if (outputs.size() != prompts.size()) return true;
    const long each = long(g.prompts.size());
    for (int k = 0; k < copies; k++)
      expect_golden_greedy(g, std::vector<GenerateOutput>(outputs.begin() + k * each, outputs.begin() + (k + 1) * each),
                           what + ", copy " + std::to_string(k));
  }
  return true;
}

TEST(E2E_Gpu, WgmmaProjectionsWithTheirSiluMatchTransformers) {
  // The default linear version at 9-48 rows: v6, and the MLP's gate_up projection with its activation in one
  // kernel (Backend::fuses_linear_silu, 06_tensor_parallel/linear_wgmma.cu), which runs up to 128 rows
  // (kWgmmaSiluRows). The golden prompts twice over (16 rows a decode step) and 14 times (112 rows).
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (!gpu_runs_wgmma()) GTEST_SKIP() << "this GPU does not run v6 (compute capability 9.0, code built for sm_90a)";
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"})
    for (int copies : {2, 14})
      EXPECT_TRUE(golden_copies_match(model, copies, [](const Backend& b, int64_t rows) { return b.fuses_linear_silu(rows); }))
          << model << ", " << copies << " copies: v6 runs here, and the default linear version fuses the SiLU up to "
          << "128 rows";
}

TEST(E2E_Gpu, GemvProjectionsWithTheirSiluMatchTransformers) {
  // The default linear version from 1 to 8 rows: v2 (one row) and v5 (2-8) with the MLP's activation in the
  // gate_up projection's ending (06_tensor_parallel/linear_gemv.cu, linear_gemv_mma.cu). One prompt at a time
  // (every decode step one row), then the 8 golden prompts together (8 rows, fewer as they finish), under
  // graphs and eager.
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load(model);
    ASSERT_LE(g.prompts.size(), 8u) << "the batch must stay in v5's rows";
    for (bool eager : {false, true}) {
      EngineConfig c = gpu_config(model);
      c.enforce_eager = eager;
      LLMEngine engine(c);
      ASSERT_TRUE(backend_says(engine, [&](const Backend& b) {
        return b.fuses_linear_silu(1) && b.fuses_linear_silu(int64_t(g.prompts.size()));
      })) << "the default linear version fuses the SiLU from 1 to 8 rows";
      const std::string what = model + (eager ? " eager" : " graphs");
      std::vector<GenerateOutput> outputs;
      for (const auto& prompt : g.prompts) outputs.push_back(engine.generate({prompt}, {greedy(24)})[0]);
      expect_golden_greedy(g, outputs, what + ", one prompt at a time");
      expect_golden_greedy(g, engine.generate(g.prompts, {greedy(24)}), what + ", the prompts together");
    }
  }
}

TEST(E2E_Gpu, OProjMergingAttentionsSplitsAtOneSequenceMatchesTransformers) {
  // At one decode sequence the default attention's splits are merged by o_proj's blocks, not by a combine kernel
  // or a cluster (Backend::attention_o_proj_add_rmsnorm; 05_attention/o_proj_merge.cu). One prompt at a time, so
  // that every decode step is one sequence, under graphs and eager, with the default attention version and with
  // v10; the tiny models' 2 KV heads give 64 splits, merged in rounds of 16.
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"}) {
    Golden g = load(model);
    for (int version : {kAttentionVersionDefault, 10})
      for (bool eager : {false, true}) {
        EngineConfig c = gpu_config(model);
        c.enforce_eager = eager;
        c.attention_version = version;
        LLMEngine engine(c);
        const ModelConfig& mc = engine.model_runner().model_config();
        const AttentionShape shape{mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, c.kvcache_block_size,
                                   float(1.0 / std::sqrt(double(mc.head_dim)))};
        AttentionMetadata one;  // a decode step (is_prefill false) of one sequence
        one.num_seqs = 1;
        AttentionMetadata two = one;
        two.num_seqs = 2;
        ASSERT_TRUE(backend_says(engine, [&](const Backend& b) {
          return b.fuses_attention_o_proj(one, shape) && !b.fuses_attention_o_proj(two, shape);
        })) << model << ": the merge in o_proj runs at one decode sequence, and only there";
        const std::string what = model + (eager ? " eager" : " graphs") + ", attention version " + std::to_string(version);
        std::vector<GenerateOutput> outputs;
        for (const auto& prompt : g.prompts) outputs.push_back(engine.generate({prompt}, {greedy(24)})[0]);
        expect_golden_greedy(g, outputs, what + ", one prompt at a time");
      }
  }
}

// golden_copies_match's question where the test is about v6: does this GPU run it at all.
bool wgmma_runs(const Backend&, int64_t) {
#ifdef NANOVLLM_CUDA
  return linear_wgmma_available();
#else
  return false;
#endif
}

TEST(E2E_Gpu, WgmmaNarrowProjectionsAbove48RowsMatchTransformers) {
  // Above 48 rows v6 runs the projections with few outputs (06_tensor_parallel/linear.h, kWgmmaNarrowOut:
  // every projection of the tiny models) up to kWgmmaNarrowRows (192), with the plans for many rows
  // (linear_wgmma_plan): one warpgroup a block at 49-64 rows, two at 65-128, row tiles of one above. The
  // golden prompts 7 times over (56 rows a decode step, graph size 64) and 20 times (160 rows: three row
  // tiles), with linear version 6, whose split-K sum is the cluster's (the default, 8, leaves it to the norm
  // after it there).
  // The answers are v1's too, so the test also counts the calls that ran v6 above 48 rows
  // (CudaLinear::narrow_wgmma_runs).
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef NANOVLLM_CUDA
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"})
    for (int copies : {7, 20}) {
      const size_t before = CudaLinear::narrow_wgmma_runs();
      if (!golden_copies_match(model, copies, wgmma_runs, 6))
        GTEST_SKIP() << "this GPU does not run v6 (compute capability 9.0, code built for sm_90a)";
      EXPECT_GT(CudaLinear::narrow_wgmma_runs(), before) << model << ", " << copies << " copies: no call ran v6 above "
                                                         << kWgmmaFasterRows << " rows";
    }
#endif
}

TEST(E2E_Gpu, NarrowProjectionsSummedInTheNormMatchTransformers) {
  // --linear-version 8 (the default): where v6 runs o_proj and down_proj from 17 rows (kWgmmaPartialsMinRows)
  // to 192, the norm after each adds the projection's split-K partials (Backend::linear_add_rmsnorm,
  // 06_tensor_parallel/linear.h). The golden prompts 3, 7 and 20 times over (24, 56 and 160 rows a decode
  // step), under graphs and eager; the tiny models' o_proj splits 4 ways (tiny-qwen3-a's 512 in_features) or 3
  // (tiny-qwen3-b's 384) and their down_proj one way, Qwen3-0.6B's shapes split 2-8 ways in Ch06_LinearCuda's
  // WgmmaPartialsAddUpToItsProduct.
  // The answers are the cluster's sum's too, so the test also counts the calls that left their partials to
  // the norm (CudaLinear::partials_runs).
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef NANOVLLM_CUDA
  for (const std::string model : {"tiny-qwen3-a", "tiny-qwen3-b"})
    for (int copies : {3, 7, 20}) {
      const size_t before = CudaLinear::partials_runs();
      if (!golden_copies_match(model, copies, wgmma_runs, 8))
        GTEST_SKIP() << "this GPU does not run v6 (compute capability 9.0, code built for sm_90a)";
      EXPECT_GT(CudaLinear::partials_runs(), before) << model << ", " << copies << " copies: no projection left "
                                                     << "its partials to the norm";
    }
#endif
}

TEST(E2E_Gpu, PrefillsAfterTheWarmUpChooseNoGemmAlgorithm) {
  // The model runner's warm-up runs a prefill of each power-of-two bucket of rows above 512 that fits
  // (ModelRunner::warm_up_prefill), so that no prompt length makes cuBLAS choose an algorithm on the host
  // in the middle of serving (06_tensor_parallel/linear.h, CublasLtLinear). Sequences of at most 1,000
  // tokens: the warm-up's prefills hold several sequences.
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef NANOVLLM_CUDA
  EngineConfig c = gpu_config("tiny-qwen3-a");
  c.max_model_len = 1000;
  LLMEngine engine(c);
  const ModelConfig& mc = engine.model_runner().model_config();
  const int qkv_out = (mc.num_attention_heads + 2 * mc.num_key_value_heads) * mc.head_dim;
  // The model's four projections (in -> out) have their choice for 513-1,024 and 1,025-2,048 rows.
  const std::vector<std::pair<int, int>> projections = {{mc.hidden_size, qkv_out},
                                                         {mc.num_attention_heads * mc.head_dim, mc.hidden_size},
                                                         {mc.hidden_size, 2 * mc.intermediate_size},
                                                         {mc.intermediate_size, mc.hidden_size}};
  for (int n : {600, 1600})
    for (auto [in, out] : projections)
      EXPECT_TRUE(CublasLtLinear::has_choice(n, in, out, false)) << n << " rows, " << in << " -> " << out;
  const size_t chosen = CublasLtLinear::chosen_shapes();
  std::mt19937 rng(5);
  const auto prompt = [&](int length) {
    std::vector<int32_t> ids(static_cast<size_t>(length));
    for (auto& id : ids) id = int32_t(rng() % uint32_t(mc.vocab_size));
    return ids;
  };
  // 600 tokens (bucket 1,024), then 700 + 900 in one step (bucket 2,048), then 998 (bucket 1,024).
  const auto first = engine.generate({prompt(600)}, {greedy(2)});
  const auto both = engine.generate({prompt(700), prompt(900)}, {greedy(2)});
  engine.generate({prompt(998)}, {greedy(2)});
  EXPECT_EQ(first[0].token_ids.size(), 2u);
  EXPECT_EQ(both[1].token_ids.size(), 2u);
  EXPECT_EQ(CublasLtLinear::chosen_shapes(), chosen) << "a prefill after the warm-up chose an algorithm";
#endif
}

TEST(E2E_Gpu, SeededSamplingMatchesAcrossGraphsAndEager) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Golden g = load("tiny-qwen3-a");
  SamplingParams p;
  p.temperature = 0.7f, p.max_tokens = 16, p.ignore_eos = true;
  EngineConfig c = gpu_config("tiny-qwen3-a");
  c.seed = 5;
  // Eight prompts, prefilled in one step, each generating 16 tokens: they decode and finish together, so
  // every decode batch is 8, a captured size, the graph replays the very kernels eager mode launches, and
  // seeded samples must agree exactly.
  // Each engine's decode attention calls, as a ProfiledBackend wrapped around its backend counts them: it sees
  // the operations a step runs one by one, and none of a graph replay's. Under graphs every decode step replays
  // a graph (none is counted); eager, every one runs its attention one layer at a time (some are).
  auto generate = [&](int64_t* decode_attention_calls) {
    LLMEngine engine(c);
    ProfiledBackend* profiler = nullptr;
    engine.model_runner().wrap_backend([&](std::unique_ptr<Backend> inner) {
      auto wrapped = std::make_unique<ProfiledBackend>(std::move(inner));
      profiler = wrapped.get();
      return wrapped;
    });
    auto outputs = engine.generate(g.prompts, {p});
    *decode_attention_calls = 0;
    for (const OpTime& op : profiler->report())
      if (op.label.find("attention decode") != std::string::npos) *decode_attention_calls += op.calls;
    return outputs;
  };
  int64_t graphs_calls = -1, eager_calls = -1;
  auto graphs = generate(&graphs_calls);
  auto again = LLMEngine(c).generate(g.prompts, {p});
  c.enforce_eager = true;
  auto eager = generate(&eager_calls);
  EXPECT_EQ(graphs_calls, 0) << "a decode step of the graphs engine ran eagerly";
  EXPECT_GT(eager_calls, 0) << "the eager engine's decode steps were not seen";
  ASSERT_EQ(graphs.size(), g.prompts.size());
  ASSERT_EQ(again.size(), g.prompts.size());
  ASSERT_EQ(eager.size(), g.prompts.size());
  for (size_t i = 0; i < graphs.size(); i++) {
    EXPECT_EQ(graphs[i].token_ids, again[i].token_ids) << "case " << i;
    EXPECT_EQ(graphs[i].token_ids, eager[i].token_ids) << "case " << i;
  }
}

TEST(E2E_Gpu, OverlappedStepsGiveThePlainLoopsTokens) {
  // Decode step n + 1 launched before step n's tokens are read (its input tokens taken on the device from
  // the sampler's output, ModelRunner::execute) against the plain loop, under graphs and eager. Requests of
  // different lengths, greedy and sampled: the batches of both loops are the same step by step (a request
  // ending at max_tokens is left out of the step launched ahead), so the tokens must be identical. Then the
  // same with a budget of 24 tokens a step, whose prompts take several prefill steps, launched ahead too.
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Golden g = load("tiny-qwen3-a");
  std::vector<SamplingParams> params;
  for (size_t i = 0; i < g.prompts.size(); i++) {
    SamplingParams p;
    p.temperature = i % 2 ? 0.8f : 0.0f, p.max_tokens = 6 + int(7 * i % 19), p.ignore_eos = true;
    params.push_back(p);
  }
  for (bool small_budget : {false, true}) {
    for (bool eager : {false, true}) {
      SCOPED_TRACE(std::string(eager ? "eager" : "graphs") + (small_budget ? ", 24 tokens a step" : ""));
      EngineConfig c = gpu_config("tiny-qwen3-a");
      c.seed = 9, c.enforce_eager = eager;
      if (small_budget) c.max_num_batched_tokens = 24;
      std::vector<GenerateOutput> want, got;
      {  // one engine at a time: each takes its share of the GPU's memory
        c.overlap_steps = false;
        LLMEngine plain(c);
        want = plain.generate(g.prompts, params);
        EXPECT_EQ(plain.stats().overlapped_steps + plain.stats().overlapped_prefill_steps, 0);
      }
      c.overlap_steps = true;
      LLMEngine overlapped(c);
      got = overlapped.generate(g.prompts, params);
      for (size_t i = 0; i < want.size(); i++) EXPECT_EQ(got[i].token_ids, want[i].token_ids) << "case " << i;
      EXPECT_GT(overlapped.stats().overlapped_steps, overlapped.stats().decode_steps / 2);
      if (small_budget) {
        EXPECT_GT(overlapped.stats().overlapped_prefill_steps, overlapped.stats().prefill_steps / 2);
      }
    }
  }
}

// Tensor parallelism on the GPU: 2 and 4 ranks sharing one GPU (or one GPU each where there are
// enough), graphs and eager; logits within the bf16 tolerance of the golden ones, greedy tokens up to
// the golden margin (the ranks add their partial sums in another order than one rank's GEMM does). The ranks' kernels are loaded up front (main() does it for the command line).
TEST(E2E_Gpu, TensorParallelRanksMatchTheGoldenLogitsAndOneRanksTokens) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g = load("tiny-qwen3-a");
  for (int tp : {2, 4}) {
    for (bool eager : {false, true}) {
      EngineConfig c = gpu_config("tiny-qwen3-a");
      c.tensor_parallel_size = tp;
      c.enforce_eager = eager;
      const std::string what = "tp " + std::to_string(tp) + (eager ? " eager" : " graphs");
      LLMEngine engine(c);
      expect_ranks_match_golden(engine, g, what);
    }
  }
}

// The same with the stream-ordered collectives (EngineConfig::collectives "events", the command line's
// --collectives events; 06_tensor_parallel/all_reduce_events.cu): 2 and 4 ranks on one GPU. CUDA graphs
// are asked for and turned off, since these collectives run eagerly only. tests/gpu_check.sh runs this
// test under compute-sanitizer's memcheck, which runs one kernel at a time: the spinning collectives cannot
// run there (its racecheck run is `generate --linear-version 1` on the same collectives; the script says why).
TEST(E2E_Gpu, TensorParallelWithStreamOrderedCollectives) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g = load("tiny-qwen3-a");
  for (int tp : {2, 4}) {
    EngineConfig c = gpu_config("tiny-qwen3-a");
    c.tensor_parallel_size = tp;
    c.collectives = "events";
    c.num_kvcache_blocks = 32;  // 8 prompts of up to 600 tokens need 13; small, for the sanitizer's sake
    const std::string what = "tp " + std::to_string(tp) + " events";
    LLMEngine engine(c);
    EXPECT_TRUE(engine.config().enforce_eager) << what;
    EXPECT_TRUE(engine.model_runner().graph_batch_sizes().empty()) << what;
    expect_ranks_match_golden(engine, g, what);
  }
}

// Both collectives add in rank order in fp32 and round once, and everything else a step runs is the same
// kernels: eager runs of the two give the same logits bit for bit.
TEST(E2E_Gpu, TensorParallelCollectivesGiveTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Golden g = load("tiny-qwen3-a");
  std::vector<std::vector<float>> by_mode[2];
  for (int m = 0; m < 2; m++) {
    EngineConfig c = gpu_config("tiny-qwen3-a");
    c.tensor_parallel_size = 2;
    c.enforce_eager = true;
    c.collectives = m == 0 ? "spin" : "events";
    c.num_kvcache_blocks = 32;
    LLMEngine engine(c);
    for (size_t i = 0; i < g.prompts.size(); i += 2) {
      engine.add_request(g.prompts[i], greedy(3));
      std::vector<float> logits;
      while (!engine.is_finished()) {
        engine.step(&logits);
        by_mode[m].push_back(logits);
      }
    }
  }
  ASSERT_EQ(by_mode[0].size(), by_mode[1].size());
  for (size_t s = 0; s < by_mode[0].size(); s++) {
    ASSERT_EQ(by_mode[0][s].size(), by_mode[1][s].size()) << "step " << s;
    EXPECT_EQ(std::memcmp(by_mode[0][s].data(), by_mode[1][s].data(), by_mode[0][s].size() * sizeof(float)), 0)
        << "step " << s << ": spin and events logits differ";
  }
}
