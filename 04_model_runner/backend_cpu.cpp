// backend_cpu.cpp: the Backend on the CPU: every operation is its chapter's *_cpu reference, in fp32.
#include <cassert>
#include <cstring>

#include "04_model_runner/backend.h"
#include "04_model_runner/layers.h"
#include "06_tensor_parallel/communicator.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

float* f32(const Tensor& t) {
  assert(t.dtype == DType::F32 && t.device == Device::CPU);
  return t.as<float>();
}
int32_t* i32(const Tensor& t) {
  assert(t.dtype == DType::I32 && t.device == Device::CPU);
  return t.as<int32_t>();
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  DType act_dtype() const override { return DType::F32; }

  void upload(const Tensor& dst, const void* host) override { std::memcpy(dst.data, host, dst.nbytes()); }
  void download(void* host, const Tensor& src) override { std::memcpy(host, src.data, src.nbytes()); }

  void embedding(const Tensor& out, const Tensor& table, const Tensor& ids, int vocab_start) override {
    embedding_cpu(f32(out), f32(table), i32(ids), int(ids.numel()), int(table.shape[1]), vocab_start,
                  int(table.shape[0]));
  }
  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps) override {
    rmsnorm_cpu(f32(out), f32(x), f32(weight), int(x.rows()), int(x.row_size()), eps);
  }
  void add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight,
                   float eps) override {
    add_rmsnorm_cpu(f32(out), f32(residual), f32(x), f32(weight), int(x.rows()), int(x.row_size()), eps);
  }
  void linear(const Tensor& out, const Tensor& x, const Tensor& weight) override {
    assert(x.row_size() == weight.shape[1] && out.row_size() == weight.shape[0]);
    linear_cpu(f32(out), f32(x), f32(weight), int(x.rows()), int(weight.shape[1]), int(weight.shape[0]));
  }
  void qk_norm_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                          const Tensor& cos, const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& slot_mapping, const HeadLayout& h, float eps) override {
    qk_norm_rope_store_cpu(f32(qkv), qkv.row_size(), f32(q_norm), f32(k_norm), i32(positions), f32(cos), f32(sin),
                           f32(k_cache), f32(v_cache), i32(slot_mapping), int(qkv.rows()), h.num_heads,
                           h.num_kv_heads, h.head_dim, eps);
  }
  void attention(const Tensor& out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionMetadata& m, const AttentionShape& s) override {
    int width = int(m.block_tables.shape[1]);
    if (m.is_prefill) {
      prefill_attention_cpu(f32(out), out.row_size(), f32(qkv), qkv.row_size(), f32(k_cache), f32(v_cache),
                            i32(m.cu_seqlens_q), i32(m.cu_seqlens_k), i32(m.block_tables), width, m.num_seqs, s);
    } else {
      decode_attention_cpu(f32(out), out.row_size(), f32(qkv), qkv.row_size(), f32(k_cache), f32(v_cache),
                           i32(m.context_lens), i32(m.block_tables), width, m.num_seqs, s);
    }
  }
  void silu_and_mul(const Tensor& out, const Tensor& gate_up) override {
    silu_and_mul_cpu(f32(out), f32(gate_up), int(out.rows()), int(out.row_size()));
  }
  void gather_rows(const Tensor& out, const Tensor& x, const Tensor& rows) override {
    gather_rows_cpu(f32(out), f32(x), i32(rows), int(rows.numel()), int(x.row_size()));
  }
  void take_sampled_tokens(const Tensor& ids, const Tensor& tokens, const Tensor& rows) override {
    take_sampled_tokens_cpu(i32(ids), i32(tokens), i32(rows), int(rows.numel()));
  }
  void all_reduce(const Tensor& x) override {
    if (group_.size > 1) group_.cpu->all_reduce(group_.rank, f32(x), x.numel());
  }
  void gather(const Tensor& shard, const Tensor& out) override {
    if (group_.size > 1) {
      group_.cpu->gather(group_.rank, f32(shard), int(shard.rows()), int(shard.row_size()),
                         group_.rank == 0 ? f32(out) : nullptr, int(out.row_size()));
    } else {
      for (int64_t i = 0; i < shard.rows(); i++)
        std::memcpy(f32(out) + i * out.row_size(), f32(shard) + i * shard.row_size(), sizeof(float) * out.row_size());
    }
  }
  void sample(const Tensor& tokens, const Tensor& logits, const Tensor& sampling) override {
    sample_cpu(i32(tokens), f32(logits), int(tokens.numel()), int(logits.row_size()),
               sampling.as<const SamplingRow>());
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace nanovllm
