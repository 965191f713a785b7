// random_model.cpp: `nanovllm random-model --preset PRESET --out DIR [--seed S] [--tokenizer DIR]
// [--force]` (04_model_runner/checkpoint/random_model.h writes the checkpoint).
//
// Writes a Hugging Face style checkpoint folder with random bf16 weights in the exact shape of a real
// Qwen3 model (see random_model.h), for benchmarks and tests without downloading weights. DIR must be new
// or empty unless --force is given: a checkpoint already there is not overwritten by mistake.
//
//   $ nanovllm random-model --preset qwen3-0.6b --out /tmp/q06 --tokenizer build/data/qwen3-tokenizer
//   wrote /tmp/q06: qwen3-0.6b, 596049920 parameters (1192.1 MB of bf16), seed 0, in 4.1 s
#include <dirent.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "01_sequence/cli/flags.h"
#include "01_sequence/tokenizer/tokenizer.h"
#include "04_model_runner/checkpoint/random_model.h"

namespace nanovllm {

int cmd_random_model(const Flags& flags) {
  if (!flags.has("preset")) throw UsageError("--preset PRESET is required");
  if (!flags.has("out")) throw UsageError("--out DIR is required");
  const std::string preset = flags.get("preset");
  ModelConfig config;
  try {
    config = random_model_config(preset);
  } catch (const Error& e) {  // a missing or unknown preset is a usage error (exit code 2)
    throw UsageError(std::string("--preset: ") + e.what());
  }
  const std::string out = flags.get("out");
  const uint64_t seed = flags.get_uint64("seed", 0);
  DIR* d = flags.has("force") ? nullptr : opendir(out.c_str());
  if (d) {
    bool empty = true;
    while (dirent* entry = readdir(d)) empty &= !std::strcmp(entry->d_name, ".") || !std::strcmp(entry->d_name, "..");
    closedir(d);
    if (!empty) fail(out, ": the folder is not empty (give a new or empty folder, or --force to overwrite)");
  }

  // The tokenizer is copied as it is: read it first, so that a broken one is an error now, not when the
  // model is first run.
  if (flags.has("tokenizer")) Tokenizer::load(flags.get("tokenizer"));
  const auto start = std::chrono::steady_clock::now();
  write_random_model(config, out, seed, flags.get("tokenizer"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t parameters = parameter_count(config);
  std::printf("wrote %s: %s, %lld parameters (%.1f MB of bf16), seed %llu, in %.1f s\n", out.c_str(),
              preset.c_str(), (long long)parameters, double(parameters) * 2 / 1e6, (unsigned long long)seed,
              seconds);
  return 0;
}

}  // namespace nanovllm
