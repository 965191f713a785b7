// qwen3.cpp: loading the weights, the activation workspace, and the forward pass (nano-vllm:
// models/qwen3.py, utils/loader.py).
#include "04_model_runner/qwen3.h"

#include <cmath>

#include "01_sequence/base/bf16.h"
#include "04_model_runner/layers.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {

// ---------------------------------------------------------------------------------------------------
// Loading

namespace {

class WeightLoader {
 public:
  WeightLoader(Backend& backend, const Checkpoint& checkpoint, Qwen3Weights& weights)
      : backend_(backend), checkpoint_(checkpoint), weights_(weights) {}

  // A checkpoint tensor of the given shape, as fp32 on the host.
  std::vector<float> read(const std::string& name, std::vector<int64_t> shape) {
    const TensorView& view = checkpoint_.get(name, shape);
    std::vector<float> values(size_t(view.numel()));
    read_as_float(view, values.data());
    return values;
  }

  // Uploads host fp32 values as a (rows, cols) or (cols) weight in the backend's weight dtype.
  Tensor upload(const std::vector<float>& values, std::initializer_list<int64_t> shape) {
    Tensor probe(nullptr, backend_.weight_dtype(), backend_.device(), shape);
    if (size_t(probe.numel()) != values.size()) fail("internal: weight of ", values.size(), " values for shape");
    weights_.storage.emplace_back(backend_.device(), probe.nbytes());
    probe.data = weights_.storage.back().data();
    if (probe.dtype == DType::F32) {
      backend_.upload(probe, values.data());
    } else {  // BF16: exact for bf16 checkpoints, rounded to nearest for f32 ones
      std::vector<uint16_t> bf16(values.size());
      for (size_t i = 0; i < values.size(); i++) bf16[i] = float_to_bf16(values[i]);
      backend_.upload(probe, bf16.data());
    }
    return probe;
  }

 private:
  Backend& backend_;
  const Checkpoint& checkpoint_;
  Qwen3Weights& weights_;
};

}  // namespace

Qwen3Weights load_qwen3_weights(Backend& backend, const Checkpoint& checkpoint, const ModelConfig& c,
                                int tp_rank, int tp_size) {
  Qwen3Weights w;
  WeightLoader loader(backend, checkpoint, w);
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size, I = c.intermediate_size;
  const int64_t q_rows = int64_t(c.num_attention_heads) * D, kv_rows = int64_t(c.num_key_value_heads) * D;
  const int64_t V_part = divide(V, tp_size, "vocab_size");
  // Heads are split whole: each rank gets num_heads / tp query heads and num_kv_heads / tp KV heads.
  divide(c.num_attention_heads, tp_size, "num_attention_heads");
  divide(c.num_key_value_heads, tp_size, "num_key_value_heads");
  const int64_t I_part = divide(I, tp_size, "intermediate_size");

  std::vector<float> embed = loader.read("model.embed_tokens.weight", {V, H});
  w.embed_tokens = loader.upload(shard_rows(embed, V, H, tp_rank, tp_size), {V_part, H});
  for (int l = 0; l < c.num_hidden_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Qwen3Weights::Layer layer;
    layer.input_layernorm = loader.upload(loader.read(p + "input_layernorm.weight", {H}), {H});
    std::vector<float> q = loader.read(p + "self_attn.q_proj.weight", {q_rows, H});
    std::vector<float> k = loader.read(p + "self_attn.k_proj.weight", {kv_rows, H});
    std::vector<float> v = loader.read(p + "self_attn.v_proj.weight", {kv_rows, H});
    layer.qkv_proj = loader.upload(pack_row_shards<float>({&q, &k, &v}, {q_rows, kv_rows, kv_rows}, H, tp_rank, tp_size),
                                   {(q_rows + 2 * kv_rows) / tp_size, H});
    layer.q_norm = loader.upload(loader.read(p + "self_attn.q_norm.weight", {D}), {D});
    layer.k_norm = loader.upload(loader.read(p + "self_attn.k_norm.weight", {D}), {D});
    std::vector<float> o = loader.read(p + "self_attn.o_proj.weight", {H, q_rows});
    layer.o_proj = loader.upload(shard_cols(o, H, q_rows, tp_rank, tp_size), {H, q_rows / tp_size});
    layer.post_attention_layernorm = loader.upload(loader.read(p + "post_attention_layernorm.weight", {H}), {H});
    std::vector<float> gate = loader.read(p + "mlp.gate_proj.weight", {I, H});
    std::vector<float> up = loader.read(p + "mlp.up_proj.weight", {I, H});
    layer.gate_up_proj = loader.upload(pack_row_shards<float>({&gate, &up}, {I, I}, H, tp_rank, tp_size), {2 * I_part, H});
    std::vector<float> down = loader.read(p + "mlp.down_proj.weight", {H, I});
    layer.down_proj = loader.upload(shard_cols(down, H, I, tp_rank, tp_size), {H, I_part});
    w.layers.push_back(layer);
  }
  w.norm = loader.upload(loader.read("model.norm.weight", {H}), {H});
  if (c.tie_word_embeddings) {
    // nano-vllm points lm_head at the embedding's storage; a tied checkpoint's own lm_head.weight, if
    // any, holds the same values and is not read.
    w.lm_head = w.embed_tokens;
  } else {
    std::vector<float> head = loader.read("lm_head.weight", {V, H});
    w.lm_head = loader.upload(shard_rows(head, V, H, tp_rank, tp_size), {V_part, H});
  }
  return w;
}

// ---------------------------------------------------------------------------------------------------
// Workspace

Qwen3Workspace make_qwen3_workspace(Backend& backend, const ModelConfig& c, int tp, int max_tokens, int max_seqs,
                                    int max_positions) {
  const HeadLayout h{c.num_attention_heads / tp, c.num_key_value_heads / tp, c.head_dim};
  const int64_t T = max_tokens, B = max_seqs, H = c.hidden_size, I = c.intermediate_size / tp, V = c.vocab_size / tp;
  const int64_t P = max_positions, half = c.head_dim / 2;
  const DType act = backend.act_dtype();
  Qwen3Workspace ws;
  ws.storage = Arena::carve(backend.device(), [&](Arena& a) {
    ws.residual = a.take(act, {T, H});
    ws.hidden = a.take(act, {T, H});
    ws.normed = a.take(act, {T, H});
    ws.qkv = a.take(act, {T, h.qkv_dim()});
    ws.attn_out = a.take(act, {T, h.q_dim()});
    ws.gate_up = a.take(act, {T, 2 * I});
    ws.mlp_act = a.take(act, {T, I});
    ws.last_hidden = a.take(act, {B, H});
    ws.logits = a.take(DType::F32, {B, V});
    ws.cos = a.take(DType::F32, {P, half});
    ws.sin = a.take(DType::F32, {P, half});
  });
  std::vector<float> cos, sin;
  build_rope_table(cos, sin, int(P), c.head_dim, c.rope_theta);
  backend.upload(ws.cos, cos.data());
  backend.upload(ws.sin, sin.data());
  return ws;
}

// ---------------------------------------------------------------------------------------------------
// Forward

Qwen3Model::Qwen3Model(const ModelConfig& config, Qwen3Weights weights, int tp_rank, int tp_size)
    : config_(config),
      weights_(std::move(weights)),
      tp_rank_(tp_rank),
      heads_{config.num_attention_heads / tp_size, config.num_key_value_heads / tp_size, config.head_dim} {}

AttentionShape Qwen3Model::attention_shape(int block_size) const {
  return {heads_.num_heads, heads_.num_kv_heads, heads_.head_dim, block_size,
          float(1.0 / std::sqrt(double(heads_.head_dim)))};
}

void Qwen3Model::forward_hidden(Backend& b, const ForwardInputs& in, const Qwen3Workspace& full_ws,
                                const std::vector<Tensor>& k_caches, const std::vector<Tensor>& v_caches) {
  const int64_t T = in.input_ids.numel();
  const float eps = float(config_.rms_norm_eps);
  // This step's rows of every activation buffer.
  Tensor residual = full_ws.residual.slice_rows(0, T), hidden = full_ws.hidden.slice_rows(0, T),
         normed = full_ws.normed.slice_rows(0, T), qkv = full_ws.qkv.slice_rows(0, T),
         attn_out = full_ws.attn_out.slice_rows(0, T), gate_up = full_ws.gate_up.slice_rows(0, T),
         mlp_act = full_ws.mlp_act.slice_rows(0, T);
  const AttentionShape shape = attention_shape(int(k_caches[0].shape[1]));

  b.embedding(residual, weights_.embed_tokens, in.input_ids, int(tp_rank_ * weights_.embed_tokens.rows()));
  for (size_t l = 0; l < weights_.layers.size(); l++) {
    const Qwen3Weights::Layer& w = weights_.layers[l];
    // Attention block. The first layer has no sublayer output to add yet.
    if (l == 0) {
      b.rmsnorm(normed, residual, w.input_layernorm, eps);
    } else {
      b.add_rmsnorm(normed, residual, hidden, w.input_layernorm, eps);
    }
    b.linear(qkv, normed, w.qkv_proj);
    // q/k RMSNorm + RoPE, then K/V into the cache (nano-vllm: rotary_emb, then Attention's store_kvcache),
    // one operation: store before attend, so that attention reads this step's keys from the cache too.
    b.qk_norm_rope_store(qkv, w.q_norm, w.k_norm, in.positions, full_ws.cos, full_ws.sin, k_caches[l], v_caches[l],
                         in.attention.slot_mapping, heads_, eps);
    b.attention(attn_out, qkv, k_caches[l], v_caches[l], in.attention, shape);
    b.linear(hidden, attn_out, w.o_proj);
    // MLP block.
    b.add_rmsnorm(normed, residual, hidden, w.post_attention_layernorm, eps);
    b.linear(gate_up, normed, w.gate_up_proj);
    b.silu_and_mul(mlp_act, gate_up);
    b.linear(hidden, mlp_act, w.down_proj);
  }
  b.add_rmsnorm(normed, residual, hidden, weights_.norm, eps);
}

void Qwen3Model::compute_logits(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws, int num_seqs) {
  Tensor last = ws.last_hidden.slice_rows(0, num_seqs);
  Tensor logits = ws.logits.slice_rows(0, num_seqs);
  if (in.attention.is_prefill) {
    // Only the last token of each sequence reaches the LM head (nano-vllm ParallelLMHead).
    b.gather_rows(last, ws.normed, in.last_token_rows.slice_rows(0, num_seqs));
    b.linear(logits, last, weights_.lm_head);
  } else {
    b.linear(logits, ws.normed.slice_rows(0, num_seqs), weights_.lm_head);
  }
}

}  // namespace nanovllm
