// sampling_params.h: how one request wants its tokens chosen (nano-vllm: sampling_params.py).
#pragma once

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <optional>

#include "01_sequence/base/common.h"

namespace nanovllm {

struct SamplingParams {
  // Logits are divided by the temperature before the softmax. 0 means greedy (argmax); nano-vllm
  // forbids 0, and restoring it is its most requested feature.
  float temperature = 1.0f;
  int max_tokens = 64;      // completion tokens to generate at most (EOS included, as nano-vllm counts)
  bool ignore_eos = false;  // keep going after an EOS token (benchmarks use this)
  int top_k = 0;            // keep the k most likely tokens; 0 keeps all (beyond nano-vllm)
  float top_p = 1.0f;       // keep the smallest set whose probability reaches p; 1 keeps all
  // Seed of this request's random numbers. Unset: the engine derives one from its own seed and the
  // request's seq_id (the count of requests the engine accepted before it, a refused one taking no id: on
  // the command line, its position in the list), so a seeded run is reproducible however it is batched.
  std::optional<uint64_t> seed;

  // Throws Error naming the first invalid field and its value.
  void validate() const {
    if (!std::isfinite(temperature) || temperature < 0)
      fail("temperature must be >= 0 (0 = greedy), got ", temperature);
    if (max_tokens < 1) fail("max_tokens must be >= 1, got ", max_tokens);
    if (top_k < 0) fail("top_k must be >= 0 (0 = off), got ", top_k);
    if (!(top_p > 0 && top_p <= 1)) fail("top_p must be in (0, 1], got ", std::setprecision(9), top_p);  // 1.00000012
  }

  bool is_greedy() const { return temperature == 0; }
};

}  // namespace nanovllm
