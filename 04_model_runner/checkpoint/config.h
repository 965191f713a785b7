// config.h: the model's hyperparameters, read from a Hugging Face checkpoint's config.json (and
// generation_config.json), and the list of tensors a Qwen3 checkpoint must hold.
//
// nano-vllm gets these from transformers' AutoConfig; we read the JSON ourselves and check it, because a
// wrong number here becomes a wrong shape, or silently wrong text, much later. Only Qwen3 is accepted:
// architectures must list Qwen3ForCausalLM, hidden_act must be silu, attention_bias false, plain RoPE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "04_model_runner/checkpoint/safetensors.h"

namespace nanovllm {

// transformers' Qwen3Config default for a config.json without head_dim.
constexpr int kDefaultHeadDim = 128;

struct ModelConfig {
  int vocab_size = 0;
  int hidden_size = 0;               // H
  int num_hidden_layers = 0;
  int num_attention_heads = 0;       // query heads
  int num_key_value_heads = 0;       // KV heads (GQA): divides num_attention_heads
  int head_dim = 0;                  // absent from config.json: kDefaultHeadDim, as transformers reads it
  bool head_dim_absent = false;      // so taken; a checkpoint whose shapes disagree is told so
  int intermediate_size = 0;         // I, the MLP width
  int max_position_embeddings = 0;
  double rms_norm_eps = 0;
  double rope_theta = 0;             // RoPE base
  bool tie_word_embeddings = false;  // the LM head reuses embed_tokens.weight
  std::string dtype;                 // "bfloat16", ...: informational (weights are read in their stored dtype and
                                     // converted to the backend's: fp32 on the CPU, bf16 on the GPU)
  std::vector<int> eos_token_ids;    // generation stops at any of these; may be empty
  int bos_token_id = -1;             // -1 when absent

  // Reads `model_dir`/config.json and, when present, `model_dir`/generation_config.json (whose
  // eos_token_id / bos_token_id win over config.json's, as in transformers' generate()). Accepts the
  // transformers 4.x spelling (rope_theta, torch_dtype) and the 5.x one (rope_parameters.rope_theta,
  // dtype). Throws Error "PATH/config.json: field 'hidden_size': expected an integer, got a string" for a
  // missing or mistyped field, and names the fields of any inconsistency.
  static ModelConfig load(const std::string& model_dir);
};

// Writes `dir`/config.json (transformers 5 style, as a Qwen3ForCausalLM) and `dir`/generation_config.json
// so that both ModelConfig::load and transformers read `config` back. The directory must exist.
void write_config(const ModelConfig& config, const std::string& dir);

// The tensors of a Qwen3 checkpoint with their shapes (V vocab, H hidden, I intermediate, D head_dim):
//   model.embed_tokens.weight                          [V, H]
//   per layer i, under model.layers.i.:
//     input_layernorm.weight                           [H]
//     self_attn.q_proj.weight                          [heads * D, H]
//     self_attn.k_proj.weight, self_attn.v_proj.weight [kv_heads * D, H]
//     self_attn.o_proj.weight                          [H, heads * D]
//     self_attn.q_norm.weight, self_attn.k_norm.weight [D]
//     post_attention_layernorm.weight                  [H]
//     mlp.gate_proj.weight, mlp.up_proj.weight         [I, H]
//     mlp.down_proj.weight                             [H, I]
//   model.norm.weight                                  [H]
//   lm_head.weight                                     [V, H]   only when not tied
// With tied embeddings lm_head.weight is not required, but a checkpoint may still hold it (some Qwen3
// exports carry a copy of the embedding): loading accepts it only if it is byte for byte
// model.embed_tokens.weight, and then ignores it.
std::vector<TensorSpec> qwen3_checkpoint_layout(const ModelConfig& config);

// Total number of weights in the layout (0.6B for Qwen3-0.6B, counting the tied embedding once).
int64_t parameter_count(const ModelConfig& config);
// Bytes of weights a decode step reads at least, bytes_per_weight each (2 for the GPU's bf16, 4 for the
// CPU's fp32): every parameter once, except an untied input embedding, of which a step reads only its
// tokens' rows (a tied one is read whole, as the LM head).
double decode_step_weight_bytes(const ModelConfig& config, int bytes_per_weight);

}  // namespace nanovllm
