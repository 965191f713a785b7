// random_model.h: checkpoints with random weights and the exact shapes of real Qwen3 models.
//
// The benchmark (`nanovllm bench --random qwen3-0.6b`) needs Qwen3-0.6B's shapes but not its weights,
// since speed does not depend on the values; tests need small models whose every byte is known. Both
// come from here: a complete Hugging Face style folder (config.json, generation_config.json,
// model.safetensors, optionally the tokenizer) whose bf16 weights are drawn like the golden tiny
// checkpoints' (tests/data/golden/README.md):
//   embed_tokens, lm_head      N(0, 0.5^2)
//   linear weights [out, in]   N(0, 1 / in)
//   norm weights               1 + N(0, 0.1^2)
// The bytes depend only on the seed: our own generator (splitmix64 and xoshiro256**, Marsaglia's polar
// method in double precision), the same sequence on every machine and for any number of threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "04_model_runner/checkpoint/config.h"

namespace nanovllm {

// "tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b".
std::vector<std::string> random_model_presets();

// The configuration of a preset; an unknown name is an Error listing the presets.
ModelConfig random_model_config(const std::string& preset);

// Writes a random checkpoint for `config` into `out_dir` (created if missing; it must not already hold
// another checkpoint's *.safetensors). Deterministic in `seed`. If `tokenizer_dir` is not empty, its
// tokenizer.json and tokenizer_config.json are copied in (a missing one is an Error naming it).
// Generation is spread over the machine's cores: Qwen3-0.6B takes seconds.
void write_random_model(const ModelConfig& config, const std::string& out_dir, uint64_t seed,
                        const std::string& tokenizer_dir = "");
void write_random_model(const std::string& preset, const std::string& out_dir, uint64_t seed,
                        const std::string& tokenizer_dir = "");

// True when `dir` holds every file write_random_model writes (the tokenizer's too when with_tokenizer).
bool is_complete_random_model(const std::string& dir, bool with_tokenizer);

// For the checkpoints the command line makes on first use (the embedded default, `bench --random`):
// writes the preset's checkpoint to `dir` unless a complete one is there, safely when several processes
// start at once or one is interrupted. It is written into `dir`.tmp.<pid> and renamed into place in one
// step, so `dir` is absent or complete; losing the rename to another process is success (same preset,
// same seed, same bytes). SIGINT or SIGTERM during the write removes the temporary folder. Returns true
// if this call wrote the checkpoint.
bool ensure_random_model(const std::string& preset, const std::string& dir, uint64_t seed,
                         const std::string& tokenizer_dir = "");

}  // namespace nanovllm
