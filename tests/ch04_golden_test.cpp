// The model against Hugging Face: for every golden case (prompts of 1 to 600 tokens, two tiny Qwen3
// checkpoints), the logits after the prompt must match transformers' float64 logits to a relative error
// (by norm) of 1e-4 on the CPU. The runner is driven by hand here, with block tables in scrambled
// order, so that this chapter is tested without the scheduler.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "04_model_runner/checkpoint/random_model.h"
#include "04_model_runner/model_runner.h"
#include "tests/test_util.h"

using namespace nanovllm;

namespace {

double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); i++) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

struct GoldenCase {
  std::vector<int32_t> prompt;
  std::vector<double> logits;
};

std::vector<GoldenCase> load_cases(const std::string& model) {
  Json golden = test::read_json(test::data_path("golden/" + model + ".golden.json"));
  std::vector<GoldenCase> cases;
  for (const Json& c : golden.at("cases").as_array()) {
    GoldenCase g;
    for (const Json& id : c.at("prompt_ids").as_array()) g.prompt.push_back(int32_t(id.as_int64()));
    for (const Json& v : c.at("last_logits").as_array()) g.logits.push_back(v.as_double());
    cases.push_back(std::move(g));
  }
  return cases;
}

EngineConfig cpu_config(const std::string& model, int block_size, int num_blocks, int tp_size = 1) {
  EngineConfig c;
  c.tensor_parallel_size = tp_size;
  c.model = test::data_path("golden/" + model);
  c.device = "cpu";
  c.kvcache_block_size = block_size;
  c.num_kvcache_blocks = num_blocks;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 4096;
  return c;
}

// Computes tokens [num_cached_tokens, num_cached_tokens + n) of seq and returns the logits of the last.
std::vector<float> prefill(ModelRunner& runner, Sequence& seq, int n) {
  seq.num_scheduled_tokens = n;
  std::vector<float> logits;
  runner.run({&seq}, true, &logits);
  seq.num_cached_tokens += n;
  seq.num_scheduled_tokens = 0;
  return logits;
}

// A block table for `num_tokens` tokens using blocks from the end of the pool backwards.
std::vector<int> scrambled_blocks(int num_tokens, int block_size, int num_blocks, int offset) {
  std::vector<int> table;
  for (int i = 0; i < ceil_div(num_tokens, block_size); i++) table.push_back(num_blocks - 1 - offset - 2 * i);
  return table;
}

void check_model(const std::string& model, int tp_size = 1) {
  const int block_size = 16, num_blocks = 128;
  EngineConfig config = cpu_config(model, block_size, num_blocks, tp_size);
  ModelRunner runner(config);
  SamplingParams greedy;
  greedy.temperature = 0;
  int64_t id = 0;
  // One assertion for all prompts (a wrong layer fails every one; the summary names the worst).
  test::MismatchSummary prompts("prefills (relative error of the logits)");
  for (const GoldenCase& c : load_cases(model)) {
    const std::string name = std::to_string(c.prompt.size()) + "-token prompt";
    Sequence seq(id++, c.prompt, greedy, 0, block_size);
    seq.block_table = scrambled_blocks(seq.num_tokens(), block_size, num_blocks, 0);
    std::vector<float> logits = prefill(runner, seq, seq.num_tokens());
    ASSERT_EQ(logits.size(), c.logits.size()) << name;
    prompts.check(relative_error(logits, c.logits), 1e-4, [&] { return name; });

    // The same prompt in two chunks: the second reads the first's K/V from the paged cache.
    if (seq.num_tokens() > 1) {
      Sequence chunked(id++, c.prompt, greedy, 0, block_size);
      chunked.block_table = scrambled_blocks(seq.num_tokens(), block_size, num_blocks, 1);
      int first = seq.num_tokens() / 3 + 1;
      prefill(runner, chunked, first);
      std::vector<float> chunked_logits = prefill(runner, chunked, seq.num_tokens() - first);
      prompts.check(relative_error(chunked_logits, c.logits), 1e-4,
                    [&] { return name + " in chunks of " + std::to_string(first) + " and the rest"; });
    }
  }
  EXPECT_TRUE(prompts.result()) << model << ", tp " << tp_size;
}

}  // namespace

TEST(Ch04_Golden, TinyQwen3ALogitsMatchTransformers) { check_model("tiny-qwen3-a"); }

TEST(Ch04_Golden, TinyQwen3BLogitsMatchTransformers) { check_model("tiny-qwen3-b"); }

TEST(Ch04_Golden, BatchedPrefillEqualsOneAtATime) {
  // All eight prompts of model b in one varlen batch give the same logits as each alone.
  const int block_size = 16, num_blocks = 256;
  EngineConfig config = cpu_config("tiny-qwen3-b", block_size, num_blocks);
  ModelRunner runner(config);
  std::vector<GoldenCase> cases = load_cases("tiny-qwen3-b");
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<Sequence> seqs;
  seqs.reserve(cases.size());
  int next_block = 0;
  for (size_t i = 0; i < cases.size(); i++) {
    seqs.emplace_back(int64_t(i), cases[i].prompt, greedy, 0, block_size);
    for (int b = 0; b < seqs.back().num_blocks(); b++) seqs.back().block_table.push_back(next_block++);
    seqs.back().num_scheduled_tokens = seqs.back().num_tokens();
  }
  std::vector<Sequence*> batch;
  for (auto& s : seqs) batch.push_back(&s);
  std::vector<float> logits;
  std::vector<int32_t> tokens = runner.run(batch, true, &logits);
  const size_t vocab = cases[0].logits.size();
  ASSERT_EQ(logits.size(), vocab * cases.size());
  test::MismatchSummary rows("rows of the batch (relative error of the logits)");
  for (size_t i = 0; i < cases.size(); i++) {
    std::vector<float> row(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    rows.check(relative_error(row, cases[i].logits), 1e-4, [&] { return "case " + std::to_string(i); });
    // Greedy sampling took the argmax of each row.
    EXPECT_EQ(tokens[i], int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
  }
  EXPECT_TRUE(rows.result());
}

// Tensor parallelism: the same logits from 2 and 4 ranks (threads, each with its shard of the weights
// and KV cache, adding up partial results with CpuCommunicator). tiny-qwen3-a has 2 KV heads: on 4
// ranks each is replicated twice.
TEST(Ch04_TensorParallel, TinyQwen3ALogitsMatchTransformersOnTwoAndFourRanks) {
  check_model("tiny-qwen3-a", 2);
  check_model("tiny-qwen3-a", 4);
}

TEST(Ch04_TensorParallel, TinyQwen3BLogitsMatchTransformersOnTwoRanks) { check_model("tiny-qwen3-b", 2); }

TEST(Ch04_TensorParallel, ShapesThatCannotSplitAreRefusedBeforeLoading) {
  // tiny-qwen3-b has 6 query heads: 4 ranks cannot share them evenly.
  EngineConfig config = cpu_config("tiny-qwen3-b", 16, 64, 4);
  EXPECT_EQ(test::error_of([&] { ModelRunner runner(config); }),
            "num_attention_heads (6) is not divisible by tensor_parallel_size 4");
}

TEST(Ch04_TensorParallel, MultiQueryAttentionAndAnOddVocabularySplit) {
  // One KV head (replicated on every rank) and a vocabulary of 1001 (padded per shard): the logits of
  // 2 and 4 ranks equal those of one rank.
  test::TempDir dir;
  ModelConfig mc = ModelConfig::load(test::data_path("golden/tiny-qwen3-a"));
  mc.num_attention_heads = 8;
  mc.num_key_value_heads = 1;
  mc.vocab_size = 1001;
  write_random_model(mc, dir / "mqa", 7);
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<int32_t> prompt(37);
  for (int i = 0; i < 37; i++) prompt[size_t(i)] = (i * 97 + 5) % 1001;
  std::vector<std::vector<float>> logits;
  for (int tp : {1, 2, 4}) {
    EngineConfig config = cpu_config("tiny-qwen3-a", 16, 32, tp);
    config.model = dir / "mqa";
    ModelRunner runner(config);
    Sequence seq(0, prompt, greedy, 0, 16);
    seq.block_table = {3, 1, 2};
    logits.push_back(prefill(runner, seq, seq.num_tokens()));
    ASSERT_EQ(logits.back().size(), 1001u) << "tp " << tp;
  }
  const std::vector<double> want(logits[0].begin(), logits[0].end());
  EXPECT_LE(relative_error(logits[1], want), 1e-5);
  EXPECT_LE(relative_error(logits[2], want), 1e-5);
}
