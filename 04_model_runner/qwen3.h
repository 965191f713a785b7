// qwen3.h: the Qwen3 decoder (nano-vllm: models/qwen3.py), written once against Backend.
//
//   embed_tokens -> L x [ add + RMSNorm -> QKV -> q/k RMSNorm + RoPE -> store K/V -> attention -> o_proj
//                         add + RMSNorm -> gate_up -> SiLU * up -> down_proj ]
//                -> add + RMSNorm -> last token of each sequence -> lm_head -> logits
//
// The residual stream is pre-norm: each sublayer reads RMSNorm(residual) and its output is added back to
// the residual by the next fused add + RMSNorm.
#pragma once

#include <vector>

#include "04_model_runner/backend.h"
#include "04_model_runner/config.h"
#include "04_model_runner/safetensors.h"

namespace nanovllm {

// One tensor-parallel rank's share of the weights, on the backend's device, in its weight dtype.
// Shapes with tp = tensor_parallel_size, H hidden, D head_dim, Hq/Hkv heads, I intermediate, V vocab:
struct Qwen3Weights {
  struct Layer {
    Tensor input_layernorm;           // (H)
    Tensor qkv_proj;                  // ((Hq + 2 Hkv) / tp * D, H): [q heads; k heads; v heads] of this rank
    Tensor q_norm, k_norm;            // (D)
    Tensor o_proj;                    // (H, Hq / tp * D)
    Tensor post_attention_layernorm;  // (H)
    Tensor gate_up_proj;              // (2 I / tp, H): [gate; up] rows of this rank
    Tensor down_proj;                 // (H, I / tp)
  };
  Tensor embed_tokens;  // (V / tp, H)
  std::vector<Layer> layers;
  Tensor norm;          // (H)
  Tensor lm_head;       // (V / tp, H): the same memory as embed_tokens when the embeddings are tied
  std::vector<Buffer> storage;
};

// Reads every weight this rank needs from the checkpoint, checks shapes against the config, converts to
// the backend's weight dtype, shards and packs (06_tensor_parallel), and uploads. A tensor the config
// does not describe is an Error naming it (rotary inv_freq buffers and a tied lm_head.weight excepted).
Qwen3Weights load_qwen3_weights(Backend& backend, const Checkpoint& checkpoint, const ModelConfig& config,
                                int tp_rank, int tp_size);

// Activation buffers for up to max_tokens tokens and max_seqs sequences per step, allocated once.
struct Qwen3Workspace {
  Tensor residual;     // (T, H)
  Tensor hidden;       // (T, H): a sublayer's output
  Tensor normed;       // (T, H): RMSNorm(residual), a sublayer's input
  Tensor qkv;          // (T, (Hq + 2 Hkv) D)
  Tensor attn_out;     // (T, Hq D)
  Tensor gate_up;      // (T, 2 I)
  Tensor mlp_act;      // (T, I)
  Tensor last_hidden;  // (B, H): one row per sequence, for the LM head
  Tensor logits;       // (B, V) F32
  Tensor cos, sin;     // (max_positions, D / 2) F32: the RoPE tables
  Buffer storage;
  // Bytes needed for a given T and B (the runner allocates exactly this, before measuring what is left
  // for the KV cache).
  static size_t bytes_needed(const ModelConfig& config, int tp_size, DType act, int max_tokens, int max_seqs,
                             int max_positions);
};

Qwen3Workspace make_qwen3_workspace(Backend& backend, const ModelConfig& config, int tp_size, int max_tokens,
                                    int max_seqs, int max_positions);

// The inputs of one forward pass, in device memory.
struct ForwardInputs {
  Tensor input_ids;       // (T,) i32
  Tensor positions;       // (T,) i32
  Tensor last_token_rows; // (B,) i32: for prefill, the row of each sequence's last token
  AttentionMetadata attention;
};

class Qwen3Model {
 public:
  Qwen3Model(const ModelConfig& config, Qwen3Weights weights, int tp_rank, int tp_size);

  // Runs the decoder over T = input_ids.numel() tokens into ws.normed (final hidden states, rows T).
  // This is the part CUDA graphs capture for decode.
  void forward_hidden(Backend& backend, const ForwardInputs& in, const Qwen3Workspace& ws,
                      const std::vector<Tensor>& k_caches, const std::vector<Tensor>& v_caches);
  // ws.logits rows [0, B): the LM head over the last token of each sequence (prefill: gathered through
  // last_token_rows; decode: every row is one sequence).
  void compute_logits(Backend& backend, const ForwardInputs& in, const Qwen3Workspace& ws, int num_seqs);

  const ModelConfig& config() const { return config_; }
  HeadLayout heads() const { return heads_; }
  AttentionShape attention_shape(int block_size) const;

 private:
  ModelConfig config_;
  Qwen3Weights weights_;
  int tp_rank_;
  HeadLayout heads_;  // this rank's heads
};

}  // namespace nanovllm
