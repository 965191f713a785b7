// profiler.h: timing the model's operations one by one, for `nanovllm bench --profile` and
// `nanovllm bench-step` (a tool beside the engine: a normal run never constructs one).
//
// ProfiledBackend wraps the runner's Backend and forwards every operation, timing each: with CUDA
// events on the backend's stream on the GPU (kernel time, launch gaps excluded), with the host clock on
// the CPU (where an operation has finished when it returns). It runs what the engine runs: every fused
// path the inner backend takes, it takes too. Times are summed per label:
//   "linear 256x1024->4096" (rows x in -> out), "attention decode", "add_rmsnorm", ...; a fused
//   qk_norm_rope_store_attention is one label, "qk_norm_rope_store + attention decode", and so is each fused
//   projection, "rmsnorm+linear 1x1024->4096", "linear+add 1x2048->1024", "silu+linear+add 1x3072->1024",
//   "linear+silu 16x1024->6144", "linear+sample 16x1024->151936"; a projection and the norm after it
//   (linear_add_rmsnorm) is "linear+add_rmsnorm 64x2048->1024", one or two kernels as the inner backend runs it;
//   attention with o_proj merging its splits (attention_o_proj_add_rmsnorm, fused) is
//   "qk_norm_rope_store + attention decode + linear+add_rmsnorm 1x2048->1024".
// Under a CUDA graph replay no operation runs one by one: profile eager steps only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "04_model_runner/backend.h"

namespace nanovllm {

struct OpTime {
  std::string label;
  int calls = 0;
  double milliseconds = 0;
};

class ProfiledBackend final : public Backend {
 public:
  explicit ProfiledBackend(std::unique_ptr<Backend> inner);
  ~ProfiledBackend() override;

  // The time of every operation since the last report, summed per label (sorted by label); clears them.
  std::vector<OpTime> report();

  Device device() const override { return inner_->device(); }
  int device_id() const override { return inner_->device_id(); }
  void set_rank_group(const RankGroup& group) override {
    Backend::set_rank_group(group);
    inner_->set_rank_group(group);
  }
  void bind_to_thread() override { inner_->bind_to_thread(); }
  DType act_dtype() const override { return inner_->act_dtype(); }
  void upload(const Tensor& dst, const void* host) override { inner_->upload(dst, host); }
  void download(void* host, const Tensor& src) override { inner_->download(host, src); }
  void upload_async(const Tensor& dst, const void* host) override { inner_->upload_async(dst, host); }
  void wait_for_upload_async() override { inner_->wait_for_upload_async(); }
  void download_async(void* host, const Tensor& src, int slot) override { inner_->download_async(host, src, slot); }
  void wait_for_download_async(int slot) override { inner_->wait_for_download_async(slot); }
  void pull_async(const Tensor& dst, const void* host, const std::vector<ByteRange>& ranges) override {
    inner_->pull_async(dst, host, ranges);
  }
  void push_tokens_async(void* host, int64_t stride, const Tensor& src, const Tensor& slot) override {
    inner_->push_tokens_async(host, stride, src, slot);
  }
  void record_download_async(int slot) override { inner_->record_download_async(slot); }
  void synchronize() override { inner_->synchronize(); }
  void memory_info(size_t* free_bytes, size_t* total_bytes) const override { inner_->memory_info(free_bytes, total_bytes); }
  bool supports_graphs() const override { return inner_->supports_graphs(); }
  void begin_capture() override { inner_->begin_capture(); }
  int end_capture() override { return inner_->end_capture(); }
  void replay(int graph) override { inner_->replay(graph); }
  void* stream() const override { return inner_->stream(); }
  size_t attention_scratch_bytes(int max_seqs, int max_context_len, const AttentionShape& s) const override {
    return inner_->attention_scratch_bytes(max_seqs, max_context_len, s);
  }

  void embedding(const Tensor& out, const Tensor& table, const Tensor& ids, int vocab_start) override;
  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps) override;
  void add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight,
                   float eps) override;
  void linear(const Tensor& out, const Tensor& x, const Tensor& weight) override;
  void linear_before_attention(const Tensor& out, const Tensor& x, const Tensor& weight) override;
  void qk_norm_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                          const Tensor& cos, const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& slot_mapping, const HeadLayout& heads, float eps) override;
  bool fuses_qk_norm_rope_store_attention(const AttentionMetadata& meta, const AttentionShape& shape) const override {
    return inner_->fuses_qk_norm_rope_store_attention(meta, shape);
  }
  void qk_norm_rope_store_attention(const Tensor& out, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                    const Tensor& positions, const Tensor& cos, const Tensor& sin,
                                    const Tensor& k_cache, const Tensor& v_cache, const HeadLayout& heads, float eps,
                                    const AttentionMetadata& meta, const AttentionShape& shape) override;
  void attention(const Tensor& out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionMetadata& meta, const AttentionShape& shape) override;
  bool fuses_attention_o_proj(const AttentionMetadata& meta, const AttentionShape& shape) const override {
    return inner_->fuses_attention_o_proj(meta, shape);
  }
  void attention_o_proj_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden,
                                    const Tensor& attn_out, const Tensor& qkv, const Tensor& q_norm,
                                    const Tensor& k_norm, const Tensor& positions, const Tensor& cos,
                                    const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                    const HeadLayout& heads, float eps, const AttentionMetadata& meta,
                                    const AttentionShape& shape, const Tensor& o_proj,
                                    const Tensor& norm_weight) override;
  // A hint that does something only while a graph is captured (the GPU's): passed on, not timed.
  void warm_kv_cache(const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta) override {
    inner_->warm_kv_cache(k_cache, v_cache, meta);
  }
  void silu_and_mul(const Tensor& out, const Tensor& gate_up) override;
  bool fuses_linear_silu(int64_t num_rows) const override { return inner_->fuses_linear_silu(num_rows); }
  void linear_silu_and_mul(const Tensor& out, const Tensor& gate_up, const Tensor& x, const Tensor& weight) override;
  bool fuses_around_linear(int64_t num_rows) const override { return inner_->fuses_around_linear(num_rows); }
  void rmsnorm_linear(const Tensor& out, const Tensor& x, const Tensor& norm_weight, float eps,
                      const Tensor& weight) override;
  void linear_add(const Tensor& residual, const Tensor& x, const Tensor& weight) override;
  void silu_linear_add(const Tensor& residual, const Tensor& gate_up, const Tensor& weight) override;
  void linear_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden, const Tensor& x,
                          const Tensor& weight, const Tensor& norm_weight, float eps) override;
  bool fuses_linear_sample(int64_t num_rows) const override { return inner_->fuses_linear_sample(num_rows); }
  void linear_sample(const Tensor& tokens, const Tensor& logits, const Tensor& x, const Tensor& weight,
                     const Tensor& sampling, bool all_logits) override;
  void gather_rows(const Tensor& out, const Tensor& x, const Tensor& rows) override;
  void take_sampled_tokens(const Tensor& ids, const Tensor& tokens, const Tensor& rows) override;
  void sample(const Tensor& tokens, const Tensor& logits, const Tensor& sampling) override;
  void all_reduce(const Tensor& x) override;
  void gather(const Tensor& shard, const Tensor& out) override;

 private:
  struct Timer;  // one timed call: two CUDA events, or two host clock readings
  template <class F>
  void timed(std::string label, F&& op);

  std::unique_ptr<Backend> inner_;
  std::vector<std::unique_ptr<Timer>> timers_;  // calls since the last report, in order
};

// Device-to-device copy bandwidth in GB/s (bytes read + written per second) on the current CUDA device, the
// roofline for memory-bound kernels: ten 1 GiB copies timed with CUDA events (2 GiB allocated for them). 0
// without a GPU.
double measure_copy_bandwidth();

// Marks where an external profiler should look: between profiler_range_begin() and profiler_range_end()
// (cudaProfilerStart / cudaProfilerStop), so that `ncu --profile-from-start off` measures those kernels
// only. No effect without a GPU or without a profiler attached.
void profiler_range_begin();
void profiler_range_end();

}  // namespace nanovllm
