// ModelRunner on the CPU: input preparation (the flat arrays built from sequences' counters and block tables, on
// hand-computed examples: nano-vllm's prepare_prefill / prepare_decode), the KV budget and graph sizes, the
// overlapped steps' rules, the checkpoint and shape refusals, and the CPU backend's pull, push and norms.
#include "04_model_runner/model_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <string>

#include "tests/test_util.h"

using namespace nanovllm;

namespace {

// Golden checkpoint A on the CPU, every other setting EngineConfig's default.
EngineConfig config_a() {
  EngineConfig c;
  c.model = test::data_path("golden/tiny-qwen3-a");
  c.device = "cpu";
  return c;
}

ModelRunner make_runner(int block_size = 16) {
  EngineConfig c = config_a();
  c.kvcache_block_size = block_size;
  c.num_kvcache_blocks = 32;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 256;
  c.max_model_len = 256;
  return ModelRunner(c);
}

std::vector<int32_t> range(int a, int b) {
  std::vector<int32_t> v;
  for (int i = a; i < b; i++) v.push_back(i);
  return v;
}

}  // namespace

TEST(Ch04_ModelRunner, ClampsMaxModelLenAndKeepsUserBlockCount) {
  EngineConfig c = config_a();
  c.kvcache_block_size = 16;
  c.num_kvcache_blocks = 7;
  c.max_model_len = 100000;  // the model allows 4096 positions
  ModelRunner runner(c);
  EXPECT_EQ(c.max_model_len, 4096);
  EXPECT_EQ(c.num_kvcache_blocks, 7);
  EXPECT_EQ(runner.num_kvcache_blocks(), 7);
  EXPECT_EQ(c.eos, std::vector<int32_t>{2});  // from generation_config.json
  // 2 (K, V) x 2 layers x 7 blocks x 16 tokens x 2 KV heads x 128 dims x 4 bytes (fp32 on the CPU).
  EXPECT_EQ(runner.kv_cache_bytes(), size_t(2) * 2 * 7 * 16 * 2 * 128 * 4);
}

TEST(Ch04_ModelRunner, PrefillWarmUpSizesCoverEveryBucketThatFits) {
  // Block 16, max_model_len 1000: a sequence takes 63 blocks.
  const auto sizes = [](int num_blocks, int max_seqs, int max_tokens) {
    EngineConfig c = config_a();
    c.kvcache_block_size = 16;
    c.num_kvcache_blocks = num_blocks;
    c.max_num_seqs = max_seqs;
    c.max_num_batched_tokens = max_tokens;
    c.max_model_len = 1000;
    return ModelRunner(c).prefill_warm_up_sizes();
  };
  EXPECT_EQ(sizes(2000, 8, 5000), (std::vector<int>{1024, 2048, 4096, 5000}));  // each bucket, then the largest
  EXPECT_EQ(sizes(2000, 8, 4096), (std::vector<int>{1024, 2048, 4096}));
  EXPECT_EQ(sizes(2000, 4, 5000), (std::vector<int>{1024, 2048, 4000}));  // 4 sequences of 1000
  EXPECT_EQ(sizes(130, 8, 5000), (std::vector<int>{1024, 2000}));        // 2 sequences' blocks
  EXPECT_EQ(sizes(40, 8, 5000), (std::vector<int>{640}));                // part of one sequence: 40 blocks
  EXPECT_EQ(sizes(2000, 8, 512), (std::vector<int>{}));                  // cuBLAS's buckets start above 512
  EXPECT_EQ(sizes(30, 8, 5000), (std::vector<int>{}));                   // 480 tokens of blocks
}

TEST(Ch04_ModelRunner, GraphSizesEndAtMaxNumSeqsWithNoSizeTwice) {
  const auto sizes = [](int max_seqs) {
    EngineConfig c = config_a();
    c.num_kvcache_blocks = 8;
    c.max_num_seqs = max_seqs;
    return ModelRunner(c).graph_sizes();
  };
  EXPECT_EQ(sizes(1), (std::vector<int>{1}));
  EXPECT_EQ(sizes(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(sizes(16), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(sizes(17), (std::vector<int>{1, 2, 4, 8, 16, 17}));  // nano-vllm has no graph for 17 (StopIteration)
  EXPECT_EQ(sizes(40), (std::vector<int>{1, 2, 4, 8, 16, 32, 40}));
}

TEST(Ch04_ModelRunner, PreparePrefillWithPrefixHitAndChunk) {
  ModelRunner runner = make_runner();
  SamplingParams p;
  // a: 40 tokens, blocks [5, 9, 2], first 16 cached (prefix hit), 20 scheduled (a chunk: 16..35).
  Sequence a(0, range(100, 140), p, 11, 16);
  a.block_table = {5, 9, 2};
  a.num_cached_tokens = 16;
  a.num_scheduled_tokens = 20;
  // b: 3 tokens, block [7], nothing cached; sampling parameters of its own.
  SamplingParams q;
  q.temperature = 0.7f, q.top_k = 5, q.top_p = 0.9f;
  Sequence b(1, range(200, 203), q, 12, 16);
  b.block_table = {7};
  b.num_scheduled_tokens = 3;
  StepInputs in = runner.prepare_prefill({&a, &b});
  EXPECT_TRUE(in.is_prefill);
  std::vector<int32_t> ids = range(116, 136);
  ids.insert(ids.end(), {200, 201, 202});
  EXPECT_EQ(in.input_ids, ids);
  std::vector<int32_t> pos = range(16, 36);
  pos.insert(pos.end(), {0, 1, 2});
  EXPECT_EQ(in.positions, pos);
  // Positions 16..31 are block 9 (slots 144..159), 32..35 block 2 (slots 32..35); b's block 7 -> 112..114.
  std::vector<int32_t> slots = range(144, 160);
  for (int32_t s : {32, 33, 34, 35, 112, 113, 114}) slots.push_back(s);
  EXPECT_EQ(in.slot_mapping, slots);
  EXPECT_EQ(in.cu_seqlens_q, (std::vector<int32_t>{0, 20, 23}));
  EXPECT_EQ(in.cu_seqlens_k, (std::vector<int32_t>{0, 36, 39}));  // a attends to 36 keys, not 40
  EXPECT_EQ(in.max_seqlen_q, 20);
  EXPECT_EQ(in.max_seqlen_k, 36);
  EXPECT_EQ(in.last_token_rows, (std::vector<int32_t>{19, 22}));
  const int width = 256 / 16;
  ASSERT_EQ(in.block_tables.size(), size_t(2 * width));
  EXPECT_EQ(in.block_tables[0], 5);
  EXPECT_EQ(in.block_tables[2], 2);
  EXPECT_EQ(in.block_tables[3], -1);
  EXPECT_EQ(in.block_tables[width], 7);
  EXPECT_EQ(in.block_tables[width + 1], -1);
  ASSERT_EQ(in.sampling.size(), 2u);
  EXPECT_EQ(in.sampling[0].seed, 11u);
  EXPECT_EQ(in.sampling[0].step, 40u);  // the token being generated is index 40
  // Each row carries its own sequence's temperature, top_k and top_p to the sampler (a: the defaults).
  EXPECT_EQ(in.sampling[0].temperature, 1.0f);
  EXPECT_EQ(in.sampling[0].top_k, 0);
  EXPECT_EQ(in.sampling[0].top_p, 1.0f);
  EXPECT_EQ(in.sampling[1].temperature, 0.7f);
  EXPECT_EQ(in.sampling[1].top_k, 5);
  EXPECT_EQ(in.sampling[1].top_p, 0.9f);
  EXPECT_EQ(in.sampling[1].seed, 12u);
  EXPECT_EQ(in.sampling[1].step, 3u);
}

TEST(Ch04_ModelRunner, PrepareDecodeUsesTheLastSlot) {
  ModelRunner runner = make_runner();
  SamplingParams p;
  Sequence a(0, range(0, 33), p, 0, 16);  // 33 tokens: the last (index 32) starts block 2
  a.block_table = {4, 1, 6};
  a.num_cached_tokens = 32;
  a.num_scheduled_tokens = 1;
  Sequence b(1, range(0, 20), p, 0, 16);
  b.block_table = {3, 0};
  b.num_cached_tokens = 19;
  b.num_scheduled_tokens = 1;
  StepInputs in = runner.prepare_decode({&a, &b});
  EXPECT_FALSE(in.is_prefill);
  EXPECT_EQ(in.input_ids, (std::vector<int32_t>{32, 19}));
  EXPECT_EQ(in.positions, (std::vector<int32_t>{32, 19}));
  EXPECT_EQ(in.slot_mapping, (std::vector<int32_t>{6 * 16 + 0, 0 * 16 + 3}));
  EXPECT_EQ(in.context_lens, (std::vector<int32_t>{33, 20}));  // the current token included
  // The longest context, which the decode kernel's grid is sized for (one short would drop a key on the GPU).
  EXPECT_EQ(in.max_seqlen_k, 33);
  // The tokens being generated are indices 33 and 20; each row's table is its sequence's, -1 past it.
  ASSERT_EQ(in.sampling.size(), 2u);
  EXPECT_EQ(in.sampling[0].step, 33u);
  EXPECT_EQ(in.sampling[1].step, 20u);
  const int width = 256 / 16;
  ASSERT_EQ(in.block_tables.size(), size_t(2 * width));
  EXPECT_EQ(std::vector<int32_t>(in.block_tables.begin(), in.block_tables.begin() + 4), (std::vector<int32_t>{4, 1, 6, -1}));
  EXPECT_EQ(std::vector<int32_t>(in.block_tables.begin() + width, in.block_tables.begin() + width + 3),
            (std::vector<int32_t>{3, 0, -1}));
}

namespace {

// Three sequences of 9, 40 and 21 prompt tokens (sequence s: ids from stride * s; greedy at s = 0, else
// temperature 0.8 with seed seed_base + s), each with blocks for `room` tokens past its prompt, prefilled on
// `runner` and given its sampled token: ready for a decode row each.
std::vector<std::unique_ptr<Sequence>> prefilled_three(ModelRunner& runner, int stride, uint64_t seed_base, int room) {
  const int lengths[3] = {9, 40, 21};
  std::vector<std::unique_ptr<Sequence>> owned;
  int next_block = 0;
  for (int s = 0; s < 3; s++) {
    SamplingParams p;
    p.temperature = s == 0 ? 0.0f : 0.8f;
    owned.push_back(std::make_unique<Sequence>(s, range(stride * s, stride * s + lengths[s]), p, seed_base + s, 16));
    for (int b = 0; b < (lengths[s] + room + 15) / 16; b++) owned.back()->block_table.push_back(next_block++);
    owned.back()->num_scheduled_tokens = lengths[s];
  }
  const std::vector<int32_t> first = runner.run({owned[0].get(), owned[1].get(), owned[2].get()}, true);
  for (int s = 0; s < 3; s++) {
    Sequence& seq = *owned[size_t(s)];
    seq.num_cached_tokens = lengths[s];
    seq.num_scheduled_tokens = 1;
    seq.append_token(first[size_t(s)]);
  }
  return owned;
}

}  // namespace

TEST(Ch04_ModelRunner, DecodeRowsComeBackInTheCallersOrder) {
  // The device runs a decode batch longest context first (device_order in model_runner.cpp). Rows are
  // independent, so a sequence's token and logits must not depend on where the caller put it: three
  // sequences of 9, 40 and 21 tokens (one greedy, two sampled), prefilled, then decoded one step in two
  // caller orders, must give each sequence the same token and the same logits row, in the caller's order.
  struct Result {
    int32_t token;
    std::vector<float> logits;
  };
  auto decode_in_order = [](const std::vector<int>& order) {
    ModelRunner runner = make_runner();
    const std::vector<std::unique_ptr<Sequence>> owned = prefilled_three(runner, 3, 100, /*room=*/1);
    std::vector<Sequence*> batch;
    for (int s : order) batch.push_back(owned[size_t(s)].get());
    std::vector<float> logits;
    const std::vector<int32_t> tokens = runner.run(batch, false, &logits);
    const size_t vocab = logits.size() / batch.size();
    std::vector<Result> by_sequence(3);
    for (size_t i = 0; i < batch.size(); i++) {
      const auto row = logits.begin() + ptrdiff_t(i * vocab);
      by_sequence[size_t(batch[i]->seq_id)] = {tokens[i], std::vector<float>(row, row + ptrdiff_t(vocab))};
    }
    return by_sequence;
  };
  const std::vector<Result> a = decode_in_order({0, 1, 2}), b = decode_in_order({2, 0, 1});
  for (int s = 0; s < 3; s++) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    EXPECT_EQ(a[size_t(s)].token, b[size_t(s)].token);
    EXPECT_EQ(a[size_t(s)].logits, b[size_t(s)].logits);
  }
  EXPECT_NE(a[0].logits, a[1].logits) << "the rows must differ, or a swap would go unseen";
  EXPECT_NE(a[1].logits, a[2].logits) << "the rows must differ, or a swap would go unseen";
}

TEST(Ch04_ModelRunner, OverlappedDecodeTakesItsInputsFromTheStepBefore) {
  // The overlapped loop launches decode step 2 before step 1's tokens reach the host: each sequence's last
  // token is kPendingToken, and input_rows names the row of step 1's batch (in the caller's order) whose
  // sampled token is its input. The device runs both steps longest first (here sequence 1, 2, 0: an order
  // that is not its own inverse), so the rows go through two permutations. Both steps must give each
  // sequence the tokens of the plain loop, which collects step 1 before it launches step 2.
  const auto step_done = [](Sequence& seq) {  // as Scheduler::mark_computed, then the next decode row
    seq.num_cached_tokens += 1;
    seq.num_scheduled_tokens = 1;
  };

  ModelRunner plain_runner = make_runner();
  const std::vector<std::unique_ptr<Sequence>> plain = prefilled_three(plain_runner, 5, 200, /*room=*/2);
  const std::vector<Sequence*> step1 = {plain[0].get(), plain[1].get(), plain[2].get()};
  const std::vector<int32_t> plain1 = plain_runner.run(step1, false);
  for (int s = 0; s < 3; s++) step_done(*plain[size_t(s)]), plain[size_t(s)]->append_token(plain1[size_t(s)]);
  const std::vector<Sequence*> step2 = {plain[2].get(), plain[0].get(), plain[1].get()};
  const std::vector<int32_t> plain2 = plain_runner.run(step2, false);

  ModelRunner runner = make_runner();
  const std::vector<std::unique_ptr<Sequence>> owned = prefilled_three(runner, 5, 200, /*room=*/2);
  runner.launch({owned[0].get(), owned[1].get(), owned[2].get()}, false);
  for (int s = 0; s < 3; s++) step_done(*owned[size_t(s)]), owned[size_t(s)]->append_token(kPendingToken);
  runner.launch({owned[2].get(), owned[0].get(), owned[1].get()}, false, /*input_rows=*/{2, 0, 1});
  EXPECT_EQ(runner.collect(), plain1);
  EXPECT_EQ(runner.collect(), plain2);
  // Step 1's three tokens differ, so an input taken from the wrong row is another token.
  EXPECT_NE(plain1[0], plain1[1]);
  EXPECT_NE(plain1[1], plain1[2]);
  EXPECT_NE(plain1[0], plain1[2]);
}

TEST(Ch04_ModelRunner, PrefillGivesTheBitsOfDecodingTokenByToken) {
  // A prefill's last layer runs past its K/V write on each sequence's last row only (Qwen3Model::
  // forward_hidden). On the CPU a row's arithmetic does not depend on the rows computed beside it, so a
  // 40-token prompt prefilled whole must give the bits of the same prompt fed one token a step (a 1-token
  // prefill, then 39 decode steps, each its own last row): the logits after the prompt, and after one more
  // decode step, which reads the last layer's K/V of every prompt row from the cache.
  ModelRunner runner = make_runner();
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> prompt = range(5, 45);
  const int32_t next = 7;  // the token fed after the prompt
  auto blocks = [](int first) { return std::vector<int>{first, first + 1, first + 2}; };  // room for 48 tokens
  auto decode = [&](Sequence& seq, int32_t token) {
    seq.append_token(token);
    seq.num_cached_tokens = seq.num_tokens() - 1;
    seq.num_scheduled_tokens = 1;
    std::vector<float> logits;
    runner.run({&seq}, false, &logits);
    return logits;
  };

  Sequence whole(0, prompt, greedy, 0, 16);
  whole.block_table = blocks(0);
  whole.num_scheduled_tokens = int(prompt.size());
  std::vector<float> whole_prompt;
  runner.run({&whole}, true, &whole_prompt);
  const std::vector<float> whole_next = decode(whole, next);

  Sequence stepped(1, {prompt[0]}, greedy, 0, 16);
  stepped.block_table = blocks(3);
  stepped.num_scheduled_tokens = 1;
  std::vector<float> stepped_prompt;
  runner.run({&stepped}, true, &stepped_prompt);
  for (size_t i = 1; i < prompt.size(); i++) stepped_prompt = decode(stepped, prompt[i]);
  const std::vector<float> stepped_next = decode(stepped, next);

  ASSERT_FALSE(whole_prompt.empty());
  EXPECT_EQ(whole_prompt, stepped_prompt) << "the logits after the prompt";
  EXPECT_EQ(whole_next, stepped_next) << "the logits of the step after it";
  EXPECT_NE(whole_prompt, whole_next) << "the two steps must differ, or a stale row would go unseen";
}

TEST(Ch04_ModelRunner, RejectsABlockTableWiderThanMaxModelLen) {
  ModelRunner runner = make_runner();
  SamplingParams p;
  Sequence a(0, range(0, 20), p, 0, 16);
  a.block_table.assign(17, 0);  // 256 / 16 = 16 columns at most
  a.num_scheduled_tokens = 1;
  EXPECT_THROW(runner.prepare_prefill({&a}), Error);
}

TEST(Ch04_ModelRunner, RefusesCheckpointTensorsTheConfigDoesNotDescribe) {
  // A config with fewer layers than the checkpoint ran the first layers only, and a stray tensor was
  // ignored: both must fail, naming the tensor. Copies of golden checkpoint A (2 layers, tied).
  const std::string a = test::data_path("golden/tiny-qwen3-a");
  Checkpoint golden = Checkpoint::open(a);
  char name[] = "/tmp/nanovllm-ch04-extra-XXXXXX";
  const std::string dir = mkdtemp(name);
  auto load = [&](const std::vector<std::string>& extra, const std::string& config_json) {
    std::vector<TensorToWrite> tensors;
    for (const std::string& n : golden.names()) {
      const TensorView& v = *golden.find(n);
      tensors.push_back({n, v.dtype, v.shape, v.data, {}});
    }
    for (const std::string& n : extra) {  // lm_head.weight as a copy of the embedding, others as a norm
      const TensorView& v = *golden.find(n == "lm_head.weight" ? "model.embed_tokens.weight" : "model.norm.weight");
      tensors.push_back({n, v.dtype, v.shape, v.data, {}});
    }
    write_safetensors(dir + "/model.safetensors", tensors);
    write_file(dir + "/config.json", config_json);
    EngineConfig c;
    c.model = dir;
    c.device = "cpu";
    c.num_kvcache_blocks = 4;
    return test::error_of([&] { ModelRunner runner(c); });
  };
  const std::string config = read_file(a + "/config.json");
  ASSERT_NE(config.find("\"num_hidden_layers\": 2"), std::string::npos);
  std::string one_layer = config;
  one_layer.replace(one_layer.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 1");
  ASSERT_NE(one_layer.find("\"layer_types\": ["), std::string::npos);  // its 2 entries would be refused first
  one_layer.replace(one_layer.find("\"layer_types\": ["), 16, "\"layer_types\": null, \"x\": [");
  EXPECT_EQ(load({}, one_layer), dir + ": unexpected tensor 'model.layers.1.input_layernorm.weight': config.json "
                                       "describes no such weight (num_hidden_layers 1, tie_word_embeddings true)");
  EXPECT_EQ(load({"model.layers.9.foo.weight"}, config),
            dir + ": unexpected tensor 'model.layers.9.foo.weight': config.json describes no such weight "
                  "(num_hidden_layers 2, tie_word_embeddings true)");
  // Harmless extras load: rotary inverse frequencies, and a tied checkpoint's lm_head.weight.
  EXPECT_EQ(load({"model.layers.0.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq", "lm_head.weight"},
                 config),
            "");
  std::system(("rm -rf '" + dir + "'").c_str());
}

// A CUDA graph's own transfers (Backend::pull_async, push_tokens_async), as the CPU backend does them: the
// byte ranges of the host copied to the same offsets and nothing else, the tokens to the row the slot names.
// Ch04_BackendCuda.AGraphPullsItsRangesAndPushesItsTokensAtEachReplay holds the GPU to the same.
TEST(Ch04_Backend, PullCopiesOnlyItsRangesAndPushWritesTheSlotsRow) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::vector<int32_t> host = range(0, 64), device(64, -7), tokens(2 * 8, -1);
  const Tensor dst(device.data(), DType::U8, Device::CPU, {int64_t(device.size() * 4)});
  cpu->pull_async(dst, host.data(), {{0, 8}, {40, 12}, {200, 4}});
  for (int w = 0; w < 64; w++) {
    const bool pulled = w < 2 || (w >= 10 && w < 13) || w == 50;
    EXPECT_EQ(device[size_t(w)], pulled ? w : -7) << "word " << w;
  }
  device[50] = 1;  // the slot
  const Tensor src(device.data() + 10, DType::I32, Device::CPU, {3}), slot(device.data() + 50, DType::I32, Device::CPU, {1});
  cpu->push_tokens_async(tokens.data(), 8, src, slot);
  EXPECT_EQ(tokens, (std::vector<int32_t>{-1, -1, -1, -1, -1, -1, -1, -1, 10, 11, 12, -1, -1, -1, -1, -1}));
}

// The CPU backend's norms pass their epsilon through: RMSNorm is x / sqrt(mean(x^2) + eps) * weight (layers.h).
// Row 0, x = [1e-3, -1e-3], has mean square 1e-6, as large as eps = 1e-6: out = x / sqrt(2e-6) * [1, 2] =
// [1/sqrt(2), -2/sqrt(2)] = [0.70710678, -1.41421356] (without eps it would be [1, -2]). Row 1 is zero: 0 /
// sqrt(eps) = 0 (without eps, 0/0 = NaN). add_rmsnorm first adds x into residual, which keeps the sum.
TEST(Ch04_Backend, CpuNormsAddTheirEpsilonToTheMeanSquare) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const float eps = 1e-6f, want[4] = {0.70710678f, -1.41421356f, 0.0f, 0.0f};
  std::vector<float> weight = {1.0f, 2.0f}, x = {1e-3f, -1e-3f, 0.0f, 0.0f}, out(4, -9.0f);
  const Tensor w_t(weight.data(), DType::F32, Device::CPU, {2}), out_t(out.data(), DType::F32, Device::CPU, {2, 2});
  cpu->rmsnorm(out_t, Tensor(x.data(), DType::F32, Device::CPU, {2, 2}), w_t, eps);
  EXPECT_TRUE(test::all_near(out.data(), want, 4, 1e-5, [](size_t i) { return "rmsnorm out " + std::to_string(i); }));

  std::vector<float> residual = {4e-4f, -1e-3f, 0.0f, 0.0f}, add = {6e-4f, 0.0f, 0.0f, 0.0f};
  std::fill(out.begin(), out.end(), -9.0f);
  cpu->add_rmsnorm(out_t, Tensor(residual.data(), DType::F32, Device::CPU, {2, 2}),
                   Tensor(add.data(), DType::F32, Device::CPU, {2, 2}), w_t, eps);
  EXPECT_TRUE(test::all_near(out.data(), want, 4, 1e-5, [](size_t i) { return "add_rmsnorm out " + std::to_string(i); }));
  EXPECT_TRUE(test::all_near(residual.data(), x.data(), 4, 1e-9, [](size_t i) { return "residual " + std::to_string(i); }));
}

TEST(Ch04_ModelRunner, ShapesTheCudaKernelsCannotTakeAreNamedBeforeLoading) {
  // The GPU's row kernels asserted these (an abort under --device cuda); now the runner names the field first.
  ModelConfig mc = ModelConfig::load(test::data_path("golden/tiny-qwen3-a"));
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(mc, tensor_parallel_layout(mc, 1), "c.json"); }), "");
  ModelConfig odd = mc;
  odd.hidden_size = 100;
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(odd, tensor_parallel_layout(odd, 1), "c.json"); }),
            "c.json: hidden_size 100 is not a multiple of 8 up to 8192, which the CUDA kernels need (--device cpu runs it)");
  odd = mc;
  odd.intermediate_size = 136;  // 8 x 17: whole on one rank, 34 a rank on 4
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(odd, tensor_parallel_layout(odd, 1), "c.json"); }), "");
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(odd, tensor_parallel_layout(odd, 4), "c.json"); }),
            "c.json: intermediate_size 136 is not a multiple of 8 on each of 4 ranks, which the CUDA kernels need "
            "(--device cpu runs it)");
  odd = mc;
  odd.head_dim = 96;
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(odd, tensor_parallel_layout(odd, 1), "c.json"); }),
            "c.json: head_dim 96 is not 64, 128 or 256, which the CUDA kernels need (--device cpu runs it)");
}

TEST(Ch04_ModelRunner, ABlockTableTooShortIsAnErrorNotAStrayRead) {
  // A sequence whose table lacks the block for a token it computes (a block manager broken in an exercise)
  // read its slot from past the table's end.
  ModelRunner runner = make_runner();
  Sequence s(0, range(1, 21), SamplingParams(), 0, 16);  // 20 tokens: two blocks of 16
  s.block_table = {3};
  s.num_scheduled_tokens = 20;
  EXPECT_EQ(test::error_of([&] { runner.prepare_prefill({&s}); }),
            "internal: sequence 0 computes up to position 19 but holds 1 block of 16 tokens");
  s.block_table = {3, 5};
  EXPECT_EQ(test::error_of([&] { runner.prepare_prefill({&s}); }), "");
  // At the edge: 17 tokens need two blocks of 16 (position 16 starts the second), 16 tokens one; in a
  // prefill, and in a decode step whose input is the 17th token.
  Sequence edge(1, range(1, 18), SamplingParams(), 0, 16);
  edge.block_table = {3};
  edge.num_scheduled_tokens = 17;
  EXPECT_EQ(test::error_of([&] { runner.prepare_prefill({&edge}); }),
            "internal: sequence 1 computes up to position 16 but holds 1 block of 16 tokens");
  edge.num_cached_tokens = 16, edge.num_scheduled_tokens = 1;
  EXPECT_EQ(test::error_of([&] { runner.prepare_decode({&edge}); }),
            "internal: sequence 1 computes up to position 16 but holds 1 block of 16 tokens");
  Sequence full(2, range(1, 17), SamplingParams(), 0, 16);
  full.block_table = {3};
  full.num_scheduled_tokens = 16;
  EXPECT_EQ(test::error_of([&] { runner.prepare_prefill({&full}); }), "");
}

TEST(Ch04_ModelRunner, BlocksThatFitClampAtIntMaxAndNeverGoNegative) {
  // Known answers: whole blocks only; nothing for an empty, negative or NaN budget; a budget of 2^50 bytes over
  // blocks of 1 KiB is 2^40 blocks, more than an int holds, which the cast wrapped (to a small pool).
  EXPECT_EQ(blocks_that_fit(10 * 1024 + 1023, 1024), 10);
  EXPECT_EQ(blocks_that_fit(1023, 1024), 0);
  EXPECT_EQ(blocks_that_fit(0, 1024), 0);
  EXPECT_EQ(blocks_that_fit(-5e9, 1024), 0);
  EXPECT_EQ(blocks_that_fit(std::nan(""), 1024), 0);
  EXPECT_EQ(blocks_that_fit(std::ldexp(1.0, 40), 1024), 1 << 30);
  EXPECT_EQ(blocks_that_fit(std::ldexp(1.0, 50), 1024), INT_MAX);
}

TEST(Ch04_ModelRunner, TheCudaKernelsTakeTheBoundsTheirErrorStates) {
  // The refusal states the bounds (model_runner.h: hidden_size a multiple of 8 up to kMaxCudaHidden, 8192;
  // head_dim 64, 128 or 256), so the bounds themselves must pass: each of the three head_dims, and a
  // hidden_size of 8192; 8200, the next multiple of 8, is past it.
  const ModelConfig mc = ModelConfig::load(test::data_path("golden/tiny-qwen3-a"));
  for (int head_dim : {64, 128, 256}) {
    ModelConfig c = mc;
    c.head_dim = head_dim;
    EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(c, tensor_parallel_layout(c, 1), "c.json"); }), "")
        << head_dim;
  }
  ModelConfig wide = mc;
  wide.hidden_size = 8192;
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(wide, tensor_parallel_layout(wide, 1), "c.json"); }), "");
  wide.hidden_size = 8200;
  EXPECT_EQ(test::error_of([&] { check_fits_cuda_kernels(wide, tensor_parallel_layout(wide, 1), "c.json"); }),
            "c.json: hidden_size 8200 is not a multiple of 8 up to 8192, which the CUDA kernels need (--device cpu runs it)");
}

TEST(Ch04_ModelRunner, TheCpuKvCacheGetsWhatTheBudgetLeavesAfterTheBuffers) {
  // On the CPU the KV cache budget is cpu_memory_mib x gpu_memory_utilization, less what the runner has
  // allocated already (weights and step buffers; allocate_kv_cache): so a smaller utilization, or larger step
  // buffers (more max_num_batched_tokens rows) under the same budget, leave fewer blocks; and the cache never
  // takes more than the budget. Golden checkpoint A; a block is 64 KiB (2 x 2 layers x 16 x 2 x 128 x 4 bytes)
  // and the buffers of 4096 rows are megabytes more than those of 256, so the counts differ by many blocks.
  const auto runner_with = [](double utilization, int max_tokens) {
    EngineConfig c = config_a();
    c.kvcache_block_size = 16;
    c.max_num_seqs = 8;
    c.max_model_len = 256;
    c.max_num_batched_tokens = max_tokens;
    c.cpu_memory_mib = 64;
    c.gpu_memory_utilization = utilization;
    return std::make_unique<ModelRunner>(c);
  };
  const auto full = runner_with(0.9, 256), half = runner_with(0.45, 256), wide = runner_with(0.9, 4096);
  const double budget = 64.0 * (1 << 20);
  EXPECT_LE(double(full->kv_cache_bytes()), 0.9 * budget);
  EXPECT_LE(double(half->kv_cache_bytes()), 0.45 * budget);
  EXPECT_GT(half->num_kvcache_blocks(), 16);  // above the floor of one sequence of 256 tokens
  EXPECT_LT(half->num_kvcache_blocks(), full->num_kvcache_blocks());
  EXPECT_LT(wide->num_kvcache_blocks(), full->num_kvcache_blocks());
  // The weights are part of what is allocated already. Golden A holds 279,360 parameters, by hand from its
  // config: per layer q 512 x 64 + k 256 x 64 + v 256 x 64 + o 64 x 512 + gate, up, down 3 x 128 x 64 + norms
  // 64 + 64 + 128 + 128 = 123,264, two layers 246,528, the tied embedding 512 x 64 = 32,768, the final norm 64.
  // In fp32 on the CPU that is 1,117,440 bytes, 17 blocks: with buffers for steps of 16 tokens (far less than
  // that), a budget that forgot the weights would give their bytes to the cache, past the budget.
  const auto narrow = runner_with(0.9, 16);
  const double weight_bytes = 279360.0 * 4;
  EXPECT_LE(double(narrow->kv_cache_bytes()) + weight_bytes, 0.9 * budget) << "the cache left no room for the weights";
  EXPECT_LE(double(full->kv_cache_bytes()) + weight_bytes, 0.9 * budget);
}

TEST(Ch04_ModelRunner, ADecodeStepMayHoldMoreSequencesThanMaxNumBatchedTokens) {
  // max_num_batched_tokens bounds the tokens a prefill step schedules; a decode step is one row a sequence,
  // up to max_num_seqs of them, however few tokens a prefill may batch (nano-vllm's scheduler decodes up to
  // max_num_seqs). Six greedy sequences, each prefilled alone (2 tokens), then decoded in one step on a
  // runner of 2 batched tokens, must give the tokens they get on a runner of 256.
  const auto decode_six = [](int max_tokens) {
    EngineConfig c = config_a();
    c.kvcache_block_size = 16;
    c.num_kvcache_blocks = 8;
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = max_tokens;
    c.max_model_len = 16;
    ModelRunner runner(c);
    SamplingParams greedy;
    greedy.temperature = 0;
    std::vector<std::unique_ptr<Sequence>> owned;
    std::vector<Sequence*> batch;
    for (int s = 0; s < 6; s++) {
      owned.push_back(std::make_unique<Sequence>(s, range(3 * s + 1, 3 * s + 3), greedy, 0, 16));
      Sequence& seq = *owned.back();
      seq.block_table = {s};
      seq.num_scheduled_tokens = 2;
      seq.append_token(runner.run({&seq}, true).at(0));
      seq.num_cached_tokens = 2;
      seq.num_scheduled_tokens = 1;
      batch.push_back(&seq);
    }
    return runner.run(batch, false);
  };
  std::vector<int32_t> narrow;
  EXPECT_EQ(test::error_of([&] { narrow = decode_six(2); }), "");
  EXPECT_EQ(narrow, decode_six(256));
  EXPECT_EQ(narrow.size(), 6u);
}

TEST(Ch04_ModelRunner, LogitsAreRefusedWhileALaterStepIsInFlight) {
  // run(seqs, ..., &logits) launches its step, collects the oldest step in flight and downloads the logits.
  // With a step launched before it, the step collected is that earlier one, while the logits on the device
  // are the later step's: tokens of one step with logits of another, so it is refused (download_logits).
  ModelRunner runner = make_runner();
  const std::vector<std::unique_ptr<Sequence>> owned = prefilled_three(runner, 5, 200, /*room=*/2);
  const std::vector<Sequence*> batch = {owned[0].get(), owned[1].get(), owned[2].get()};
  runner.launch(batch, false);
  std::vector<float> logits;
  EXPECT_EQ(test::error_of([&] { runner.run(batch, false, &logits); }),
            "internal: logits asked for while a later step is in flight");
}

TEST(Ch04_ModelRunner, InputRowsAreRefusedWhereNoStepBeforeCanGiveThem) {
  // input_rows name, for each sequence of a decode step, the row of the step in flight whose sampled token is
  // its input (the overlapped loop). They mean nothing for a prefill (its inputs are the prompt), nor with no
  // step in flight, nor for a batch of another size than the rows given: each is refused before anything runs.
  const std::string refused =
      "internal: input rows for a prefill, a batch of another size, several ranks, or no step before";
  ModelRunner runner = make_runner();
  const std::vector<std::unique_ptr<Sequence>> owned = prefilled_three(runner, 5, 200, /*room=*/2);
  const std::vector<Sequence*> batch = {owned[0].get(), owned[1].get(), owned[2].get()};
  EXPECT_EQ(test::error_of([&] { runner.launch(batch, false, {0, 1, 2}); }), refused);  // no step in flight
  runner.launch(batch, false);
  EXPECT_EQ(test::error_of([&] { runner.launch(batch, false, {0, 1}); }), refused);  // 2 rows for 3 sequences
  SamplingParams greedy;
  greedy.temperature = 0;
  Sequence prompt(7, range(1, 5), greedy, 0, 16);
  prompt.block_table = {20};
  prompt.num_scheduled_tokens = 4;
  EXPECT_EQ(test::error_of([&] { runner.launch({&prompt}, true, {0}); }), refused);  // a prefill
  EXPECT_EQ(runner.collect().size(), 3u);  // the one step launched is still there to collect
}

TEST(Ch04_ModelRunner, AThirdStepIsRefusedBeforeTheFirstIsCollected) {
  // Two steps may be in flight (the overlapped loop), each writing its tokens to one of two host slots; a third
  // would write into the first one's slot before it is read, so launch refuses it, and the two launched are
  // still collected, in order, as the plain loop gives them.
  ModelRunner plain_runner = make_runner();
  const std::vector<std::unique_ptr<Sequence>> plain = prefilled_three(plain_runner, 5, 200, /*room=*/2);
  const std::vector<int32_t> expected = plain_runner.run({plain[0].get(), plain[1].get(), plain[2].get()}, false);

  ModelRunner runner = make_runner();
  const std::vector<std::unique_ptr<Sequence>> owned = prefilled_three(runner, 5, 200, /*room=*/2);
  const std::vector<Sequence*> batch = {owned[0].get(), owned[1].get(), owned[2].get()};
  runner.launch(batch, false);
  runner.launch(batch, false);
  EXPECT_EQ(test::error_of([&] { runner.launch(batch, false); }),
            "internal: a third step launched before the first was collected");
  EXPECT_EQ(runner.collect(), expected);
  EXPECT_EQ(runner.collect(), expected);  // the same inputs again: the same tokens (greedy, and seeded by position)
}

TEST(Ch04_ModelRunner, ATiedCheckpointsOwnLmHeadMustBeItsEmbedding) {
  // With tie_word_embeddings the LM head is the embedding (nano-vllm points one at the other), so a tied
  // checkpoint may hold its own lm_head.weight only as the same tensor: same values and same shape
  // (load_qwen3_weights). Copies of golden checkpoint A (tied): lm_head.weight equal to the embedding loads;
  // one value changed, or the same bytes as a [hidden, vocab] tensor, cannot be told from another head.
  const std::string a = test::data_path("golden/tiny-qwen3-a");
  Checkpoint golden = Checkpoint::open(a);
  const TensorView& embed = *golden.find("model.embed_tokens.weight");
  ASSERT_EQ(embed.shape.size(), 2u);
  ASSERT_NE(embed.shape[0], embed.shape[1]);  // so that the transposed shape is another shape
  test::TempDir dir;
  write_file(dir / "config.json", read_file(a + "/config.json"));
  auto load = [&](const uint8_t* head, std::vector<int64_t> shape) {
    std::vector<TensorToWrite> tensors;
    for (const std::string& n : golden.names()) {
      const TensorView& v = *golden.find(n);
      tensors.push_back({n, v.dtype, v.shape, v.data, {}});
    }
    tensors.push_back({"lm_head.weight", embed.dtype, shape, head, {}});
    write_safetensors(dir / "model.safetensors", tensors);
    EngineConfig c;
    c.model = dir.path();
    c.device = "cpu";
    c.num_kvcache_blocks = 4;
    return test::error_of([&] { ModelRunner runner(c); });
  };
  std::vector<uint8_t> copy(embed.data, embed.data + embed.nbytes);
  EXPECT_EQ(load(copy.data(), embed.shape), "");
  const std::string refused = dir.path() + ": config.json says tie_word_embeddings, but lm_head.weight differs from "
                                           "model.embed_tokens.weight";
  EXPECT_EQ(load(copy.data(), {embed.shape[1], embed.shape[0]}), refused);
  copy[copy.size() / 2] ^= 0x01;  // one bit of one value
  EXPECT_EQ(load(copy.data(), embed.shape), refused);
}
