// backend_cuda.cpp: the Backend on a CUDA GPU (what PyTorch does for nano-vllm). Weights, activations
// and the KV cache are bf16; every operation is one of our kernels (layers.cu, 05_attention, 07_sampler,
// 06_tensor_parallel's projections) except the projections chapter 06's CudaLinear gives to cuBLAS or
// cuBLASLt (by rows: qkv from 49, gate_up and the LM head from 129, all from 193; its README has the table).
// Everything is queued on one stream, so that a decode step can be captured as a CUDA graph and replayed.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "04_model_runner/backend.h"

#ifdef NANOVLLM_CUDA
#include "04_model_runner/layers.h"
#include "06_tensor_parallel/all_reduce.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {
namespace {

bf16* b16(const Tensor& t) {
  assert(t.dtype == DType::BF16 && t.device == Device::CUDA);
  return t.as<bf16>();
}
int32_t* i32(const Tensor& t) {
  assert(t.dtype == DType::I32 && t.device == Device::CUDA);
  return t.as<int32_t>();
}
float* f32(const Tensor& t) {
  assert(t.dtype == DType::F32 && t.device == Device::CUDA);
  return t.as<float>();
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device_id, int attention_version, int linear_version)
      : device_id_(device_id), attention_version_(attention_version) {
    CUDA_CHECK(cudaSetDevice(device_id));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&warm_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&warm_fork_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
    for (cudaEvent_t& e : download_done_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    pull_counter_ = Buffer(Device::CUDA, sizeof(int64_t));  // on this device: after cudaSetDevice
    warm_checksum_ = Buffer(Device::CUDA, sizeof(unsigned));
    pull_flag_ = Buffer(Device::CPU, sizeof(int64_t), /*pinned=*/true);
    CUDA_CHECK(cudaMemset(pull_counter_.data(), 0, sizeof(int64_t)));
    *static_cast<int64_t*>(pull_flag_.data()) = 0;
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) fail("cannot create a cuBLAS handle");
    cublasSetStream(cublas_, stream_);
    // A workspace of our own: cuBLAS must not allocate while a CUDA graph is being captured. 32 MiB, as
    // the cuBLAS documentation recommends on Hopper; the linear versions share it (one stream).
    cublas_workspace_ = Buffer(Device::CUDA, 32 << 20);
    cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_.bytes());
    linear_ = std::make_unique<CudaLinear>(cublas_, stream_, cublas_workspace_.data(), cublas_workspace_.bytes(),
                                           linear_version);
    // linear_sample's per-row keys and flags, zero between calls (each call leaves them so).
    sample_keys_ = Buffer(Device::CUDA, kWgmmaSampleMaxRows * (sizeof(unsigned long long) + sizeof(int)));
    CUDA_CHECK(cudaMemset(sample_keys_.data(), 0, sample_keys_.bytes()));
    // Linear version 8: the narrow projections' split-K partials, kept until the norm after them has added
    // them (linear_add_rmsnorm): up to kWgmmaMaxSplits x kWgmmaPartialsMaxRows x kWgmmaNarrowOut floats, 12.6 MB.
    if (linear_version == 8)
      partials_ = Buffer(Device::CUDA, size_t(kWgmmaMaxSplits) * kWgmmaPartialsMaxRows * kWgmmaNarrowOut * sizeof(float));
  }
  ~CudaBackend() override {
    for (cudaGraphExec_t g : graphs_) cudaGraphExecDestroy(g);
    linear_.reset();  // before the handle, the workspace and the stream it uses
    cublasDestroy(cublas_);
    cudaEventDestroy(upload_done_);
    for (cudaEvent_t e : download_done_) cudaEventDestroy(e);
    for (cudaEvent_t e : warm_joins_) cudaEventDestroy(e);
    cudaEventDestroy(warm_fork_);
    cudaStreamDestroy(warm_stream_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::CUDA; }
  int device_id() const override { return device_id_; }
  DType act_dtype() const override { return DType::BF16; }

  void upload(const Tensor& dst, const void* host) override {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` may be reused as soon as we return
  }
  void upload_async(const Tensor& dst, const void* host) override {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(upload_done_, stream_));  // when the DMA has read `host`
  }
  void wait_for_upload_async() override {
    CUDA_CHECK(cudaEventSynchronize(upload_done_));
    // The last replayed pull: its kernel sets the flag once it has read the host memory. It runs as soon as
    // the work queued before its graph is done, so the callers (ModelRunner::upload) find it set or nearly.
    const auto start = std::chrono::steady_clock::now();
    while (*static_cast<volatile int64_t*>(pull_flag_.data()) < pulls_replayed_) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
        const cudaError_t err = cudaStreamQuery(stream_);  // a kernel's fault, if that is why
        if (err != cudaErrorNotReady) CUDA_CHECK(err);
        fail("internal: a CUDA graph's first kernel has not read the step's inputs after 60 s");
      }
      std::this_thread::yield();
    }
  }
  void download_async(void* host, const Tensor& src, int slot) override {
    CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(download_done_[slot], stream_));
  }
  void pull_async(const Tensor& dst, const void* host, const std::vector<ByteRange>& ranges) override {
    if (ranges.empty() || ranges.size() > size_t(kMaxPullRanges)) fail("internal: ", ranges.size(), " ranges to pull");
    PullRanges pr;
    for (const ByteRange& r : ranges) {
      if (r.offset < 0 || r.bytes < 0 || r.offset + r.bytes > int64_t(dst.nbytes()) || r.offset % 4 || r.bytes % 4)
        fail("internal: a pull range [", r.offset, ", +", r.bytes, ") outside ", dst.nbytes(), " bytes or unaligned");
      pr.offsets[pr.count] = r.offset;
      pr.bytes[pr.count++] = r.bytes;
    }
    pull_ranges_cuda(dst.data, host, pr, static_cast<int64_t*>(pull_counter_.data()),
                     static_cast<int64_t*>(pull_flag_.data()), stream_);
    capture_pulls_ = true;
  }
  void push_tokens_async(void* host, int64_t stride, const Tensor& src, const Tensor& slot) override {
    push_tokens_cuda(static_cast<int32_t*>(host), stride, i32(src), i32(slot), int(src.numel()), stream_);
  }
  void record_download_async(int slot) override { CUDA_CHECK(cudaEventRecord(download_done_[slot], stream_)); }
  void wait_for_download_async(int slot) override { CUDA_CHECK(cudaEventSynchronize(download_done_[slot])); }
  void download(void* host, const Tensor& src) override {
    CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void memory_info(size_t* free_bytes, size_t* total_bytes) const override {
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  }

  bool supports_graphs() const override { return true; }
  void begin_capture() override {
    capture_pulls_ = false;
    warm_branches_ = 0;  // none from a capture that ended in an error
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  int end_capture() override {
    // warm_kv_cache's branches end here: the capture must join every stream it forked.
    for (int i = 0; i < warm_branches_; i++) CUDA_CHECK(cudaStreamWaitEvent(stream_, warm_joins_[size_t(i)], 0));
    warm_branches_ = 0;
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    // The kernels after cuBLAS's launched as its blocks start (cuda_utils.h). Not with several ranks: there an
    // early kernel's blocks would hold SM slots, waiting, that a peer's collective (which spins until this
    // rank's joins it) may need when the ranks share a GPU.
    if (group_.size == 1) start_successors_early(graph);
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));  // the executable graph keeps what it needs
    graphs_.push_back(exec);
    graph_pulls_.push_back(capture_pulls_);
    return int(graphs_.size()) - 1;
  }
  void replay(int graph) override {
    CUDA_CHECK(cudaGraphLaunch(graphs_.at(size_t(graph)), stream_));
    pulls_replayed_ += graph_pulls_.at(size_t(graph));
  }

  size_t attention_scratch_bytes(int max_seqs, int max_context_len, const AttentionShape& s) const override {
    return decode_attention_scratch_bytes(max_seqs, max_context_len, s);
  }

  void* stream() const override { return stream_; }

  void embedding(const Tensor& out, const Tensor& table, const Tensor& ids, int vocab_start) override {
    embedding_cuda(b16(out), b16(table), i32(ids), int(ids.numel()), int(table.shape[1]), vocab_start,
                   int(table.shape[0]), stream_);
  }
  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps) override {
    rmsnorm_cuda(b16(out), b16(x), b16(weight), int(x.rows()), int(x.row_size()), eps, stream_);
  }
  void add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& x, const Tensor& weight,
                   float eps) override {
    add_rmsnorm_cuda(b16(out), b16(residual), b16(x), b16(weight), int(x.rows()), int(x.row_size()), eps, stream_);
  }
  void linear(const Tensor& out, const Tensor& x, const Tensor& weight) override {
    assert(x.row_size() == weight.shape[1] && out.row_size() == weight.shape[0]);
    assert(out.dtype == DType::BF16 || out.dtype == DType::F32);
    linear_->run(out.data, out.dtype == DType::F32, b16(x), b16(weight), int(x.rows()), int(weight.shape[1]),
                 int(weight.shape[0]));
  }
  void linear_before_attention(const Tensor& out, const Tensor& x, const Tensor& weight) override {
    // Only where attention's blocks can use the spare SMs: in a graph whose edges out of cuBLAS's kernels
    // start_successors_early moves (end_capture: one rank). Eagerly they would start only after the GEMM.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    const int spare = capture == cudaStreamCaptureStatusActive && group_.size == 1 ? kSpareSmsBeforeAttention : 0;
    linear_->run(out.data, out.dtype == DType::F32, b16(x), b16(weight), int(x.rows()), int(weight.shape[1]),
                 int(weight.shape[0]), spare);
  }
  void qk_norm_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, const Tensor& positions,
                          const Tensor& cos, const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& slot_mapping, const HeadLayout& h, float eps) override {
    qk_norm_rope_store_cuda(b16(qkv), qkv.row_size(), b16(q_norm), b16(k_norm), i32(positions), f32(cos), f32(sin),
                            b16(k_cache), b16(v_cache), i32(slot_mapping), int(qkv.rows()), h.num_heads,
                            h.num_kv_heads, h.head_dim, eps, stream_);
  }
  void attention(const Tensor& out, const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionMetadata& m, const AttentionShape& s) override {
    const int width = int(m.block_tables.shape[1]);
    if (m.is_prefill) {
      prefill_attention_cuda(b16(out), out.row_size(), b16(qkv), qkv.row_size(), b16(k_cache), b16(v_cache),
                             i32(m.cu_seqlens_q), i32(m.cu_seqlens_k), i32(m.block_tables), width, m.num_seqs,
                             m.max_seqlen_q, s, attention_version_, stream_);
    } else {
      decode_attention_cuda(b16(out), out.row_size(), b16(qkv), qkv.row_size(), b16(k_cache), b16(v_cache),
                            i32(m.context_lens), i32(m.block_tables), width, m.num_seqs, m.max_context_len, s,
                            f32(m.scratch), attention_version_, stream_);
    }
  }
  bool fuses_qk_norm_rope_store_attention(const AttentionMetadata& m, const AttentionShape& s) const override {
    // At every decode batch the versions allow: one launch fewer a layer. Measured on the H200
    // (04_model_runner/NOTES.md section 7): first built only for grids of one wave (it lost from 128
    // sequences on then), measured again after v9's later changes it wins at 64-256 sequences too.
    return !m.is_prefill && decode_attention_fuses_qk_norm_rope(attention_version_, s);
  }
  void qk_norm_rope_store_attention(const Tensor& out, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                    const Tensor& positions, const Tensor& cos, const Tensor& sin,
                                    const Tensor& k_cache, const Tensor& v_cache, const HeadLayout& h, float eps,
                                    const AttentionMetadata& m, const AttentionShape& s) override {
    if (!fuses_qk_norm_rope_store_attention(m, s)) {
      Backend::qk_norm_rope_store_attention(out, qkv, q_norm, k_norm, positions, cos, sin, k_cache, v_cache, h, eps, m,
                                            s);
      return;
    }
    const QkNormRopeInputs qk{b16(q_norm), b16(k_norm), f32(cos), f32(sin), i32(positions), i32(m.slot_mapping), eps};
    decode_attention_fused_cuda(b16(out), out.row_size(), b16(qkv), qkv.row_size(), b16(k_cache), b16(v_cache),
                                i32(m.context_lens), i32(m.block_tables), int(m.block_tables.shape[1]), m.num_seqs,
                                m.max_context_len, s, f32(m.scratch), attention_version_, qk, stream_);
  }
  bool fuses_attention_o_proj(const AttentionMetadata& m, const AttentionShape& s) const override {
    // At one decode sequence, where v10's 16 splits would need a combine kernel or v11's cluster: 0.04-0.06 ms
    // a step (05_attention/NOTES.md, "What the splits' merge costs at one to eight sequences"). The norm adds
    // the KV heads' shares from version 8's partials buffer (so only with linear version 8, the default).
    return group_.size == 1 && partials_.data() && s.num_kv_heads <= kWgmmaMaxSplits && !m.is_prefill &&
           decode_attention_o_proj_fits(attention_version_, m.num_seqs, s);
  }
  void attention_o_proj_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden,
                                    const Tensor& attn_out, const Tensor& qkv, const Tensor& q_norm,
                                    const Tensor& k_norm, const Tensor& positions, const Tensor& cos,
                                    const Tensor& sin, const Tensor& k_cache, const Tensor& v_cache,
                                    const HeadLayout& h, float eps, const AttentionMetadata& m,
                                    const AttentionShape& s, const Tensor& o_proj, const Tensor& norm_weight) override {
    const int out_features = int(o_proj.shape[0]);
    if (!fuses_attention_o_proj(m, s) || int64_t(s.num_kv_heads) * out_features * 4 > int64_t(partials_.bytes())) {
      Backend::attention_o_proj_add_rmsnorm(out, residual, hidden, attn_out, qkv, q_norm, k_norm, positions, cos, sin,
                                            k_cache, v_cache, h, eps, m, s, o_proj, norm_weight);
      return;
    }
    float* partials = static_cast<float*>(partials_.data());
    const QkNormRopeInputs qk{b16(q_norm), b16(k_norm), f32(cos), f32(sin), i32(positions), i32(m.slot_mapping), eps};
    decode_attention_o_proj_cuda(partials, b16(o_proj), out_features, b16(attn_out), b16(qkv), qkv.row_size(),
                                 b16(k_cache), b16(v_cache), i32(m.context_lens), i32(m.block_tables),
                                 int(m.block_tables.shape[1]), m.max_context_len, s, f32(m.scratch),
                                 attention_version_, qk, stream_);
    add_rmsnorm_partials_cuda(b16(out), b16(residual), partials, s.num_kv_heads, b16(norm_weight), 1, out_features,
                              eps, stream_);
  }
  // In a captured decode step of kWarmKvMinRows-kWarmKvMaxRows rows with one rank, the next layer's first keys
  // into the L2 (kv_warm_cuda, warm_kv_budget bytes a layer) on a branch of the graph that forks here, after
  // the layer's attention and o_proj, and joins at the graph's end: the projections' chain never waits for it.
  // Measured on an H100 (04_model_runner/NOTES.md, section 19), with v6's weights marked evict-first: the graph
  // step 5% faster at 16 rows and 1.4% at 64 than with no branch, 1.9% faster at 32 than 8 MiB unmarked; the
  // first version 0.6% at 128 and 1.4% slower at 256. Not eagerly, where it was not measured. Not below 16 rows:
  // switched on from 8 or 4 rows, it made those steps 0.03-0.04 and 0.40 ms slower on an H200 (the same section,
  // "The warm as kept, from 8 or 4 rows").
  void warm_kv_cache(const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta) override {
    if (meta.is_prefill || group_.size != 1 || meta.num_seqs < kWarmKvMinRows || meta.num_seqs > kWarmKvMaxRows)
      return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusActive) return;
    if (size_t(warm_branches_) == warm_joins_.size()) {
      cudaEvent_t join;
      CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
      warm_joins_.push_back(join);
    }
    CUDA_CHECK(cudaEventRecord(warm_fork_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(warm_stream_, warm_fork_, 0));
    kv_warm_cuda(b16(k_cache), b16(v_cache), i32(meta.block_tables), i32(meta.context_lens),
                 int(meta.block_tables.shape[1]), meta.num_seqs, int(k_cache.shape[1]),
                 int(k_cache.shape[2] * k_cache.shape[3]), warm_kv_budget(meta.num_seqs),
                 static_cast<unsigned*>(warm_checksum_.data()),
                 warm_stream_);
    CUDA_CHECK(cudaEventRecord(warm_joins_[size_t(warm_branches_++)], warm_stream_));
  }
  void silu_and_mul(const Tensor& out, const Tensor& gate_up) override {
    silu_and_mul_cuda(b16(out), b16(gate_up), int(out.rows()), int(out.row_size()), stream_);
  }
  void linear_add_rmsnorm(const Tensor& out, const Tensor& residual, const Tensor& hidden, const Tensor& x,
                          const Tensor& weight, const Tensor& norm_weight, float eps) override {
    const int n = int(x.rows()), in = int(weight.shape[1]), out_features = int(weight.shape[0]);
    if (partials_.data() && int64_t(kWgmmaMaxSplits) * n * out_features * 4 <= int64_t(partials_.bytes())) {
      float* partials = static_cast<float*>(partials_.data());
      if (const int splits = linear_->run_partials(partials, b16(x), b16(weight), n, in, out_features)) {
        add_rmsnorm_partials_cuda(b16(out), b16(residual), partials, splits, b16(norm_weight), n, out_features, eps,
                                  stream_);
        return;
      }
    }
    Backend::linear_add_rmsnorm(out, residual, hidden, x, weight, norm_weight, eps);
  }
  bool fuses_linear_silu(int64_t num_rows) const override { return linear_->fuses_silu(int(num_rows)); }
  void linear_silu_and_mul(const Tensor& out, const Tensor& gate_up, const Tensor& x, const Tensor& weight) override {
    if (linear_->run_silu(b16(out), b16(x), b16(weight), int(x.rows()), int(weight.shape[1]), int(weight.shape[0])))
      return;
    Backend::linear_silu_and_mul(out, gate_up, x, weight);
  }
  bool fuses_around_linear(int64_t num_rows) const override { return linear_->fuses(int(num_rows)); }
  void rmsnorm_linear(const Tensor& out, const Tensor& x, const Tensor& norm_weight, float eps,
                      const Tensor& weight) override {
    fused_linear(out, x, weight, LinearFusion{LinearInput::RmsNorm, b16(norm_weight), eps, false});
  }
  void linear_add(const Tensor& residual, const Tensor& x, const Tensor& weight) override {
    fused_linear(residual, x, weight, LinearFusion{LinearInput::Plain, nullptr, 0.0f, true});
  }
  void silu_linear_add(const Tensor& residual, const Tensor& gate_up, const Tensor& weight) override {
    fused_linear(residual, gate_up, weight, LinearFusion{LinearInput::SiluAndMul, nullptr, 0.0f, true});
  }
  void gather_rows(const Tensor& out, const Tensor& x, const Tensor& rows) override {
    gather_rows_cuda(b16(out), b16(x), i32(rows), int(rows.numel()), int(x.row_size()), stream_);
  }
  void take_sampled_tokens(const Tensor& ids, const Tensor& tokens, const Tensor& rows) override {
    take_sampled_tokens_cuda(i32(ids), i32(tokens), i32(rows), int(rows.numel()), stream_);
  }
  // The collectives read the peers' copies of a tensor directly: every rank's workspace has the same
  // layout, so a peer's copy is at the same offset in that peer's workspace.
  std::vector<char*> peer_copies(const Tensor& x) const {
    const ptrdiff_t offset = static_cast<char*>(x.data) - group_.workspaces.at(size_t(group_.rank));
    std::vector<char*> copies;
    for (char* base : group_.workspaces) copies.push_back(base + offset);
    return copies;
  }
  void all_reduce(const Tensor& x) override {
    if (group_.size == 1) return;
    std::vector<char*> copies = peer_copies(x);
    group_.cuda->all_reduce(group_.rank, reinterpret_cast<bf16* const*>(copies.data()), x.numel(), stream_);
  }
  void gather(const Tensor& shard, const Tensor& out) override {
    if (group_.size == 1) {  // one rank (or ranks not joined yet): its own columns only
      const size_t cols = size_t(std::min(shard.row_size(), out.row_size()));
      CUDA_CHECK(cudaMemcpy2DAsync(out.data, out.row_size() * 4, shard.data, shard.row_size() * 4, cols * 4,
                                   size_t(out.rows()), cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    std::vector<char*> copies = peer_copies(shard);
    group_.cuda->gather(group_.rank, reinterpret_cast<const float* const*>(copies.data()), int(shard.rows()),
                        int(shard.row_size()), f32(out), int(out.row_size()), stream_);
  }
  void bind_to_thread() override { CUDA_CHECK(cudaSetDevice(device_id_)); }

  void sample(const Tensor& tokens, const Tensor& logits, const Tensor& sampling) override {
    sample_cuda(i32(tokens), f32(logits), int(tokens.numel()), int(logits.row_size()),
                sampling.as<const SamplingRow>(), stream_);
  }
  bool fuses_linear_sample(int64_t num_rows) const override { return linear_->fuses_sample(int(num_rows)); }
  void linear_sample(const Tensor& tokens, const Tensor& logits, const Tensor& x, const Tensor& weight,
                     const Tensor& sampling, bool all_logits) override {
    assert(x.row_size() == weight.shape[1] && logits.row_size() == weight.shape[0] && x.rows() == tokens.numel());
    // (linear_sample_cuda refuses more than kWgmmaSampleMaxRows rows, the keys' size.)
    auto* keys = static_cast<unsigned long long*>(sample_keys_.data());
    linear_sample_cuda(i32(tokens), f32(logits), b16(x), b16(weight), int(x.rows()), int(weight.shape[1]),
                       int(weight.shape[0]), sampling.as<const SamplingRow>(), keys,
                       reinterpret_cast<int*>(keys + kWgmmaSampleMaxRows), all_logits, stream_);
  }

 private:
  // rmsnorm_linear, linear_add and silu_linear_add: y (n, out) = or += the projection of x as `fusion` says.
  void fused_linear(const Tensor& y, const Tensor& x, const Tensor& weight, const LinearFusion& fusion) {
    if (!fuses_around_linear(x.rows()))
      fail("internal: a fused projection of ", x.rows(), " rows, which this linear version does not fuse");
    assert(y.row_size() == weight.shape[0]);
    linear_prefetch_cuda(b16(y), b16(x), b16(weight), int(x.rows()), int(weight.shape[1]), int(weight.shape[0]),
                         fusion, stream_);
  }

  int device_id_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t upload_done_ = nullptr;  // recorded after each upload_async
  cudaEvent_t download_done_[2] = {};  // (2,) by slot: recorded after each download_async or record_download_async
  // The pulls (pull_async): how many the device has run (pull_counter_, device memory) and has told the host
  // (pull_flag_, pinned host memory the pull kernel writes), how many graphs that pull were replayed, and
  // which graphs pull (graph_pulls_, by graph id; capture_pulls_ while one is captured).
  Buffer pull_counter_, pull_flag_;
  Buffer sample_keys_;  // linear_sample: (kWgmmaSampleMaxRows,) u64 keys, then as many i32 flags
  Buffer partials_;     // linear_add_rmsnorm with linear version 8 (empty otherwise)
  int64_t pulls_replayed_ = 0;
  std::vector<bool> graph_pulls_;
  bool capture_pulls_ = false;
  int attention_version_;  // 05_attention/attention.h; kAttentionVersionDefault: each phase's fastest kernel
  cublasHandle_t cublas_ = nullptr;
  Buffer cublas_workspace_;
  std::unique_ptr<CudaLinear> linear_;  // the projections: our kernel, cuBLASLt or cuBLAS by batch size
  std::vector<cudaGraphExec_t> graphs_;
  // warm_kv_cache: the branch's stream, its fork, one join event a branch of the graph being captured (reused
  // from one capture to the next), how many branches that capture has, and the loads' checksum (read by nobody).
  // The budget, bytes a layer: 16 MiB up to 32 rows, 8 MiB above, the best of 8-24 MiB measured at 16, 32 and
  // 64 rows with the projections' weights marked evict-first (v6's copies of W, linear_wgmma.cu).
  static constexpr int kWarmKvMinRows = 16, kWarmKvMaxRows = 128, kWarmKvFewRows = 32;
  static constexpr int64_t kWarmKvFewRowsBytes = int64_t(16) << 20, kWarmKvBytes = int64_t(8) << 20;
  static int64_t warm_kv_budget(int rows) { return rows <= kWarmKvFewRows ? kWarmKvFewRowsBytes : kWarmKvBytes; }
  cudaStream_t warm_stream_ = nullptr;
  cudaEvent_t warm_fork_ = nullptr;
  std::vector<cudaEvent_t> warm_joins_;
  int warm_branches_ = 0;
  Buffer warm_checksum_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_id, int attention_version, int linear_version) {
  if (!cuda_available()) fail("--device cuda: no CUDA device is available");
  return std::make_unique<CudaBackend>(device_id, attention_version,
                                       linear_version < 0 ? kLinearVersionDefault : linear_version);
}

bool cuda_available() { return cuda_device_present(); }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace nanovllm

#else  // built without CUDA

namespace nanovllm {
std::unique_ptr<Backend> make_cuda_backend(int, int, int) {
  fail("--device cuda: this build has no CUDA support (it was built without nvcc)");
}
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
}  // namespace nanovllm

#endif
