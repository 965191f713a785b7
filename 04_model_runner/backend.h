// backend.h: the small set of operations the Qwen3 model is written against (nano-vllm has no such
// layer: PyTorch is its backend). The model is written once;
// a Backend runs it on the CPU (fp32 everywhere: the readable reference and the test oracle) or on a
// CUDA GPU (bf16 weights, activations and KV cache; fp32 arithmetic).
//
// Every Tensor passed in lives on the backend's device. "act" below means the backend's activation dtype
// (F32 on the CPU, BF16 on the GPU), "weight" its weight dtype (the same).
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "04_model_runner/tensor.h"
#include "05_attention/attention.h"
#include "07_sampler/sampler.h"

namespace nanovllm {

// nano-vllm's Context: what attention needs to know about this step, in device memory.
struct AttentionMetadata {
  bool is_prefill = false;
  int num_seqs = 0;
  Tensor slot_mapping;  // (num_tokens,) i32: cache slot of each new token, -1 = skip
  Tensor block_tables;  // (num_seqs, width) i32: physical blocks of each sequence, -1 padded
  // Prefill only:
  Tensor cu_seqlens_q;  // (num_seqs + 1,) i32: query rows of sequence b are [cu_q[b], cu_q[b+1])
  Tensor cu_seqlens_k;  // (num_seqs + 1,) i32: sequence b attends to cu_k[b+1] - cu_k[b] keys
  int max_seqlen_q = 0;
  // Decode only:
  Tensor context_lens;  // (num_seqs,) i32: keys to attend to, the current token's included; 0 = padding
  int max_context_len = 0;  // an upper bound, for sizing the work (prefill sets it too; nothing reads it there)
  Tensor scratch;           // F32 workspace of the GPU decode kernel (partial results); unused on the CPU
};

class CpuCommunicator;   // 06_tensor_parallel/communicator.h
class CudaCommunicator;  // 06_tensor_parallel/all_reduce.h

// The tensor-parallel group of a backend: which rank it is, and what it shares with the other ranks.
struct RankGroup {
  int rank = 0, size = 1;
  CpuCommunicator* cpu = nullptr;   // CPU ranks
  CudaCommunicator* cuda = nullptr; // GPU ranks
  // Every rank's activation workspace, carved with the same layout: a tensor at offset o of this rank's
  // workspace is at offset o of each peer's. The GPU collectives find the peers' copies that way.
  std::vector<char*> workspaces;
};

// One rank's attention heads: num_heads query and num_kv_heads KV heads of head_dim each; a row of the packed
// qkv projection is [q (q_dim), k (kv_dim), v (kv_dim)].
struct HeadLayout {
  int num_heads, num_kv_heads, head_dim;
  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual int device_id() const { return -1; }  // the CUDA device number (-1 on the CPU)
  virtual DType act_dtype() const = 0;
  DType weight_dtype() const { return act_dtype(); }

  // Host <-> device copies of a whole tensor; `host` may be reused as soon as they return.
  virtual void upload(const Tensor& dst, const void* host) = 0;
  virtual void download(void* host, const Tensor& src) = 0;
  // The same upload, queued: on the GPU, from pinned memory (Buffer), a DMA ordered before the work queued
  // after it, and the call returns at once. `host` must not be written again until wait_for_upload_async()
  // returns, which waits for the last such copy. On the CPU: upload, and nothing to wait for.
  virtual void upload_async(const Tensor& dst, const void* host) { upload(dst, host); }
  virtual void wait_for_upload_async() {}
  // The download, queued (the overlapped loop, LLMEngine::step): on the GPU into pinned memory (Buffer),
  // after the work queued before it, and the call returns at once; `host` holds the bytes once
  // wait_for_download_async(slot) returns. Two slots, 0 and 1: one step's tokens on their way while the
  // step before's are read. On the CPU: download.
  virtual void download_async(void* host, const Tensor& src, int /*slot*/) { download(host, src); }
  virtual void wait_for_download_async(int /*slot*/) {}
  // A CUDA graph's own transfers, so that nothing is copied between two replays (on an H200 each copy
  // queued there costs the device 8-16 µs of waiting: 04_model_runner/NOTES.md section 3). pull_async
  // queues the copy of byte ranges of `host` (pinned, for the device to read directly) to the same offsets
  // of dst, captured as a graph's first operation; wait_for_upload_async() then also waits until the last
  // replayed pull has read `host`. push_tokens_async queues the copy of src (n,) i32 to host + *slot *
  // stride (host pinned; slot (1,) i32 on the device, read when the copy runs); record_download_async(slot)
  // after the work that pushes, and wait_for_download_async(slot) returns once the tokens are there. On
  // the CPU the same copies, done at once.
  struct ByteRange {
    int64_t offset, bytes;
  };
  virtual void pull_async(const Tensor& dst, const void* host, const std::vector<ByteRange>& ranges) {
    for (const ByteRange& r : ranges)
      std::memcpy(static_cast<char*>(dst.data) + r.offset, static_cast<const char*>(host) + r.offset, size_t(r.bytes));
  }
  virtual void push_tokens_async(void* host, int64_t stride, const Tensor& src, const Tensor& slot) {
    std::memcpy(static_cast<int32_t*>(host) + *slot.as<const int32_t>() * stride, src.data, src.nbytes());
  }
  virtual void record_download_async(int /*slot*/) {}
  // Waits for queued work (a no-op on the CPU).
  virtual void synchronize() {}
  // Device memory: free and total bytes (the CPU reports 0, 0).
  virtual void memory_info(size_t* free_bytes, size_t* total_bytes) const { *free_bytes = *total_bytes = 0; }

  // CUDA graphs: record the operations queued between begin_capture() and end_capture() once, then
  // replay them with one launch (a no-op fallback on the CPU, which never captures).
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual int end_capture() { return -1; }  // an id for replay()
  virtual void replay(int /*graph*/) {}

  // Tensor parallelism. set_rank_group makes this backend rank `group.rank` of a group; all_reduce adds
  // x (n, cols) act over the ranks, in place, in rank order (every rank gets the same bits); gather gives
  // rank 0 out (rows, out_cols) F32 = the ranks' shard (rows, shard_cols) F32 side by side, cut at
  // out_cols. With one rank both are no-ops (gather copies). bind_to_thread makes the backend's device
  // current on the calling thread (each rank runs on its own thread).
  virtual void set_rank_group(const RankGroup& group) { group_ = group; }
  const RankGroup& rank_group() const { return group_; }
  virtual void all_reduce(const Tensor& x) = 0;
  virtual void gather(const Tensor& shard, const Tensor& out) = 0;
  virtual void bind_to_thread() {}

  // The CUDA stream every operation is queued on (cudaStream_t), for tools that time them (profiler.h);
  // nullptr on the CPU, where every operation has finished when it returns.
  virtual void* stream() const { return nullptr; }

  // Bytes of AttentionMetadata::scratch that decode attention needs for these limits.
  virtual size_t attention_scratch_bytes(int /*max_seqs*/, int /*max_context_len*/, const AttentionShape&) const {
    return 0;
  }

  // out (n, hidden) act = table (vocab_part, hidden) weight rows of ids (n,) i32, offset by vocab_start.
  virtual void embedding(const Tensor& out, const Tensor& table, const Tensor& ids, int vocab_start) = 0;
  // out (n, hidden) act = rmsnorm(x) * weight (hidden,).
  virtual void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps) = 0;
  // residual (n, hidden) += x; out = rmsnorm(residual) * weight.
  virtual void add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight,
                           float eps) = 0;
  // out (n, out_features) act or F32 = x (n, in_features) act @ weight (out_features, in_features)^T.
  virtual void linear(const Tensor& out, const Tensor& x, const Tensor& weight) = 0;
  // linear, for qkv's projection, whose output attention reads next. The GPU lets attention in beside it in a
  // captured step with one rank: a cuBLAS GEMM there leaves a few SMs free, where attention's blocks start
  // while it runs (06_tensor_parallel/linear.h, kSpareSmsBeforeAttention).
  virtual void linear_before_attention(const Tensor& out, const Tensor& x, const Tensor& weight) {
    linear(out, x, weight);
  }
  // Per-head RMSNorm of q and k, then RoPE at positions (n,) i32 with cos/sin tables (max_positions,
  // head_dim / 2) F32, then k and v written into one layer's cache: qkv (n, qkv_dim) act, q normed and
  // rotated in place; k_cache, v_cache (num_blocks, block_size, num_kv_heads, head_dim) act; slot_mapping (n,) i32, -1 = skip.
  // On the CPU it is exactly the two references in sequence (qk_norm_rope_cpu, store_kvcache_cpu); on the GPU
  // one kernel that reads q, k and v once and leaves qkv's k raw (attention reads keys from the cache only;
  // 04_model_runner/NOTES.md sections 1 and 17), whose test checks it against the two kernels it replaced,
  // qk_norm_rope_cuda and store_kvcache_cuda.
  virtual void qk_norm_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                  const Tensor& positions, const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                                  const Tensor& v_cache, const Tensor& slot_mapping, const HeadLayout& heads,
                                  float eps) = 0;
  // out (n, q_dim) act = attention of the q part of qkv over the paged cache (after store_kvcache).
  virtual void attention(const Tensor& out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionMetadata& meta, const AttentionShape& shape) = 0;
  // qk_norm_rope_store (slots from meta.slot_mapping), then attention: what the model calls for each
  // layer. By default the two in sequence, the spec. A backend that does both in one pass (the GPU in
  // decode with attention v9, v10 or v11, decode_attention_fuses_qk_norm_rope: 05_attention's
  // decode_attention_fused_cuda) says so in fuses_qk_norm_rope_store_attention and overrides this; out
  // and the cache are then the same bits, and qkv is left raw instead of normed and rotated (nobody reads
  // it afterwards).
  virtual bool fuses_qk_norm_rope_store_attention(const AttentionMetadata& /*meta*/,
                                                  const AttentionShape& /*shape*/) const {
    return false;
  }
  virtual void qk_norm_rope_store_attention(const Tensor& out, const Tensor& qkv, const Tensor& q_norm,
                                            const Tensor& k_norm, const Tensor& positions, const Tensor& cos,
                                            const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                            const HeadLayout& heads, float eps, const AttentionMetadata& meta,
                                            const AttentionShape& shape) {
    qk_norm_rope_store(qkv, q_norm, k_norm, positions, cos, sin, k_cache, v_cache, meta.slot_mapping, heads, eps);
    attention(out, qkv, k_cache, v_cache, meta, shape);
  }
  // A projection and the norm after it, with one rank: hidden (n, out_features) act = linear(x, weight), then
  // add_rmsnorm(out, residual, hidden, norm_weight): o_proj with the MLP's norm, down_proj with the next layer's
  // (or the final) norm. By default (the spec) the two operations; a backend may hand the norm the projection's
  // split-K partial sums instead, which it adds up as the projection would (the GPU with linear version 8:
  // 06_tensor_parallel/linear.h), and then hidden is not written. Either way out and residual are the same bits.
  virtual void linear_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden, const Tensor& x,
                                  const Tensor& weight, const Tensor& norm_weight, float eps) {
    linear(hidden, x, weight);
    add_rmsnorm(out, residual, hidden, norm_weight, eps);
  }
  // Attention and o_proj with the MLP's norm, with one rank: qk_norm_rope_store_attention(attn_out, ...), then
  // linear_add_rmsnorm(out, residual, hidden, attn_out, o_proj, norm_weight, eps). By default the two (the
  // spec). A backend that lets the projection merge attention's split partials (the GPU at one decode sequence:
  // 05_attention's decode_attention_o_proj_cuda) says so in fuses_attention_o_proj and overrides this; then
  // hidden is not written, attn_out and the cache are the same bits, and out and residual are within the
  // projection's rounding (o_proj's sum is taken in another order).
  virtual bool fuses_attention_o_proj(const AttentionMetadata& /*meta*/, const AttentionShape& /*shape*/) const {
    return false;
  }
  virtual void attention_o_proj_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden,
                                            const Tensor& attn_out, const Tensor& qkv, const Tensor& q_norm,
                                            const Tensor& k_norm, const Tensor& positions, const Tensor& cos,
                                            const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                            const HeadLayout& heads, float eps, const AttentionMetadata& meta,
                                            const AttentionShape& shape, const Tensor& o_proj,
                                            const Tensor& norm_weight) {
    qk_norm_rope_store_attention(attn_out, qkv, q_norm, k_norm, positions, cos, sin, k_cache, v_cache, heads, eps,
                                 meta, shape);
    linear_add_rmsnorm(out, residual, hidden, attn_out, o_proj, norm_weight, eps);
  }
  // A hint, called after a layer's attention with the next layer's cache: a backend may bring part of that
  // cache's blocks of this step closer (the GPU in a captured decode step of 16-128 rows: the first keys of each
  // block into the L2, on a branch of the graph beside the projections; 05_attention/kv_warm.cu). Nothing is
  // written that any operation reads; by default nothing happens.
  virtual void warm_kv_cache(const Tensor& /*k_cache*/, const Tensor& /*v_cache*/, const AttentionMetadata& /*meta*/) {}
  // out (n, inter) act = silu(gate) * up, gate_up (n, 2 * inter) act.
  virtual void silu_and_mul(const Tensor& out, const Tensor& gate_up) = 0;
  // out (n, inter) act = silu_and_mul(linear(x, weight)): the MLP's gate_up projection, weight (2 inter, in)
  // = [gate; up], and its activation. By default (the spec) the two operations, through gate_up (n, 2 inter)
  // act; a backend whose projection applies the activation itself (fuses_linear_silu(n)) writes out only.
  virtual bool fuses_linear_silu(int64_t /*num_rows*/) const { return false; }
  virtual void linear_silu_and_mul(const Tensor& out, const Tensor& gate_up, const Tensor& x, const Tensor& weight) {
    linear(gate_up, x, weight);
    silu_and_mul(out, gate_up);
  }
  // The projections with the small operations around them, each in one kernel, where a backend can (the GPU
  // at batch 1 with linear version 7: 06_tensor_parallel/linear_prefetch.cu). The model calls the three
  // below only when fuses_around_linear(num_rows) says yes, and only with one rank (with more, the all-reduce
  // of a row-parallel projection sits between the product and the add). Each equals the operations in its
  // comment, one after another, with every intermediate rounded to act dtype as they would store it.
  virtual bool fuses_around_linear(int64_t /*num_rows*/) const { return false; }
  // out (n, out_features) act = linear(rmsnorm(x) * norm_weight, weight); x (n, in_features) act.
  virtual void rmsnorm_linear(const Tensor& /*out*/, const Tensor& /*x*/, const Tensor& /*norm_weight*/, float /*eps*/,
                              const Tensor& /*weight*/) {
    fail("internal: rmsnorm_linear on a backend that does not fuse (see fuses_around_linear)");
  }
  // residual (n, out_features) act += linear(x, weight); x (n, in_features) act.
  virtual void linear_add(const Tensor& /*residual*/, const Tensor& /*x*/, const Tensor& /*weight*/) {
    fail("internal: linear_add on a backend that does not fuse (see fuses_around_linear)");
  }
  // residual (n, out_features) act += linear(silu_and_mul(gate_up), weight); gate_up (n, 2 in_features) act.
  virtual void silu_linear_add(const Tensor& /*residual*/, const Tensor& /*gate_up*/, const Tensor& /*weight*/) {
    fail("internal: silu_linear_add on a backend that does not fuse (see fuses_around_linear)");
  }
  // out (m, cols) = rows of x picked by rows (m,) i32.
  virtual void gather_rows(const Tensor& out, const Tensor& x, const Tensor& rows) = 0;
  // ids (m,) i32: ids[i] = tokens[rows[i]] where rows[i] >= 0, left as uploaded where rows[i] = -1. A decode
  // step scheduled before the last step's tokens reached the host reads them this way, from the sampler's
  // output on the device (ModelRunner::execute).
  virtual void take_sampled_tokens(const Tensor& ids, const Tensor& tokens, const Tensor& rows) = 0;
  // tokens (m,) i32 from logits (m, vocab) F32 and sampling (m,) SamplingRow, each row's settings (stored as
  // U8 bytes: ModelRunner's step tensors).
  virtual void sample(const Tensor& tokens, const Tensor& logits, const Tensor& sampling) = 0;
  // The LM head and the sampler in one kernel, where a backend has one for this many rows (the GPU with
  // linear version 6 or more at 9-128 rows: 06_tensor_parallel's linear_sample_cuda): tokens (m,) i32 as
  // sample(tokens, logits, sampling) after linear(logits, x, weight) would give them from that kernel's own
  // products, x (m, in) act, weight (vocab, in), sampling (m,) SamplingRow. logits (m, vocab) F32 receives only
  // the rows that ask for top-k or top-p, or every row with all_logits. Only with one rank (with more, each
  // holds a shard of the vocabulary, gathered before sampling).
  virtual bool fuses_linear_sample(int64_t /*num_rows*/) const { return false; }
  virtual void linear_sample(const Tensor& /*tokens*/, const Tensor& /*logits*/, const Tensor& /*x*/,
                             const Tensor& /*weight*/, const Tensor& /*sampling*/, bool /*all_logits*/) {
    fail("internal: linear_sample on a backend that does not fuse (see fuses_linear_sample)");
  }

 protected:
  RankGroup group_;
};

std::unique_ptr<Backend> make_cpu_backend();

// The GPU backend on CUDA device `device_id` (only in builds with CUDA), running attention kernel
// `attention_version` (05_attention/attention.h; -1: each phase's fastest) and the projections of
// `linear_version` (06_tensor_parallel/linear.h; 1 to 8; -1: kLinearVersionDefault, what the command line
// runs). Throws Error when there is no GPU.
std::unique_ptr<Backend> make_cuda_backend(int device_id, int attention_version = -1, int linear_version = -1);
// True when this build has CUDA and a CUDA device is present; how many devices there are (0 without).
bool cuda_available();
int cuda_device_count();
// The device a run uses: `asked` ("cpu" or "cuda") when given, else the GPU where one is present, else the CPU
// (EngineConfig::device's default, resolved by ModelRunner and by commands that must know it first).
inline std::string device_or_default(const std::string& asked) {
  return !asked.empty() ? asked : cuda_available() ? "cuda" : "cpu";
}

}  // namespace nanovllm
