// bench.cpp: `nanovllm bench`, nano-vllm's bench.py reproduced exactly (nano-vllm: bench.py), and
// `nanovllm bench-step`, one decode step operation by operation.
//
// bench.py: random.seed(0); 256 prompts of randint(100, 1024) token ids, each randint(0, 10000); then
// for each, SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, 1024)); one warm-up
// request; throughput = total max_tokens / wall time of generate(). Python's `random` is MT19937 seeded
// by init_by_array([0]), and randint draws by rejection from getrandbits; PythonRandom below is the same
// generator, so the workload is the same token for token: 142,827 prompt and 133,966 output tokens.
// Beside throughput it reports what a serving user reads, time to first token and time per output token
// (serving_metrics.h), from the times the engine stamps on each request (RequestTimes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "01_sequence/base/files.h"
#include "01_sequence/cli/flags.h"
#include "01_sequence/cli/serving_metrics.h"
#include "01_sequence/llm_engine.h"
#include "02_scheduler/scheduler.h"
#include "04_model_runner/model_runner.h"
#include "04_model_runner/profiler.h"
#include "04_model_runner/checkpoint/random_model.h"
#include "05_attention/attention.h"

namespace nanovllm {

namespace {

// CPython's random.Random: the MT19937 Mersenne Twister (Matsumoto & Nishimura's reference algorithm).
class PythonRandom {
 public:
  // random.seed(n) for a small non-negative int n: init_by_array([n]).
  explicit PythonRandom(uint32_t seed) {
    init_genrand(19650218u);
    const uint32_t key[1] = {seed};
    int i = 1, j = 0;
    for (int k = kN; k > 0; k--) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + uint32_t(j);
      i++, j++;
      if (i >= kN) mt_[0] = mt_[kN - 1], i = 1;
      if (j >= 1) j = 0;
    }
    for (int k = kN - 1; k > 0; k--) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
      i++;
      if (i >= kN) mt_[0] = mt_[kN - 1], i = 1;
    }
    mt_[0] = 0x80000000u;
  }

  // random.randint(a, b): a + _randbelow(b - a + 1), by rejection on getrandbits(bit_length(n)).
  int randint(int a, int b) {
    const uint32_t n = uint32_t(b - a + 1);
    int k = 0;
    while ((n >> k) != 0) k++;
    uint32_t r;
    do r = next() >> (32 - k);  // getrandbits(k) for k <= 32
    while (r >= n);
    return a + int(r);
  }

 private:
  static constexpr int kN = 624, kM = 397;

  void init_genrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < kN; i++) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + uint32_t(i);
    index_ = kN;
  }

  uint32_t next() {
    if (index_ >= kN) {
      for (int i = 0; i < kN; i++) {
        uint32_t y = (mt_[i] & 0x80000000u) | (mt_[(i + 1) % kN] & 0x7fffffffu);
        mt_[i] = mt_[(i + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
      }
      index_ = 0;
    }
    uint32_t y = mt_[index_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }

  uint32_t mt_[kN];
  int index_ = kN + 1;
};

// The model folder of `bench` and `bench-step`: --model DIR, or --random PRESET, random weights of a real
// model's shape (speed does not depend on the values) in build/data/random-PRESET, written on first use
// (see ensure_random_model). An unknown preset is a usage error, found before anything is written.
std::string model_from(const Flags& flags) {
  std::string model = flags.get("model");
  if (model.empty() == !flags.has("random")) throw UsageError("give exactly one of --model DIR and --random PRESET");
  if (!flags.has("random")) return model;
  const std::string preset = flags.get("random");
  try {
    random_model_config(preset);
  } catch (const Error& e) {
    throw UsageError(std::string("--random: ") + e.what());
  }
  // A run that cannot start says so before 1.2 GB (qwen3-0.6b) of weights are written for it.
  if (flags.get("device") == "cuda" && !cuda_available()) {
#ifdef NANOVLLM_CUDA
    fail("--device cuda: no CUDA device is present");
#else
    fail("--device cuda: this build has no CUDA support (it was built without nvcc)");
#endif
  }
  const std::string dir = data_dir() + "/random-" + preset;
  if (!is_complete_random_model(dir, /*with_tokenizer=*/false))
    std::fprintf(stderr, "writing random %s weights to %s ...\n", preset.c_str(), dir.c_str());
  ensure_random_model(preset, dir, 0);
  return dir;
}

// Wraps the runner's backend in a profiler and switches CUDA graphs off (a graph replay runs no
// operation one by one). The runner owns the profiler; the pointer stays valid as long as the runner.
ProfiledBackend* profile(ModelRunner& runner) {
  ProfiledBackend* profiler = nullptr;
  runner.wrap_backend([&](std::unique_ptr<Backend> inner) {
    auto wrapped = std::make_unique<ProfiledBackend>(std::move(inner));
    if (!profiler) profiler = wrapped.get();  // rank 0's (with tensor parallelism every rank is wrapped)
    return wrapped;
  });
  runner.set_enforce_eager(true);
  return profiler;
}

}  // namespace

int cmd_bench(const Flags& flags) {
  const int num_seqs = int(flags.get_int("num-seqs", 256, 1, 1 << 20));
  const int max_input_len = int(flags.get_int("max-input-len", 1024, 100, 1 << 20));
  const int max_output_len = int(flags.get_int("max-output-len", 1024, 100, 1 << 20));

  // bench.py's workload.
  PythonRandom rng(0);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(num_seqs));
  for (auto& p : prompts) {
    p.resize(size_t(rng.randint(100, max_input_len)));
    for (auto& t : p) t = rng.randint(0, 10000);
  }
  std::vector<SamplingParams> params(static_cast<size_t>(num_seqs));
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (size_t i = 0; i < params.size(); i++) {
    params[i].temperature = 0.6f;
    params[i].ignore_eos = true;
    params[i].max_tokens = rng.randint(100, max_output_len);
    prompt_tokens += int64_t(prompts[i].size());
    output_tokens += params[i].max_tokens;
  }

  EngineConfig config;
  config.device = device_or_default(device_from(flags));  // known here: --profile's graphs depend on it
  config.max_model_len = int(flags.get_int("max-model-len", 4096, 1, 1 << 24));
  config.max_num_seqs = int(flags.get_int("max-num-seqs", config.max_num_seqs, 1, 1 << 20));
  config.max_num_batched_tokens = int(flags.get_int("max-num-batched-tokens", config.max_num_batched_tokens, 1, 1 << 24));
  config.gpu_memory_utilization = float(flags.get_double("gpu-memory-utilization", 0.9, 0.01, 1.0));
  config.kvcache_block_size = block_size_from(flags, 256);
  if (flags.has("kv-cache-blocks")) config.num_kvcache_blocks = int(flags.get_int("kv-cache-blocks", -1, 1, 1 << 30));
  // Profiling times operations one by one: no graphs to capture (the CPU has none, and no note about it).
  const bool on_cpu = config.device == "cpu";
  config.enforce_eager = flags.has("enforce-eager") || (flags.has("profile") && !on_cpu);
  config.cpu_memory_mib = int(flags.get_int("cpu-memory-mib", config.cpu_memory_mib, 1, 1 << 24));
  config.tensor_parallel_size = int(flags.get_int("tensor-parallel-size", 1, 1, 8));
  config.attention_version = attention_version_from(flags);
  config.linear_version = linear_version_from(flags);
  config.collectives = collectives_from(flags);
  config.trace = flags.has("trace");
  config.overlap_steps = !flags.has("no-overlap");
  config.seed = flags.get_uint64("seed", 0);
  // Last, once every other flag is known good: --random may write a whole checkpoint (1.2 GB for qwen3-0.6b).
  const std::string model = model_from(flags);
  config.model = model;

  // bench.py's ids go up to 10,000 whatever the model (Qwen3's vocabulary has 151,936): a smaller vocabulary is
  // named here, not as "request 1: token id 6890 is outside the vocabulary", an id the user never gave, and
  // before the model is loaded, so that the error is the run's only line.
  int32_t largest_id = 0;
  for (const auto& p : prompts) largest_id = std::max(largest_id, *std::max_element(p.begin(), p.end()));
  const ModelConfig model_config = ModelConfig::load(model);
  if (largest_id >= model_config.vocab_size)
    fail("bench: bench.py's random prompts hold token ids up to ", largest_id, ", past this model's vocabulary of ",
         model_config.vocab_size, " (", model, "); bench needs a vocabulary of more than 10,000 ids");
  // The same for the lengths: a request longer than max_model_len (the model runner cuts it to the model's
  // positions) is named here by the flags that made it, not as "request 0", the warm-up the user never gave.
  // Warm-up, as bench.py: one short request with default sampling (temperature 1, 64 tokens), run below.
  const std::vector<int32_t> warm_up_prompt = {1, 2, 3};
  int64_t longest = int64_t(warm_up_prompt.size()) + SamplingParams().max_tokens;
  for (size_t i = 0; i < prompts.size(); i++) longest = std::max(longest, int64_t(prompts[i].size()) + params[i].max_tokens);
  const int64_t limit = std::min(config.max_model_len, model_config.max_position_embeddings);
  if (longest > limit)
    fail("bench: the workload's longest request needs ", longest, " tokens (prompt + max_tokens, from --max-input-len ",
         max_input_len, " and --max-output-len ", max_output_len, ") but max_model_len is ", limit,
         limit < config.max_model_len ? " (the model's max_position_embeddings)" : "");

  auto t_load = std::chrono::steady_clock::now();
  LLMEngine engine(config);
  note_a_cut_max_model_len(flags, engine.config().max_model_len);
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  std::fprintf(stderr, "model %s on %s: %d KV blocks of %d tokens (%.1f GiB), loaded in %.1f s\n", model.c_str(),
               engine.config().device.c_str(), engine.config().num_kvcache_blocks, config.kvcache_block_size,
               double(engine.model_runner().kv_cache_bytes()) / (1 << 30), load_seconds);

  engine.generate(std::vector<std::vector<int32_t>>{warm_up_prompt}, {SamplingParams()});  // the warm-up
  const EngineStats before = engine.stats();

  ProfiledBackend* profiler = nullptr;
  if (flags.has("profile")) profiler = profile(engine.model_runner());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<GenerateOutput> outputs = engine.generate(prompts, params);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t generated = 0;
  for (const auto& o : outputs) generated += int64_t(o.token_ids.size());
  if (generated != output_tokens) fail("generated ", generated, " tokens, expected ", output_tokens);
  const EngineStats& s = engine.stats();
  const int64_t decode_steps = s.decode_steps - before.decode_steps;
  const double decode_seconds = s.decode_seconds - before.decode_seconds;
  const double prefill_seconds = s.prefill_seconds - before.prefill_seconds;
  // Bytes a decode step must read at least: every weight once, and the K/V of every context token.
  const ModelConfig& mc = engine.model_runner().model_config();
  const double weight_bytes = decode_step_weight_bytes(mc, engine.config().device == "cpu" ? 4 : 2);  // fp32 / bf16
  const double kv_bytes_per_token = double(engine.model_runner().kv_block_bytes()) / config.kvcache_block_size;
  const double decode_bytes = double(decode_steps) * weight_bytes +
                              double(s.decode_context_tokens - before.decode_context_tokens) * kv_bytes_per_token;

  std::printf("Total: %lldtok, Time: %.2fs, Throughput: %.2ftok/s\n", (long long)output_tokens, seconds,
              double(output_tokens) / seconds);
  // Every request arrived when generate() queued it, at t0 to within the queueing itself (bench.py: t = 0).
  auto since_t0 = [&](std::chrono::steady_clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
  std::vector<RequestTiming> timings;
  for (const GenerateOutput& o : outputs)
    timings.push_back({since_t0(o.times.arrival), since_t0(o.times.first_token), since_t0(o.times.finished),
                       int(o.token_ids.size())});
  const ServingMetrics m = serving_metrics(timings);
  std::printf("TTFT (time to first token): median %.1f ms, p99 %.1f ms; TPOT (time per output token): median %.2f ms, "
              "p99 %.2f ms; over %s arriving at t=0\n",
              1e3 * m.ttft_median, 1e3 * m.ttft_p99, 1e3 * m.tpot_median, 1e3 * m.tpot_p99,
              counted(m.requests, "request").c_str());
  std::printf("prompt tokens %lld, prefill steps %lld (%.3f s); %lld decode steps (%.3f s, %.3f ms/step)\n",
              (long long)prompt_tokens, (long long)(s.prefill_steps - before.prefill_steps), prefill_seconds,
              (long long)decode_steps, decode_seconds, 1e3 * decode_seconds / double(std::max<int64_t>(decode_steps, 1)));
  // Whole GB/s on a GPU; on the CPU, well under 10 GB/s, two decimals (a whole number printed 0).
  const double decode_gbps = decode_bytes / 1e9 / decode_seconds;
  std::printf("decode reads >= %.1f GB (weights + KV): %.*f GB/s over the decode steps\n", decode_bytes / 1e9,
              decode_gbps < 10 ? 2 : 0, decode_gbps);
  const double queue_seconds = s.decode_queue_seconds - before.decode_queue_seconds;
  const double wait_seconds = s.decode_wait_seconds - before.decode_wait_seconds;
  std::printf("decode steps on the host: %.3f s scheduling and bookkeeping, %.3f s preparing and queuing the "
              "step, %.3f s waiting for its tokens\n",
              decode_seconds - queue_seconds - wait_seconds, queue_seconds, wait_seconds);
  std::printf("decode steps launched before the tokens of the step ahead were read: %lld of %lld\n",
              (long long)(s.overlapped_steps - before.overlapped_steps), (long long)decode_steps);
  std::printf("prefill steps launched before the tokens of the step ahead were read: %lld of %lld\n",
              (long long)(s.overlapped_prefill_steps - before.overlapped_prefill_steps),
              (long long)(s.prefill_steps - before.prefill_steps));
  std::printf("preemptions %lld, prefix-cache hit blocks %lld\n", (long long)engine.scheduler().num_preemptions(),
              (long long)engine.scheduler().block_manager().total_hit_blocks());
  if (profiler) {
    // Kernel time per operation over the whole run (eager; linear layers, fused or not, grouped by weight
    // shape: "linear+silu 16x1024->6144" counts as "linear+silu 1024->6144").
    std::map<std::string, OpTime> totals;
    for (const OpTime& op : profiler->report()) {
      std::string label = op.label;
      const size_t shape_at = label.rfind(' ');
      if (label.find("linear") != std::string::npos && shape_at != std::string::npos &&
          label.find('x', shape_at) != std::string::npos)
        label = label.substr(0, shape_at + 1) + label.substr(label.find('x', shape_at) + 1);
      totals[label].calls += op.calls, totals[label].milliseconds += op.milliseconds;
    }
    double sum = 0;
    std::printf("%-30s %9s %10s\n", "operation (whole run)", "calls", "ms");
    for (const auto& [label, t] : totals) std::printf("%-30s %9d %10.1f\n", label.c_str(), t.calls, t.milliseconds), sum += t.milliseconds;
    std::printf("%-30s %9s %10.1f   of %.1f ms wall\n", "kernels", "", sum, seconds * 1e3);
  }
  return 0;
}

// `nanovllm bench-step`: one decode step at a given batch and context, operation by operation, with the
// bytes each must move and the bandwidth it reached against the measured copy bandwidth.
int cmd_bench_step(const Flags& flags) {
  const int batch = int(flags.get_int("batch", 256, 1, 1 << 16));
  const int context = int(flags.get_int("context", 1000, 1, 1 << 20));
  const int iterations = int(flags.get_int("iters", 20, 1, 100000));
  EngineConfig config;
  config.device = device_from(flags);
  config.max_num_seqs = std::max(batch, 1);
  config.max_num_batched_tokens = std::max(batch, 1024);
  config.kvcache_block_size = block_size_from(flags, 256);
  config.max_model_len = std::max(4096, context);
  config.gpu_memory_utilization = float(flags.get_double("gpu-memory-utilization", 0.9, 0.01, 1.0));
  config.cpu_memory_mib = int(flags.get_int("cpu-memory-mib", config.cpu_memory_mib, 1, 1 << 24));
  config.tensor_parallel_size = int(flags.get_int("tensor-parallel-size", 1, 1, 8));
  config.attention_version = attention_version_from(flags);
  config.linear_version = linear_version_from(flags);
  config.collectives = collectives_from(flags);
  config.model = model_from(flags);  // last, once every other flag is known good: --random may write the weights
  config.validate();
  ModelRunner runner(config);
  const ModelConfig& mc = runner.model_config();
  if (context > config.max_model_len)  // ModelRunner clamped max_model_len to the model's positions
    fail("--context ", context, " is longer than the model's max_position_embeddings (", mc.max_position_embeddings, ")");
  const bool on_gpu = runner.device() == Device::CUDA;
  const double copy_gbps = on_gpu ? measure_copy_bandwidth() : 0;  // no roofline for the CPU here

  // `batch` sequences of `context` tokens, each with its own blocks; the K/V are whatever the cache holds.
  const int block_size = config.kvcache_block_size, blocks_per_seq = ceil_div(context, block_size);
  if (int64_t(batch) * blocks_per_seq > runner.num_kvcache_blocks())
    fail("batch ", batch, " x context ", context, " needs ", int64_t(batch) * blocks_per_seq, " KV blocks; the cache has ",
         runner.num_kvcache_blocks(), " (give a smaller --batch or --context, or more memory: ",
         on_gpu ? "--gpu-memory-utilization" : "--cpu-memory-mib", ")");
  std::vector<std::unique_ptr<Sequence>> owned;
  std::vector<Sequence*> seqs;
  SamplingParams params;
  params.temperature = 0.6f;
  for (int b = 0; b < batch; b++) {
    owned.push_back(std::make_unique<Sequence>(b, std::vector<int32_t>(size_t(context), 1), params, b, block_size));
    for (int i = 0; i < blocks_per_seq; i++) owned.back()->block_table.push_back(b * blocks_per_seq + i);
    owned.back()->num_cached_tokens = context - 1;
    owned.back()->num_scheduled_tokens = 1;
    seqs.push_back(owned.back().get());
  }
  // Milliseconds per step, host work included: one warm-up, then the mean of `iterations` steps. `host`
  // gets the mean of ModelRunner::last_run_times: the host preparing and queuing each step, then waiting for
  // its tokens (on a GPU, mostly the device running it).
  ModelRunner::RunTimes host;
  auto time_step = [&] {
    runner.run(seqs, false);
    host = ModelRunner::RunTimes{};
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; i++) {
      runner.run(seqs, false);  // returns the tokens: synchronous
      host.queue_seconds += runner.last_run_times().queue_seconds / iterations;
      host.wait_seconds += runner.last_run_times().wait_seconds / iterations;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iterations;
  };
  const double graph_ms = time_step();
  const ModelRunner::RunTimes graph_host = host;
  // The same steps as the engine's loop runs them (LLMEngine::step): each queued before the tokens of the
  // one ahead are read, two in flight, so the host's preparing and queuing and the launch's way to the
  // device overlap the step ahead's run (the graph is warm from the loop above).
  const auto t_overlapped = std::chrono::steady_clock::now();
  runner.launch(seqs, false);
  for (int i = 1; i < iterations; i++) {
    runner.launch(seqs, false);
    runner.collect();
  }
  runner.collect();
  const double overlapped_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_overlapped).count() / iterations;
  // One more step for an external profiler (`ncu --profile-from-start off`), under the graph when there is one.
  profiler_range_begin();
  runner.run(seqs, false);
  profiler_range_end();
  runner.set_enforce_eager(true);
  const double eager_ms = time_step();
  ProfiledBackend* profiler = profile(runner);
  for (int i = 0; i < iterations; i++) runner.run(seqs, false);
  std::vector<OpTime> ops = profiler->report();
  for (OpTime& op : ops) op.milliseconds /= iterations, op.calls /= iterations;

  const double kv_bytes_per_token_layer = double(runner.kv_block_bytes()) / block_size / mc.num_hidden_layers;
  // The step's floor: what it must read at least (every weight once, every context token's K and V once
  // per layer), at the measured copy bandwidth.
  const int element_bytes = on_gpu ? 2 : 4;  // weights and activations: bf16 on the GPU, fp32 on the CPU
  const double floor_weights = decode_step_weight_bytes(mc, element_bytes);
  const double floor_kv = double(batch) * context * kv_bytes_per_token_layer * mc.num_hidden_layers;
  if (copy_gbps > 0)
    std::printf("decode step: batch %d, context %d, cuda; copy bandwidth %.0f GB/s\n", batch, context, copy_gbps);
  else
    std::printf("decode step: batch %d, context %d, cpu (no copy bandwidth to compare with on the CPU)\n", batch,
                context);
  const bool graphs = !runner.graph_batch_sizes().empty();
  if (!graphs)
    std::printf("step time: %.3f ms (host work included; no CUDA graphs on this device)\n", eager_ms);
  else
    std::printf("step time: %.3f ms eager, %.3f ms under a CUDA graph (host work included)\n", eager_ms, graph_ms);
  // What the step time above is made of on the host (the graph step's where there is one): a synchronous
  // loop pays the host's preparing and launching, which the engine's overlapped loop hides
  // (02_scheduler/README.md, "Beyond nano-vllm"), on top of the device's run.
  const ModelRunner::RunTimes& shown = graphs ? graph_host : host;
  std::printf("host per step: %.1f us preparing and queuing, %.1f us waiting for the tokens\n",
              shown.queue_seconds * 1e6, shown.wait_seconds * 1e6);
  std::printf("overlapped step: %.3f ms%s (the engine's loop: each step queued before the tokens of the one ahead "
              "are read)\n", overlapped_ms, graphs ? " under the CUDA graph" : "");
  if (copy_gbps > 0)
    std::printf("floor: %.1f MB per step (weights %.1f MB + K/V %.1f MB) = %.3f ms at the copy bandwidth\n",
                (floor_weights + floor_kv) / 1e6, floor_weights / 1e6, floor_kv / 1e6,
                (floor_weights + floor_kv) / (copy_gbps * 1e9) * 1e3);
  else
    std::printf("floor: %.1f MB per step (weights %.1f MB + K/V %.1f MB)\n", (floor_weights + floor_kv) / 1e6,
                floor_weights / 1e6, floor_kv / 1e6);
  int width = 34;  // the label column, widened to the longest label (attention with o_proj's: 71 characters)
  for (const OpTime& op : ops) width = std::max(width, int(op.label.size()));
  std::printf("%-*s %6s %10s %10s %9s %7s\n", width, "operation", "calls", "us/step", "MB/step", "GB/s", "% copy");
  double total_ms = 0;
  for (const OpTime& op : ops) {
    // Bytes an operation must move at least: attention reads every context token's K and V; a linear
    // layer, fused or not ("linear 1x1024->4096", "rmsnorm+linear 1x1024->4096", "linear+add ...",
    // "silu+linear+add ...", "linear+silu ...", "linear+add_rmsnorm ...", "linear+sample ..."), reads its
    // weight and activations and writes its output (linear+silu: out / 2 columns; linear+sample: a token a
    // row, no logits at least). Logits are fp32 on either device. Attention with o_proj after it in one
    // operation ("qk_norm_rope_store + attention decode + linear+add_rmsnorm 1x2048->1024") counts both.
    double bytes = 0;
    int n = 0, in = 0, out = 0;
    const size_t shape_at = op.label.rfind(' ');
    if (op.label == "attention decode" || op.label.rfind("qk_norm_rope_store + attention decode", 0) == 0)
      bytes += double(batch) * context * kv_bytes_per_token_layer * op.calls;
    if (op.label.find("linear") != std::string::npos && shape_at != std::string::npos &&
        std::sscanf(op.label.c_str() + shape_at, " %dx%d->%d", &n, &in, &out) == 3) {
      const double out_columns = op.label.rfind("linear+silu ", 0) == 0     ? out / 2.0
                                 : op.label.rfind("linear+sample ", 0) == 0 ? 0.0
                                                                            : double(out);
      bytes += (double(in) * out + double(n) * in) * element_bytes * op.calls +
               double(n) * out_columns * (out == mc.vocab_size ? 4 : element_bytes) * op.calls;
    }
    total_ms += op.milliseconds;
    const double gbps = bytes / (op.milliseconds * 1e-3) / 1e9;
    if (bytes > 0 && copy_gbps > 0)
      std::printf("%-*s %6d %10.1f %10.1f %9.0f %6.0f%%\n", width, op.label.c_str(), op.calls, op.milliseconds * 1e3,
                  bytes / 1e6, gbps, 100 * gbps / copy_gbps);
    else if (bytes > 0)
      std::printf("%-*s %6d %10.1f %10.1f %9.1f\n", width, op.label.c_str(), op.calls, op.milliseconds * 1e3, bytes / 1e6, gbps);
    else
      std::printf("%-*s %6d %10.1f\n", width, op.label.c_str(), op.calls, op.milliseconds * 1e3);
  }
  std::printf("%-*s %6s %10.1f   (sum of kernel times; the rest of the eager step is launch and host work)\n",
              width, "total", "", total_ms * 1e3);
  return 0;
}

}  // namespace nanovllm
