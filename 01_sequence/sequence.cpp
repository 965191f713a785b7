// sequence.cpp
#include "01_sequence/sequence.h"

#include <utility>

namespace nanovllm {

Sequence::Sequence(int64_t id, std::vector<int32_t> prompt_token_ids, const SamplingParams& sampling,
                   uint64_t sampling_seed, int kv_block_size)
    : seq_id(id),
      token_ids(std::move(prompt_token_ids)),
      last_token(token_ids.empty() ? -1 : token_ids.back()),
      num_prompt_tokens(int(token_ids.size())),
      params(sampling),
      seed(sampling_seed),
      block_size(kv_block_size) {
  if (token_ids.empty()) fail("request ", id, ": the prompt is empty");
  if (block_size < 1) fail("block size must be >= 1, got ", block_size);
  params.validate();
}

}  // namespace nanovllm
