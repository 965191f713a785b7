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
#include "04_model_runner/checkpoint/config.h"
#include "04_model_runner/checkpoint/safetensors.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {

// One tensor-parallel rank's share of the weights, on the backend's device, in its weight dtype.
// Shapes with tp = tensor_parallel_size, H hidden, D head_dim, Hq/Hkv heads, I intermediate, V vocab;
// per rank (06_tensor_parallel/linear.h, TensorParallelLayout): Hq/tp query heads, Hkv_r = max(1, Hkv/tp)
// KV heads (replicated when tp > Hkv), I/tp MLP columns, V_r = ceil(V/tp) vocabulary rows (padded).
struct Qwen3Weights {
  struct Layer {
    Tensor input_layernorm;           // (H)
    Tensor qkv_proj;                  // ((Hq/tp + 2 Hkv_r) D, H): [q heads; k heads; v heads] of this rank
    Tensor q_norm, k_norm;            // (D)
    Tensor o_proj;                    // (H, Hq/tp D)
    Tensor post_attention_layernorm;  // (H)
    Tensor gate_up_proj;              // (2 I/tp, H): [gate; up] rows of this rank
    Tensor down_proj;                 // (H, I/tp)
  };
  Tensor embed_tokens;  // (V_r, H)
  std::vector<Layer> layers;
  Tensor norm;          // (H)
  Tensor lm_head;       // (V_r, H): the same memory as embed_tokens when the embeddings are tied
  std::vector<Buffer> storage;
};

// Reads every weight rank `tp_rank` needs from the checkpoint, checks shapes against the config,
// converts to the backend's weight dtype, shards and packs (06_tensor_parallel), and uploads. A tensor
// the config does not describe is an Error naming it (rotary inv_freq buffers and a tied lm_head.weight
// excepted).
Qwen3Weights load_qwen3_weights(Backend& backend, const Checkpoint& checkpoint, const ModelConfig& config,
                                const TensorParallelLayout& tp, int tp_rank);

// How `tp_size` ranks split this model; Error naming the field that cannot be split (before any
// weight is read).
TensorParallelLayout tensor_parallel_layout(const ModelConfig& config, int tp_size);

// Activation buffers for up to max_tokens tokens and max_seqs sequences per step, allocated once, with
// the same layout on every rank. T and B below are those capacities; a step uses its first rows. A tensor
// with no dtype named is in the activation dtype: F32 on the CPU, BF16 on the GPU.
struct Qwen3Workspace {
  Tensor residual;      // (T, H)
  Tensor hidden;        // (T, H): a sublayer's output
  Tensor normed;        // (T, H): RMSNorm(residual), a sublayer's input
  Tensor qkv;           // (T, (Hq/tp + 2 Hkv_r) D)
  Tensor attn_out;      // (T, Hq/tp D)
  Tensor gate_up;       // (T, 2 I/tp)
  Tensor mlp_act;       // (T, I/tp)
  Tensor last_hidden;   // (B, H): one row per sequence, for the LM head
  // A prefill's last layer goes past its K/V write on each sequence's last row only (forward_hidden):
  Tensor last_qkv;      // (B, (Hq/tp + 2 Hkv_r) D): those rows of qkv, q normed and rotated
  Tensor one_row_each;  // (B + 1,) i32: 0, 1, ..., B, their cu_seqlens_q (one query row a sequence)
  Tensor logits_shard;  // (B, V_r) F32: this rank's columns of the logits (tp > 1 only)
  Tensor logits;        // (B, V) F32: all of them, on rank 0 (with one rank the LM head writes it)
  Tensor cos, sin;      // (max_positions, D / 2) F32: the RoPE tables
  Buffer storage;
};

Qwen3Workspace make_qwen3_workspace(Backend& backend, const ModelConfig& config, const TensorParallelLayout& tp,
                                    int max_tokens, int max_seqs, int max_positions);

// The inputs of one forward pass, in device memory.
struct ForwardInputs {
  Tensor input_ids;       // (T,) i32
  Tensor positions;       // (T,) i32
  Tensor last_token_rows; // (B,) i32: for prefill, the row of each sequence's last token
  AttentionMetadata attention;
};

class Qwen3Model {
 public:
  Qwen3Model(const ModelConfig& config, Qwen3Weights weights, const TensorParallelLayout& tp, int tp_rank);

  // Runs the decoder over T = input_ids.numel() tokens: in decode into ws.normed (final hidden states, rows
  // T = B), in a prefill into ws.last_hidden (rows B: each sequence's last token, the only ones the LM head
  // reads; the last layer computes nothing else past its K/V). This is the part CUDA graphs capture for
  // decode.
  void forward_hidden(Backend& backend, const ForwardInputs& in, const Qwen3Workspace& ws,
                      const std::vector<Tensor>& k_caches, const std::vector<Tensor>& v_caches);
  // ws.logits rows [0, B): the LM head over the last token of each sequence (prefill: gathered through
  // last_token_rows; decode: every row is one sequence). With tp > 1 each rank scores its vocabulary
  // shard into ws.logits_shard and rank 0 gathers them (nano-vllm's ParallelLMHead).
  void compute_logits(Backend& backend, const ForwardInputs& in, const Qwen3Workspace& ws, int num_seqs);
  // The same LM head with the sampler in its kernel, where the backend has one for num_seqs rows and there
  // is one rank (samples_in_lm_head; Backend::linear_sample): tokens (B,) straight from the final hidden
  // states; ws.logits receives only the rows that ask for top-k or top-p.
  bool samples_in_lm_head(const Backend& backend, int num_seqs) const {
    return tp_.tp_size == 1 && backend.fuses_linear_sample(num_seqs);
  }
  void sample_in_lm_head(Backend& backend, const ForwardInputs& in, const Qwen3Workspace& ws, const Tensor& tokens,
                         const Tensor& sampling, int num_seqs);
  // After sample_in_lm_head, with nothing run since: ws.logits rows [0, B) written by the same kernel, the
  // same products the tokens were sampled from (ModelRunner::download_logits; the tokens are written again,
  // the same).
  void logits_of_sampled_step(Backend& backend, bool is_prefill, const Qwen3Workspace& ws, const Tensor& tokens,
                              const Tensor& sampling, int num_seqs);

  const ModelConfig& config() const { return config_; }
  size_t weight_bytes() const {
    size_t bytes = 0;
    for (const Buffer& b : weights_.storage) bytes += b.bytes();
    return bytes;
  }
  HeadLayout heads() const { return heads_; }
  AttentionShape attention_shape(int block_size) const;

 private:
  ModelConfig config_;
  Qwen3Weights weights_;
  TensorParallelLayout tp_;
  int tp_rank_;
  HeadLayout heads_;  // this rank's heads

  // This step's rows of the workspace: T rows of every activation (T the step's tokens), and the B rows
  // (B sequences) of a prefill's output, the LM head's input.
  struct StepRows {
    Tensor residual, hidden, normed, qkv, attn_out, gate_up, mlp_act;  // (T, ...): Qwen3Workspace's shapes
    Tensor head_input;                                                 // (B, H): ws.last_hidden's rows
  };
  static StepRows step_rows(const Qwen3Workspace& ws, int64_t T, int B);

  // The parts of forward_hidden. forward_layer and forward_last_layer_of_prefill start from rows.normed =
  // the layer's attention norm of rows.residual, and end with next_norm (the next layer's attention norm, or
  // after the last layer the model's final norm) of the updated residual: in rows.normed, or for a prefill's
  // last layer in rows.head_input.
  //
  // forward_layer: one decoder layer over all T rows; next_k_cache and next_v_cache, the next layer's cache
  // (null after the last), are handed to Backend::warm_kv_cache after attention.
  void forward_layer(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws, const StepRows& rows,
                     const Qwen3Weights::Layer& w, const Tensor& next_norm, const Tensor& k_cache,
                     const Tensor& v_cache, const Tensor* next_k_cache, const Tensor* next_v_cache);
  // A prefill's last layer: K/V of all T rows into the cache, the rest on each sequence's last row only,
  // written to rows.head_input (B rows).
  void forward_last_layer_of_prefill(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws,
                                     const StepRows& rows, const Qwen3Weights::Layer& w, const Tensor& final_norm,
                                     const Tensor& k_cache, const Tensor& v_cache);
  // Every layer and the final norm, where the backend fuses the small operations into the projections
  // (Backend::fuses_around_linear: the GPU at one row, linear version 7): each norm and the SiLU inside the
  // projection after them, each residual add inside the projection before it, so that one projection
  // follows another. The same operations as forward_layer, in the same order.
  void forward_fused_around_linear(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws,
                                   const StepRows& rows, const std::vector<Tensor>& k_caches,
                                   const std::vector<Tensor>& v_caches);
  // A projection and the norm after it: res += x W^T, then out = RMSNorm(res) * norm_weight; hid: the
  // projection's output, if written. With one rank one call (Backend::linear_add_rmsnorm, which may hand the
  // norm the projection's partial sums); with more, the all-reduce of the row-parallel projection sits
  // between the two.
  void project_add_norm(Backend& b, const Tensor& out, const Tensor& res, const Tensor& hid, const Tensor& x,
                        const Tensor& weight, const Tensor& norm_weight) const;

  // The LM head's input, one row a sequence: ws.normed's rows (decode) or ws.last_hidden's (prefill), as
  // forward_hidden leaves them.
  static Tensor lm_head_rows(bool is_prefill, const Qwen3Workspace& ws, int num_seqs) {
    return (is_prefill ? ws.last_hidden : ws.normed).slice_rows(0, num_seqs);
  }
};

}  // namespace nanovllm
