// qwen3.cpp: loading the weights, the activation workspace, and the forward pass (nano-vllm:
// models/qwen3.py, utils/loader.py).
#include "04_model_runner/qwen3.h"

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>

#include "01_sequence/base/bf16.h"
#include "04_model_runner/layers.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {

// ---------------------------------------------------------------------------------------------------
// Loading

namespace {

class WeightLoader {
 public:
  // `origin` says where the expected shapes come from, for a tensor of another shape.
  WeightLoader(Backend& backend, const Checkpoint& checkpoint, Qwen3Weights& weights, std::string origin)
      : backend_(backend), checkpoint_(checkpoint), weights_(weights), origin_(std::move(origin)) {}

  // A checkpoint tensor of the given shape, as fp32 on the host.
  std::vector<float> read(const std::string& name, std::vector<int64_t> shape) {
    const TensorView& view = checkpoint_.get(name, shape, origin_);
    std::vector<float> values(size_t(view.numel()));
    read_as_float(view, values.data());
    return values;
  }

  // Uploads host fp32 values as a (rows, cols) or (cols) weight in the backend's weight dtype.
  Tensor upload(const std::vector<float>& values, std::initializer_list<int64_t> shape) {
    Tensor probe(nullptr, backend_.weight_dtype(), backend_.device(), shape);
    if (size_t(probe.numel()) != values.size()) {
      std::string dims;
      for (int64_t d : shape) dims += (dims.empty() ? "(" : ", ") + std::to_string(d);
      fail("internal: weight of ", values.size(), " values for shape ", dims, ")");
    }
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
  std::string origin_;
};

}  // namespace

TensorParallelLayout tensor_parallel_layout(const ModelConfig& c, int tp_size) {
  return tensor_parallel_layout(c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size,
                                tp_size);
}

Qwen3Weights load_qwen3_weights(Backend& backend, const Checkpoint& checkpoint, const ModelConfig& c,
                                const TensorParallelLayout& tp, int tp_rank) {
  Qwen3Weights w;
  WeightLoader loader(backend, checkpoint, w,
                      c.head_dim_absent ? "config.json, which has no head_dim: " + std::to_string(c.head_dim) +
                                              ", transformers' default"
                                        : "config.json");
  const int tp_size = tp.tp_size;
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size, I = c.intermediate_size;
  const int64_t q_rows = int64_t(c.num_attention_heads) * D, kv_rows = int64_t(c.num_key_value_heads) * D;
  const int64_t V_part = tp.vocab_per_rank, I_part = tp.intermediate_per_rank;
  // This rank's KV heads: rows [first * D, (first + count) * D) of k_proj and v_proj. With more ranks
  // than KV heads a head is replicated, so this is not always an even split of the rows.
  const int64_t kv_first = int64_t(tp.first_kv_head(tp_rank)) * D, kv_part = int64_t(tp.kv_heads_per_rank) * D;
  auto kv_shard = [&](const std::vector<float>& w_kv) {
    return std::vector<float>(w_kv.begin() + kv_first * H, w_kv.begin() + (kv_first + kv_part) * H);
  };

  // Every layer config.json counts must be in the checkpoint, asked by name before anything sized by that
  // count is built: a num_hidden_layers of 16 million would otherwise build a layout of 180 million names
  // (tens of GB) before the first missing tensor is noticed.
  for (int l = 0; l < c.num_hidden_layers; l++) {
    const std::string name = "model.layers." + std::to_string(l) + ".input_layernorm.weight";
    if (!checkpoint.find(name))
      fail(checkpoint.dir(), ": the checkpoint has no tensor '", name, "', and config.json says num_hidden_layers ",
           c.num_hidden_layers);
  }
  // Every tensor must be one config.json describes: more layers in the checkpoint than in the config,
  // or a misnamed weight, would otherwise be left out without a word. Harmless extras: rotary inverse
  // frequencies (we compute them from rope_theta) and a tied checkpoint's copy of the embedding.
  std::set<std::string> expected;
  for (const TensorSpec& spec : qwen3_checkpoint_layout(c)) expected.insert(spec.name);
  const std::string inv_freq = ".rotary_emb.inv_freq";
  for (const std::string& name : checkpoint.names()) {
    const bool harmless = (name.size() >= inv_freq.size() &&
                           name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0) ||
                          (c.tie_word_embeddings && name == "lm_head.weight");
    if (!expected.count(name) && !harmless)
      fail(checkpoint.dir(), ": unexpected tensor '", name, "': config.json describes no such weight (num_hidden_layers ",
           c.num_hidden_layers, ", tie_word_embeddings ", c.tie_word_embeddings ? "true" : "false", ")");
  }

  std::vector<float> embed = loader.read("model.embed_tokens.weight", {V, H});
  w.embed_tokens = loader.upload(shard_rows_padded(embed, V, H, tp_rank, tp_size), {V_part, H});
  for (int l = 0; l < c.num_hidden_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Qwen3Weights::Layer layer;
    layer.input_layernorm = loader.upload(loader.read(p + "input_layernorm.weight", {H}), {H});
    // QKV packed per rank: [this rank's q heads; its k heads; its v heads].
    std::vector<float> qkv = shard_rows(loader.read(p + "self_attn.q_proj.weight", {q_rows, H}), q_rows, H, tp_rank, tp_size);
    for (const char* name : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
      std::vector<float> part = kv_shard(loader.read(p + name, {kv_rows, H}));
      qkv.insert(qkv.end(), part.begin(), part.end());
    }
    layer.qkv_proj = loader.upload(qkv, {q_rows / tp_size + 2 * kv_part, H});
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
    // any, must hold the same values, and is then not read. Different values leave no way to tell which
    // head is meant (transformers would drop this one; nano-vllm's loader would copy it over the embedding).
    const TensorView* head = checkpoint.find("lm_head.weight");
    const TensorView* embedding = checkpoint.find("model.embed_tokens.weight");
    if (head && !(head->dtype == embedding->dtype && head->shape == embedding->shape &&
                  std::memcmp(head->data, embedding->data, head->nbytes) == 0))
      fail(checkpoint.dir(), ": config.json says tie_word_embeddings, but lm_head.weight differs from "
           "model.embed_tokens.weight");
    w.lm_head = w.embed_tokens;
  } else {
    std::vector<float> head = loader.read("lm_head.weight", {V, H});
    w.lm_head = loader.upload(shard_rows_padded(head, V, H, tp_rank, tp_size), {V_part, H});
  }
  return w;
}

// ---------------------------------------------------------------------------------------------------
// Workspace

Qwen3Workspace make_qwen3_workspace(Backend& backend, const ModelConfig& c, const TensorParallelLayout& tp,
                                    int max_tokens, int max_seqs, int max_positions) {
  const HeadLayout h{tp.heads_per_rank, tp.kv_heads_per_rank, c.head_dim};
  const int64_t T = max_tokens, B = max_seqs, H = c.hidden_size, I = tp.intermediate_per_rank, V = c.vocab_size;
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
    ws.last_qkv = a.take(act, {B, h.qkv_dim()});
    ws.one_row_each = a.take(DType::I32, {B + 1});
    if (tp.tp_size > 1) ws.logits_shard = a.take(DType::F32, {B, tp.vocab_per_rank});
    ws.logits = a.take(DType::F32, {B, V});
    ws.cos = a.take(DType::F32, {P, half});
    ws.sin = a.take(DType::F32, {P, half});
  });
  std::vector<float> cos, sin;
  build_rope_table(cos, sin, int(P), c.head_dim, c.rope_theta);
  backend.upload(ws.cos, cos.data());
  backend.upload(ws.sin, sin.data());
  std::vector<int32_t> row_starts(size_t(B + 1));
  for (int64_t i = 0; i <= B; i++) row_starts[size_t(i)] = int32_t(i);
  backend.upload(ws.one_row_each, row_starts.data());
  return ws;
}

// ---------------------------------------------------------------------------------------------------
// Forward

Qwen3Model::Qwen3Model(const ModelConfig& config, Qwen3Weights weights, const TensorParallelLayout& tp, int tp_rank)
    : config_(config),
      weights_(std::move(weights)),
      tp_(tp),
      tp_rank_(tp_rank),
      heads_{tp.heads_per_rank, tp.kv_heads_per_rank, config.head_dim} {}

AttentionShape Qwen3Model::attention_shape(int block_size) const {
  return {heads_.num_heads, heads_.num_kv_heads, heads_.head_dim, block_size,
          float(1.0 / std::sqrt(double(heads_.head_dim)))};
}

Qwen3Model::StepRows Qwen3Model::step_rows(const Qwen3Workspace& ws, int64_t T, int B) {
  StepRows r;
  r.residual = ws.residual.slice_rows(0, T);
  r.hidden = ws.hidden.slice_rows(0, T);
  r.normed = ws.normed.slice_rows(0, T);
  r.qkv = ws.qkv.slice_rows(0, T);
  r.attn_out = ws.attn_out.slice_rows(0, T);
  r.gate_up = ws.gate_up.slice_rows(0, T);
  r.mlp_act = ws.mlp_act.slice_rows(0, T);
  r.head_input = ws.last_hidden.slice_rows(0, B);
  return r;
}

void Qwen3Model::forward_hidden(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws,
                                const std::vector<Tensor>& k_caches, const std::vector<Tensor>& v_caches) {
  const int64_t T = in.input_ids.numel();
  const StepRows rows = step_rows(ws, T, in.attention.num_seqs);
  const float eps = float(config_.rms_norm_eps);

  // Vocab-parallel embedding: each rank fills the rows of the ids in its shard, zeros elsewhere; the
  // all-reduce adds the shards up (nano-vllm's VocabParallelEmbedding).
  b.embedding(rows.residual, weights_.embed_tokens, in.input_ids, int(tp_rank_ * tp_.vocab_per_rank));
  const bool tp = tp_.tp_size > 1;  // with one rank there is nothing to add up
  if (tp) b.all_reduce(rows.residual);
  if (!tp && b.fuses_around_linear(T)) {
    forward_fused_around_linear(b, in, ws, rows, k_caches, v_caches);
    return;
  }
  // The first layer's attention norm: there is no sublayer output to add yet. Every later norm is taken by
  // the projection before it (project_add_norm).
  b.rmsnorm(rows.normed, rows.residual, weights_.layers[0].input_layernorm, eps);
  const size_t num_layers = weights_.layers.size();  // at least 1 (ModelConfig::load)
  for (size_t l = 0; l < num_layers; l++) {
    // The norm after the layer: the next layer's attention norm, after the last layer the model's final norm.
    const Tensor& next_norm = l + 1 < num_layers ? weights_.layers[l + 1].input_layernorm : weights_.norm;
    if (in.attention.is_prefill && l + 1 == num_layers)
      forward_last_layer_of_prefill(b, in, ws, rows, weights_.layers[l], next_norm, k_caches[l], v_caches[l]);
    else
      forward_layer(b, in, ws, rows, weights_.layers[l], next_norm, k_caches[l], v_caches[l],
                    l + 1 < num_layers ? &k_caches[l + 1] : nullptr, l + 1 < num_layers ? &v_caches[l + 1] : nullptr);
  }
}

void Qwen3Model::forward_layer(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws, const StepRows& rows,
                               const Qwen3Weights::Layer& w, const Tensor& next_norm, const Tensor& k_cache,
                               const Tensor& v_cache, const Tensor* next_k_cache, const Tensor* next_v_cache) {
  const float eps = float(config_.rms_norm_eps);
  b.linear_before_attention(rows.qkv, rows.normed, w.qkv_proj);
  // q/k RMSNorm + RoPE, then K/V into the cache (nano-vllm: rotary_emb, then Attention's store_kvcache),
  // store before attend, so that attention reads this step's keys from the cache too; then attention.
  // One call: the GPU does all of it in one kernel in decode (Backend::qk_norm_rope_store_attention).
  const AttentionShape shape = attention_shape(int(k_cache.shape[1]));
  if (tp_.tp_size == 1 && b.fuses_attention_o_proj(in.attention, shape)) {
    // The same, then o_proj and the MLP block's norm, in one call: on the GPU at one decode sequence o_proj's
    // blocks merge attention's splits themselves (Backend::attention_o_proj_add_rmsnorm).
    b.attention_o_proj_add_rmsnorm(rows.normed, rows.residual, rows.hidden, rows.attn_out, rows.qkv, w.q_norm,
                                   w.k_norm, in.positions, ws.cos, ws.sin, k_cache, v_cache, heads_, eps, in.attention,
                                   shape, w.o_proj, w.post_attention_layernorm);
  } else {
    b.qk_norm_rope_store_attention(rows.attn_out, rows.qkv, w.q_norm, w.k_norm, in.positions, ws.cos, ws.sin, k_cache,
                                   v_cache, heads_, eps, in.attention, shape);
    // o_proj, and the MLP block's norm.
    project_add_norm(b, rows.normed, rows.residual, rows.hidden, rows.attn_out, w.o_proj, w.post_attention_layernorm);
  }
  // While the MLP and the next qkv run, the next layer's cache may be brought closer (a hint; the GPU's graphs).
  if (next_k_cache) b.warm_kv_cache(*next_k_cache, *next_v_cache, in.attention);
  b.linear_silu_and_mul(rows.mlp_act, rows.gate_up, rows.normed, w.gate_up_proj);  // one kernel where the backend fuses them
  // down_proj, and the norm after the layer.
  project_add_norm(b, rows.normed, rows.residual, rows.hidden, rows.mlp_act, w.down_proj, next_norm);
}

void Qwen3Model::forward_last_layer_of_prefill(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws,
                                               const StepRows& rows, const Qwen3Weights::Layer& w,
                                               const Tensor& final_norm, const Tensor& k_cache,
                                               const Tensor& v_cache) {
  const int B = in.attention.num_seqs;
  const float eps = float(config_.rms_norm_eps);
  // Every row's K and V go into the cache, since later steps attend to them; past that, a row's work feeds
  // only its own row, and only each sequence's last row reaches the LM head. So those B rows alone go on
  // (of a 1,000-token prompt, 1 row): their q attends to the whole prompt, as the last query row of the full
  // prefill does, through the same prefill attention with one query row a sequence. Each row is computed as
  // it would be among all T rows (the same operations; on the CPU the same bits:
  // 04_model_runner/model_runner_test.cpp).
  b.linear_before_attention(rows.qkv, rows.normed, w.qkv_proj);
  b.qk_norm_rope_store(rows.qkv, w.q_norm, w.k_norm, in.positions, ws.cos, ws.sin, k_cache, v_cache,
                       in.attention.slot_mapping, heads_, eps);
  // The step's buffers other than qkv and residual are free now: their first B rows hold the rest.
  const Tensor last_qkv = ws.last_qkv.slice_rows(0, B), last_residual = rows.normed.slice_rows(0, B),
               last_attn = rows.attn_out.slice_rows(0, B), last_sublayer = rows.hidden.slice_rows(0, B),
               last_gate_up = rows.gate_up.slice_rows(0, B), last_act = rows.mlp_act.slice_rows(0, B);
  b.gather_rows(last_qkv, rows.qkv, in.last_token_rows);
  b.gather_rows(last_residual, rows.residual, in.last_token_rows);
  AttentionMetadata one_row_each = in.attention;
  one_row_each.cu_seqlens_q = ws.one_row_each.slice_rows(0, B + 1);
  one_row_each.max_seqlen_q = 1;
  b.attention(last_attn, last_qkv, k_cache, v_cache, one_row_each, attention_shape(int(k_cache.shape[1])));
  project_add_norm(b, rows.head_input, last_residual, last_sublayer, last_attn, w.o_proj, w.post_attention_layernorm);
  b.linear_silu_and_mul(last_act, last_gate_up, rows.head_input, w.gate_up_proj);
  project_add_norm(b, rows.head_input, last_residual, last_sublayer, last_act, w.down_proj, final_norm);
}

void Qwen3Model::forward_fused_around_linear(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws,
                                             const StepRows& rows, const std::vector<Tensor>& k_caches,
                                             const std::vector<Tensor>& v_caches) {
  const float eps = float(config_.rms_norm_eps);
  for (size_t l = 0; l < weights_.layers.size(); l++) {
    const Qwen3Weights::Layer& w = weights_.layers[l];
    b.rmsnorm_linear(rows.qkv, rows.residual, w.input_layernorm, eps, w.qkv_proj);
    b.qk_norm_rope_store_attention(rows.attn_out, rows.qkv, w.q_norm, w.k_norm, in.positions, ws.cos, ws.sin,
                                   k_caches[l], v_caches[l], heads_, eps, in.attention,
                                   attention_shape(int(k_caches[l].shape[1])));
    b.linear_add(rows.residual, rows.attn_out, w.o_proj);
    b.rmsnorm_linear(rows.gate_up, rows.residual, w.post_attention_layernorm, eps, w.gate_up_proj);
    b.silu_linear_add(rows.residual, rows.gate_up, w.down_proj);
  }
  b.rmsnorm(rows.normed, rows.residual, weights_.norm, eps);
  if (in.attention.is_prefill) b.gather_rows(rows.head_input, rows.normed, in.last_token_rows);
}

void Qwen3Model::project_add_norm(Backend& b, const Tensor& out, const Tensor& res, const Tensor& hid, const Tensor& x,
                                  const Tensor& weight, const Tensor& norm_weight) const {
  const float eps = float(config_.rms_norm_eps);
  if (tp_.tp_size == 1) {
    b.linear_add_rmsnorm(out, res, hid, x, weight, norm_weight, eps);
    return;
  }
  b.linear(hid, x, weight);
  b.all_reduce(hid);  // row parallel (nano-vllm's RowParallelLinear): o_proj saw its heads, down_proj its MLP columns
  b.add_rmsnorm(out, res, hid, norm_weight, eps);
}

void Qwen3Model::sample_in_lm_head(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws, const Tensor& tokens,
                                   const Tensor& sampling, int num_seqs) {
  b.linear_sample(tokens, ws.logits.slice_rows(0, num_seqs), lm_head_rows(in.attention.is_prefill, ws, num_seqs),
                  weights_.lm_head, sampling, /*all_logits=*/false);
}

void Qwen3Model::logits_of_sampled_step(Backend& b, bool is_prefill, const Qwen3Workspace& ws, const Tensor& tokens,
                                        const Tensor& sampling, int num_seqs) {
  b.linear_sample(tokens, ws.logits.slice_rows(0, num_seqs), lm_head_rows(is_prefill, ws, num_seqs), weights_.lm_head,
                  sampling, /*all_logits=*/true);
}

void Qwen3Model::compute_logits(Backend& b, const ForwardInputs& in, const Qwen3Workspace& ws, int num_seqs) {
  const Tensor last = lm_head_rows(in.attention.is_prefill, ws, num_seqs);
  if (tp_.tp_size == 1) {
    b.linear(ws.logits.slice_rows(0, num_seqs), last, weights_.lm_head);
  } else {
    b.linear(ws.logits_shard.slice_rows(0, num_seqs), last, weights_.lm_head);
    b.gather(ws.logits_shard.slice_rows(0, num_seqs), ws.logits.slice_rows(0, num_seqs));
  }
}

}  // namespace nanovllm
