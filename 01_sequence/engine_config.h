// engine_config.h: the engine's settings (nano-vllm: config.py), with nano-vllm's defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "01_sequence/base/common.h"

namespace nanovllm {

struct EngineConfig {
  std::string model;                 // Hugging Face checkpoint folder
  std::string tokenizer;             // folder with tokenizer.json; "" = the model folder
  std::string device = "";           // "cpu" or "cuda"; "" = cuda when a GPU is present, else cpu
  int max_num_batched_tokens = 16384;  // token budget of one prefill step
  int max_num_seqs = 512;              // sequences per step, prefill and decode alike
  int max_model_len = 4096;            // prompt + completion; clamped to the model's max positions
  float gpu_memory_utilization = 0.9f; // share of GPU memory the engine may fill (KV cache included)
  int cpu_memory_mib = 512;            // on the CPU: the memory that share is taken of (the GPU measures its own)
  int tensor_parallel_size = 1;
  bool enforce_eager = false;          // no CUDA graphs
  int attention_version = -1;          // CUDA attention kernel (05_attention/attention.h); -1 = each phase's fastest
  int linear_version = 8;              // CUDA projection versions, 1 to 8 (06_tensor_parallel/linear.h,
                                       // kLinearVersionDefault)
  // How GPU tensor-parallel ranks wait for each other in a collective (06_tensor_parallel/all_reduce.h):
  // "spin", one-shot kernels that spin on flags (capturable in CUDA graphs), or "events", stream-ordered
  // through CUDA events and a host barrier (eager only: CUDA graphs go off; compute-sanitizer can run it).
  std::string collectives = "spin";
  int kvcache_block_size = 256;        // tokens per KV block; any multiple of 16 (nano-vllm: of 256)
  // KV blocks to allocate. -1: as many as memory allows (nano-vllm always computes it and ignores a
  // user value; a real override makes preemption reproducible in tests).
  int num_kvcache_blocks = -1;
  std::vector<int32_t> eos;          // end-of-sequence ids, from generation_config.json / config.json
  int max_position_embeddings = 0;   // the model's, from config.json (set by ModelRunner; 0 until then)
  uint64_t seed = 0;                 // the engine's seed; requests without one derive theirs from it
  bool trace = false;                // print every scheduling decision to stderr
  // Launch step n + 1 before step n's tokens reach the host where its batch allows (LLMEngine::step): a
  // decode step after a decode step, a prefill after a prefill.
  // Not with --trace (whose lines follow the plain loop) or several tensor-parallel ranks.
  bool overlap_steps = true;

  // Throws Error naming the first invalid setting.
  void validate() const {
    if (max_num_batched_tokens < 1) fail("max_num_batched_tokens must be >= 1, got ", max_num_batched_tokens);
    if (max_num_seqs < 1) fail("max_num_seqs must be >= 1, got ", max_num_seqs);
    if (max_model_len < 1) fail("max_model_len must be >= 1, got ", max_model_len);
    if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1))
      fail("gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization);
    if (cpu_memory_mib < 1) fail("cpu_memory_mib must be >= 1, got ", cpu_memory_mib);
    if (tensor_parallel_size < 1 || tensor_parallel_size > 8)
      fail("tensor_parallel_size must be in [1, 8], got ", tensor_parallel_size);
    if (kvcache_block_size < 16 || kvcache_block_size % 16 != 0)
      fail("block size must be a positive multiple of 16, got ", kvcache_block_size);
    if (linear_version < 1 || linear_version > 8) fail("linear_version must be in [1, 8], got ", linear_version);
    if (num_kvcache_blocks == 0 || num_kvcache_blocks < -1)
      fail("kv cache blocks must be >= 1, got ", num_kvcache_blocks);
    if (device != "" && device != "cpu" && device != "cuda") fail("device must be cpu or cuda, got '", device, "'");
    if (collectives != "spin" && collectives != "events") fail("collectives must be spin or events, got '", collectives, "'");
  }
};

}  // namespace nanovllm
