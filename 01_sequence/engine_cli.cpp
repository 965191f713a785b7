// engine_cli.cpp: the subcommands that run the model: `generate` and `logits`.
//
//   nanovllm generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)... [sampling] [engine options] [--json]
//   nanovllm logits   --model DIR --prompt-ids 1,2,3
//
// Part of the entry (linked last): it builds an LLMEngine from flags.
#include <cstdio>
#include <iostream>

#include "01_sequence/cli.h"
#include "01_sequence/json.h"
#include "01_sequence/llm_engine.h"
#include "02_scheduler/scheduler.h"
#include "04_model_runner/model_runner.h"

namespace nanovllm {

namespace {

// "1,2,3" -> {1, 2, 3}.
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      throw UsageError("--prompt-ids expects comma-separated token ids, got '" + text + "'");
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) throw UsageError("--prompt-ids is empty");
  return ids;
}

EngineConfig engine_config_from(const Flags& f) {
  EngineConfig c;
  c.model = f.get("model");
  if (c.model.empty()) throw UsageError("--model DIR is required");
  c.device = f.get("device");
  c.max_num_seqs = int(f.get_int("max-num-seqs", c.max_num_seqs, 1, 1 << 20));
  c.max_num_batched_tokens = int(f.get_int("max-num-batched-tokens", c.max_num_batched_tokens, 1, 1 << 24));
  c.max_model_len = int(f.get_int("max-model-len", c.max_model_len, 1, 1 << 24));
  c.gpu_memory_utilization = float(f.get_double("gpu-memory-utilization", c.gpu_memory_utilization, 0.01, 1.0));
  c.kvcache_block_size = int(f.get_int("block-size", c.kvcache_block_size, 16, 1 << 16));
  if (c.kvcache_block_size % 16 != 0) throw UsageError("--block-size must be a multiple of 16");
  c.num_kvcache_blocks = int(f.get_int("kv-cache-blocks", -1, 1, 1 << 30));
  if (!f.has("kv-cache-blocks")) c.num_kvcache_blocks = -1;
  c.tensor_parallel_size = int(f.get_int("tensor-parallel-size", 1, 1, 8));
  c.enforce_eager = f.has("enforce-eager");
  c.trace = f.has("trace");
  c.seed = f.get_uint64("seed", 0);
  if (!c.device.empty() && c.device != "cpu" && c.device != "cuda")
    throw UsageError("--device must be cpu or cuda, got '" + c.device + "'");
  return c;
}

SamplingParams sampling_from(const Flags& f) {
  SamplingParams p;
  p.temperature = float(f.get_double("temperature", p.temperature, -1e30, 1e30));
  p.max_tokens = int(f.get_int("max-tokens", p.max_tokens, INT32_MIN, INT32_MAX));
  p.top_k = int(f.get_int("top-k", p.top_k, INT32_MIN, INT32_MAX));
  p.top_p = float(f.get_double("top-p", p.top_p, -1e30, 1e30));
  p.ignore_eos = f.has("ignore-eos");
  p.validate();  // "temperature must be >= 0 ...": exit 1, naming the value
  return p;
}

}  // namespace

int cmd_generate(const Flags& flags) {
  SamplingParams params = sampling_from(flags);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& ids : flags.get_all("prompt-ids")) prompts.push_back(parse_ids(ids));
  if (flags.has("prompt")) fail("--prompt TEXT needs the tokenizer, which this build does not have yet; use --prompt-ids");
  if (prompts.empty()) throw UsageError("give at least one --prompt-ids");

  LLMEngine engine(engine_config_from(flags));
  std::vector<GenerateOutput> outputs = engine.generate(prompts, {params}, /*progress=*/true);

  for (size_t i = 0; i < outputs.size(); i++) {
    const GenerateOutput& out = outputs[i];
    if (flags.has("json")) {
      Json line = Json::object();
      line.set("index", int64_t(i));
      Json prompt_ids = Json::array(), token_ids = Json::array();
      for (int32_t t : out.prompt_token_ids) prompt_ids.push_back(t);
      for (int32_t t : out.token_ids) token_ids.push_back(t);
      line.set("prompt_token_ids", prompt_ids);
      line.set("token_ids", token_ids);
      std::cout << line.dump() << "\n";
    } else {
      std::cout << "Prompt " << i << ": " << out.prompt_token_ids.size() << " tokens\nCompletion " << i << ":";
      for (int32_t t : out.token_ids) std::cout << " " << t;
      std::cout << "\n";
    }
  }
  const EngineStats& s = engine.stats();
  std::fprintf(stderr, "%zu requests: %lld prompt tokens in %lld prefill steps (%.0f tok/s), %lld decode tokens in %lld steps (%.0f tok/s)\n",
               outputs.size(), (long long)s.prefill_tokens, (long long)s.prefill_steps,
               s.prefill_seconds > 0 ? s.prefill_tokens / s.prefill_seconds : 0.0, (long long)s.decode_tokens,
               (long long)s.decode_steps, s.decode_seconds > 0 ? s.decode_tokens / s.decode_seconds : 0.0);
  if (engine.scheduler().num_preemptions() || engine.scheduler().block_manager().total_hit_blocks())
    std::fprintf(stderr, "prefix cache: %lld blocks hit; preemptions: %lld\n",
                 (long long)engine.scheduler().block_manager().total_hit_blocks(),
                 (long long)engine.scheduler().num_preemptions());
  return 0;
}

int cmd_logits(const Flags& flags) {
  if (!flags.has("prompt-ids")) throw UsageError("--prompt-ids is required");
  std::vector<int32_t> prompt = parse_ids(flags.get("prompt-ids"));
  EngineConfig config = engine_config_from(flags);
  LLMEngine engine(config);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 1;
  engine.add_request(prompt, greedy);
  // Prefill the prompt (in chunks if the token budget is small): the last step's logits are those after
  // the last prompt token.
  std::vector<float> logits;
  while (!engine.is_finished()) engine.step(nullptr, &logits);
  std::string out = "[";
  for (size_t i = 0; i < logits.size(); i++) {
    if (i) out += ',';
    json_append_float(out, logits[i]);
  }
  out += "]\n";
  std::cout << out;
  return 0;
}

}  // namespace nanovllm
