// profiler.cpp: ProfiledBackend (time every operation) and the copy-bandwidth roofline.
#include "04_model_runner/profiler.h"

#include <chrono>
#include <map>

#include "01_sequence/base/cuda_utils.h"
#ifdef NANOVLLM_CUDA
#include <cuda_profiler_api.h>
#endif

namespace nanovllm {

struct ProfiledBackend::Timer {
  std::string label;
  std::chrono::steady_clock::time_point host_start, host_stop;  // CPU
#ifdef NANOVLLM_CUDA
  cudaEvent_t start = nullptr, stop = nullptr;                 // GPU
  ~Timer() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
#endif
  double milliseconds() const {
#ifdef NANOVLLM_CUDA
    if (start) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return ms;
    }
#endif
    return std::chrono::duration<double, std::milli>(host_stop - host_start).count();
  }
};

ProfiledBackend::ProfiledBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
ProfiledBackend::~ProfiledBackend() = default;

template <class F>
void ProfiledBackend::timed(std::string label, F&& op) {
  auto t = std::make_unique<Timer>();
  t->label = std::move(label);
#ifdef NANOVLLM_CUDA
  if (cudaStream_t stream = static_cast<cudaStream_t>(inner_->stream())) {
    CUDA_CHECK(cudaEventCreate(&t->start));
    CUDA_CHECK(cudaEventCreate(&t->stop));
    CUDA_CHECK(cudaEventRecord(t->start, stream));
    op();
    CUDA_CHECK(cudaEventRecord(t->stop, stream));
    timers_.push_back(std::move(t));
    return;
  }
#endif
  t->host_start = std::chrono::steady_clock::now();
  op();
  t->host_stop = std::chrono::steady_clock::now();
  timers_.push_back(std::move(t));
}

std::vector<OpTime> ProfiledBackend::report() {
  inner_->synchronize();  // every event has happened
  std::map<std::string, OpTime> by_label;
  for (const auto& t : timers_) {
    OpTime& sum = by_label[t->label];
    sum.label = t->label, sum.calls++, sum.milliseconds += t->milliseconds();
  }
  timers_.clear();
  std::vector<OpTime> out;
  for (auto& entry : by_label) out.push_back(entry.second);
  return out;
}

namespace {

// "linear 1x1024->4096" (rows x in -> out); the fused projections say what they took in:
// "rmsnorm+linear 1x1024->4096".
std::string linear_label(const char* what, const Tensor& x, const Tensor& weight) {
  return std::string(what) + std::to_string(x.rows()) + "x" + std::to_string(weight.shape[1]) + "->" +
         std::to_string(weight.shape[0]);
}

}  // namespace

void ProfiledBackend::embedding(const Tensor& out, const Tensor& table, const Tensor& ids, int vocab_start) {
  timed("embedding", [&] { inner_->embedding(out, table, ids, vocab_start); });
}
void ProfiledBackend::rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps) {
  timed("rmsnorm", [&] { inner_->rmsnorm(out, x, weight, eps); });
}
void ProfiledBackend::add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight,
                                  float eps) {
  timed("add_rmsnorm", [&] { inner_->add_rmsnorm(out, residual, x, weight, eps); });
}
void ProfiledBackend::linear(const Tensor& out, const Tensor& x, const Tensor& weight) {
  timed(linear_label("linear ", x, weight), [&] { inner_->linear(out, x, weight); });
}
void ProfiledBackend::linear_before_attention(const Tensor& out, const Tensor& x, const Tensor& weight) {
  timed(linear_label("linear ", x, weight), [&] { inner_->linear_before_attention(out, x, weight); });
}
void ProfiledBackend::qk_norm_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                         const Tensor& positions, const Tensor& cos, const Tensor& sin,
                                         const Tensor& k_cache, const Tensor& v_cache, const Tensor& slot_mapping,
                                         const HeadLayout& heads, float eps) {
  timed("qk_norm_rope_store", [&] {
    inner_->qk_norm_rope_store(qkv, q_norm, k_norm, positions, cos, sin, k_cache, v_cache, slot_mapping, heads, eps);
  });
}
void ProfiledBackend::attention(const Tensor& out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                const AttentionMetadata& meta, const AttentionShape& shape) {
  timed(meta.is_prefill ? "attention prefill" : "attention decode",
        [&] { inner_->attention(out, qkv, k_cache, v_cache, meta, shape); });
}
void ProfiledBackend::qk_norm_rope_store_attention(const Tensor& out, const Tensor& qkv, const Tensor& q_norm,
                                                   const Tensor& k_norm, const Tensor& positions, const Tensor& cos,
                                                   const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                                   const HeadLayout& heads, float eps, const AttentionMetadata& meta,
                                                   const AttentionShape& shape) {
  if (!inner_->fuses_qk_norm_rope_store_attention(meta, shape)) {  // two operations, each timed on its own
    Backend::qk_norm_rope_store_attention(out, qkv, q_norm, k_norm, positions, cos, sin, k_cache, v_cache, heads, eps,
                                          meta, shape);
    return;
  }
  timed(meta.is_prefill ? "qk_norm_rope_store + attention prefill" : "qk_norm_rope_store + attention decode", [&] {
    inner_->qk_norm_rope_store_attention(out, qkv, q_norm, k_norm, positions, cos, sin, k_cache, v_cache, heads, eps,
                                         meta, shape);
  });
}
void ProfiledBackend::attention_o_proj_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden,
                                                   const Tensor& attn_out, const Tensor& qkv, const Tensor& q_norm,
                                                   const Tensor& k_norm, const Tensor& positions, const Tensor& cos,
                                                   const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                                   const HeadLayout& heads, float eps, const AttentionMetadata& meta,
                                                   const AttentionShape& shape, const Tensor& o_proj,
                                                   const Tensor& norm_weight) {
  if (!inner_->fuses_attention_o_proj(meta, shape)) {  // the two operations, each timed as it runs
    Backend::attention_o_proj_add_rmsnorm(out, residual, hidden, attn_out, qkv, q_norm, k_norm, positions, cos, sin,
                                          k_cache, v_cache, heads, eps, meta, shape, o_proj, norm_weight);
    return;
  }
  timed(linear_label("qk_norm_rope_store + attention decode + linear+add_rmsnorm ", attn_out, o_proj), [&] {
    inner_->attention_o_proj_add_rmsnorm(out, residual, hidden, attn_out, qkv, q_norm, k_norm, positions, cos, sin,
                                         k_cache, v_cache, heads, eps, meta, shape, o_proj, norm_weight);
  });
}
void ProfiledBackend::silu_and_mul(const Tensor& out, const Tensor& gate_up) {
  timed("silu_and_mul", [&] { inner_->silu_and_mul(out, gate_up); });
}
void ProfiledBackend::linear_silu_and_mul(const Tensor& out, const Tensor& gate_up, const Tensor& x,
                                          const Tensor& weight) {
  if (!inner_->fuses_linear_silu(x.rows())) {  // two operations, each timed on its own
    Backend::linear_silu_and_mul(out, gate_up, x, weight);
    return;
  }
  timed(linear_label("linear+silu ", x, weight), [&] { inner_->linear_silu_and_mul(out, gate_up, x, weight); });
}
void ProfiledBackend::rmsnorm_linear(const Tensor& out, const Tensor& x, const Tensor& norm_weight, float eps,
                                     const Tensor& weight) {
  timed(linear_label("rmsnorm+linear ", x, weight), [&] { inner_->rmsnorm_linear(out, x, norm_weight, eps, weight); });
}
void ProfiledBackend::linear_add(const Tensor& residual, const Tensor& x, const Tensor& weight) {
  timed(linear_label("linear+add ", x, weight), [&] { inner_->linear_add(residual, x, weight); });
}
void ProfiledBackend::silu_linear_add(const Tensor& residual, const Tensor& gate_up, const Tensor& weight) {
  timed(linear_label("silu+linear+add ", gate_up, weight),
        [&] { inner_->silu_linear_add(residual, gate_up, weight); });
}
void ProfiledBackend::linear_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden,
                                         const Tensor& x, const Tensor& weight, const Tensor& norm_weight, float eps) {
  // One label whichever way the inner backend runs it: with linear version 8 the norm adds the projection's
  // split-K partials, and there is no product of its own to time apart.
  timed(linear_label("linear+add_rmsnorm ", x, weight),
        [&] { inner_->linear_add_rmsnorm(out, residual, hidden, x, weight, norm_weight, eps); });
}
void ProfiledBackend::linear_sample(const Tensor& tokens, const Tensor& logits, const Tensor& x, const Tensor& weight,
                                    const Tensor& sampling, bool all_logits) {
  timed(linear_label("linear+sample ", x, weight),
        [&] { inner_->linear_sample(tokens, logits, x, weight, sampling, all_logits); });
}
void ProfiledBackend::gather_rows(const Tensor& out, const Tensor& x, const Tensor& rows) {
  timed("gather_rows", [&] { inner_->gather_rows(out, x, rows); });
}
void ProfiledBackend::take_sampled_tokens(const Tensor& ids, const Tensor& tokens, const Tensor& rows) {
  timed("take_sampled_tokens", [&] { inner_->take_sampled_tokens(ids, tokens, rows); });
}
void ProfiledBackend::sample(const Tensor& tokens, const Tensor& logits, const Tensor& sampling) {
  timed("sample", [&] { inner_->sample(tokens, logits, sampling); });
}

void ProfiledBackend::all_reduce(const Tensor& x) {
  timed("all_reduce", [&] { inner_->all_reduce(x); });
}
void ProfiledBackend::gather(const Tensor& shard, const Tensor& out) {
  timed("gather logits", [&] { inner_->gather(shard, out); });
}

double measure_copy_bandwidth() {
#ifdef NANOVLLM_CUDA
  if (!cuda_device_present()) return 0;
  const size_t bytes = size_t(1) << 30;
  Buffer a(Device::CUDA, bytes), b(Device::CUDA, bytes);
  CUDA_CHECK(cudaMemset(a.data(), 1, bytes));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));  // warm-up
  const int reps = 10;
  CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; i++)
    CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes,
                               cudaMemcpyDeviceToDevice));
  CUDA_CHECK(cudaEventRecord(stop));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return 2.0 * double(bytes) * reps / (ms * 1e-3) / 1e9;  // each copy reads and writes `bytes`
#else
  return 0;
#endif
}

void profiler_range_begin() {
#ifdef NANOVLLM_CUDA
  if (cuda_device_present()) CUDA_CHECK(cudaProfilerStart());
#endif
}

void profiler_range_end() {
#ifdef NANOVLLM_CUDA
  if (cuda_device_present()) CUDA_CHECK(cudaProfilerStop());
#endif
}

}  // namespace nanovllm
