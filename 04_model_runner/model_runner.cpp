// model_runner.cpp
#include "04_model_runner/model_runner.h"

#include <algorithm>
#include <chrono>

namespace nanovllm {

namespace {

// The CPU has no memory figure as telling as the GPU's: unless the user sets --kv-cache-blocks, give the
// KV cache room for kCpuKvSequences sequences of max_model_len, at most kCpuKvBudgetBytes, but always
// room for one (a tiny model needs a few MiB, not a fixed 1 GiB that a memory limit may not allow).
constexpr size_t kCpuKvBudgetBytes = size_t(1) << 30;
constexpr int kCpuKvSequences = 8;
// GPU memory kept out of the KV cache for what we do not allocate ourselves: CUDA graphs, the CUDA
// context's own growth, cuBLAS internals.
constexpr size_t kGpuReserveBytes = size_t(256) << 20;

}  // namespace

ModelRunner::ModelRunner(EngineConfig& config)
    : block_size_(config.kvcache_block_size),
      enforce_eager_(config.enforce_eager),
      checkpoint_(Checkpoint::open(config.model)) {
  ModelConfig mc = ModelConfig::load(config.model);
  if (config.tensor_parallel_size != 1)
    fail("tensor_parallel_size ", config.tensor_parallel_size, " is not supported yet (1 only)");
  const int tp = 1, tp_rank = 0;

  if (config.device.empty()) config.device = cuda_available() ? "cuda" : "cpu";
  backend_ = config.device == "cuda" ? make_cuda_backend(0) : make_cpu_backend();

  config.max_model_len = std::min(config.max_model_len, mc.max_position_embeddings);
  max_model_len_ = config.max_model_len;
  block_table_width_ = ceil_div(max_model_len_, block_size_);
  max_seqs_ = config.max_num_seqs;
  max_tokens_ = std::max(config.max_num_batched_tokens, config.max_num_seqs);
  if (config.eos.empty()) config.eos.assign(mc.eos_token_ids.begin(), mc.eos_token_ids.end());

  model_ = std::make_unique<Qwen3Model>(mc, load_qwen3_weights(*backend_, checkpoint_, mc, tp_rank, tp), tp_rank, tp);
  workspace_ = make_qwen3_workspace(*backend_, mc, tp, max_tokens_, max_seqs_, max_model_len_);
  const AttentionShape shape = model_->attention_shape(block_size_);
  attention_scratch_ = Buffer(backend_->device(), backend_->attention_scratch_bytes(max_seqs_, max_model_len_, shape));

  // Step inputs on the device.
  const int64_t T = max_tokens_, B = max_seqs_, W = block_table_width_;
  const size_t row_bytes = sizeof(SamplingRow);
  Arena arena(backend_->device(), Arena::aligned(T * 4) * 3 + Arena::aligned((B + 1) * 4) * 2 +
                                       Arena::aligned(B * 4) * 3 + Arena::aligned(B * W * 4) +
                                       Arena::aligned(B * row_bytes));
  input_ids_ = arena.take(DType::I32, {T});
  positions_ = arena.take(DType::I32, {T});
  slot_mapping_ = arena.take(DType::I32, {T});
  cu_seqlens_q_ = arena.take(DType::I32, {B + 1});
  cu_seqlens_k_ = arena.take(DType::I32, {B + 1});
  context_lens_ = arena.take(DType::I32, {B});
  last_token_rows_ = arena.take(DType::I32, {B});
  tokens_ = arena.take(DType::I32, {B});
  block_tables_ = arena.take(DType::I32, {B, W});
  sampling_ = arena.take(DType::U8, {B, int64_t(row_bytes)});
  step_storage_ = std::move(arena.buffer());

  // Everything else is allocated: what is left of the budget becomes the KV cache.
  allocate_kv_cache(config);
  if (backend_->supports_graphs() && !enforce_eager_) capture_cuda_graphs();
}

void ModelRunner::allocate_kv_cache(EngineConfig& config) {
  const ModelConfig& mc = model_->config();
  const HeadLayout heads = model_->heads();
  const DType kv_dtype = backend_->act_dtype();
  // One block: 2 (K and V) x layers x block_size x kv_heads x head_dim elements.
  kv_block_bytes_ = 2 * size_t(mc.num_hidden_layers) * block_size_ * heads.kv_dim() * dtype_size(kv_dtype);
  if (config.num_kvcache_blocks > 0) {
    num_blocks_ = config.num_kvcache_blocks;
  } else if (backend_->device() == Device::CPU) {
    num_blocks_ = std::max(int(std::min(kCpuKvBudgetBytes / kv_block_bytes_, size_t(kCpuKvSequences) * block_table_width_)),
                           block_table_width_);
  } else {
    // nano-vllm: total * utilization - used - (activation peak - current). Our activations are all
    // allocated already (weights, workspace, step inputs, scratch), so their peak is in `used`: the
    // formula is exact, with a small reserve for what CUDA itself allocates later.
    size_t free_bytes, total_bytes;
    backend_->memory_info(&free_bytes, &total_bytes);
    const double budget = double(total_bytes) * config.gpu_memory_utilization - double(total_bytes - free_bytes) -
                          double(kGpuReserveBytes);
    num_blocks_ = budget > 0 ? int(budget / double(kv_block_bytes_)) : 0;
    if (num_blocks_ < 1)
      fail("no GPU memory left for the KV cache (", (total_bytes - free_bytes) >> 20, " MiB in use of ", total_bytes >> 20,
           " MiB; raise --gpu-memory-utilization or lower --max-num-batched-tokens / --max-num-seqs)");
  }
  config.num_kvcache_blocks = num_blocks_;
  try {
    kv_storage_ = Buffer(backend_->device(), kv_block_bytes_ * num_blocks_);
  } catch (const Error&) {
    if (backend_->device() != Device::CPU) throw;
    fail("cannot allocate ", (kv_block_bytes_ * num_blocks_) >> 20, " MiB for the KV cache on the CPU (", num_blocks_,
         " blocks; use --kv-cache-blocks N to use less)");
  }
  const size_t layer_bytes = kv_block_bytes_ / (2 * mc.num_hidden_layers) * num_blocks_;
  char* base = static_cast<char*>(kv_storage_.data());
  for (int l = 0; l < mc.num_hidden_layers; l++) {
    // kv[0, l] and kv[1, l] of the (2, layers, blocks, block_size, kv_heads, head_dim) allocation.
    const std::initializer_list<int64_t> dims = {num_blocks_, block_size_, heads.num_kv_heads, heads.head_dim};
    k_caches_.emplace_back(base + layer_bytes * l, kv_dtype, backend_->device(), dims);
    v_caches_.emplace_back(base + layer_bytes * (mc.num_hidden_layers + l), kv_dtype, backend_->device(), dims);
  }
}

ModelRunner::~ModelRunner() = default;

// ---------------------------------------------------------------------------------------------------
// Input preparation

void ModelRunner::fill_block_tables(StepInputs& in, const std::vector<Sequence*>& seqs) const {
  in.block_tables.assign(seqs.size() * block_table_width_, -1);
  for (size_t b = 0; b < seqs.size(); b++) {
    const std::vector<int>& table = seqs[b]->block_table;
    if (int(table.size()) > block_table_width_)
      fail("sequence ", seqs[b]->seq_id, " holds ", table.size(), " blocks, more than max_model_len allows");
    std::copy(table.begin(), table.end(), in.block_tables.begin() + b * block_table_width_);
  }
}

void ModelRunner::fill_sampling(StepInputs& in, const std::vector<Sequence*>& seqs) const {
  for (const Sequence* seq : seqs) {
    const SamplingParams& p = seq->params;
    // The random stream is indexed by the position of the token being generated.
    in.sampling.push_back({p.temperature, p.top_k, p.top_p, seq->seed, uint64_t(seq->num_tokens())});
  }
}

StepInputs ModelRunner::prepare_prefill(const std::vector<Sequence*>& seqs) const {
  StepInputs in;
  in.is_prefill = true;
  in.cu_seqlens_q.push_back(0);
  in.cu_seqlens_k.push_back(0);
  for (const Sequence* seq : seqs) {
    // This step computes tokens [start, end); attention covers keys [0, end) (nano-vllm #213: not the
    // whole sequence, when this is a chunk).
    const int start = seq->num_cached_tokens, end = start + seq->num_scheduled_tokens;
    for (int pos = start; pos < end; pos++) {
      in.input_ids.push_back(seq->token_ids[pos]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(seq->block_table[pos / block_size_] * block_size_ + pos % block_size_);
    }
    in.cu_seqlens_q.push_back(in.cu_seqlens_q.back() + (end - start));
    in.cu_seqlens_k.push_back(in.cu_seqlens_k.back() + end);
    in.max_seqlen_q = std::max(in.max_seqlen_q, end - start);
    in.max_seqlen_k = std::max(in.max_seqlen_k, end);
    in.last_token_rows.push_back(in.cu_seqlens_q.back() - 1);
  }
  fill_block_tables(in, seqs);
  fill_sampling(in, seqs);
  return in;
}

StepInputs ModelRunner::prepare_decode(const std::vector<Sequence*>& seqs) const {
  StepInputs in;
  in.is_prefill = false;
  for (const Sequence* seq : seqs) {
    // The last token was sampled but not yet computed: it is the input, at position len - 1, and its
    // K/V go to the last slot of the last block. It attends to all len tokens, itself included.
    const int pos = seq->num_tokens() - 1;
    in.input_ids.push_back(seq->last_token);
    in.positions.push_back(pos);
    in.slot_mapping.push_back(seq->block_table[pos / block_size_] * block_size_ + pos % block_size_);
    in.context_lens.push_back(seq->num_tokens());
    in.max_seqlen_k = std::max(in.max_seqlen_k, seq->num_tokens());
  }
  fill_block_tables(in, seqs);
  fill_sampling(in, seqs);
  return in;
}

// ---------------------------------------------------------------------------------------------------
// Running

ForwardInputs ModelRunner::upload(const StepInputs& in, int max_context_len) {
  const int T = in.num_tokens(), B = in.num_seqs();
  if (T > max_tokens_ || B > max_seqs_) fail("internal: step of ", T, " tokens / ", B, " sequences exceeds the workspace");
  ForwardInputs f;
  f.input_ids = input_ids_.slice_rows(0, T);
  f.positions = positions_.slice_rows(0, T);
  f.attention.is_prefill = in.is_prefill;
  f.attention.num_seqs = B;
  f.attention.slot_mapping = slot_mapping_.slice_rows(0, T);
  f.attention.block_tables = block_tables_.slice_rows(0, B);
  f.attention.scratch = Tensor(attention_scratch_.data(), DType::F32, backend_->device(),
                               {int64_t(attention_scratch_.bytes() / 4)});
  backend_->upload(f.input_ids, in.input_ids.data());
  backend_->upload(f.positions, in.positions.data());
  backend_->upload(f.attention.slot_mapping, in.slot_mapping.data());
  backend_->upload(f.attention.block_tables, in.block_tables.data());
  if (in.is_prefill) {
    f.attention.cu_seqlens_q = cu_seqlens_q_.slice_rows(0, B + 1);
    f.attention.cu_seqlens_k = cu_seqlens_k_.slice_rows(0, B + 1);
    f.attention.max_seqlen_q = in.max_seqlen_q;
    f.attention.max_seqlen_k = in.max_seqlen_k;
    f.last_token_rows = last_token_rows_.slice_rows(0, B);
    backend_->upload(f.attention.cu_seqlens_q, in.cu_seqlens_q.data());
    backend_->upload(f.attention.cu_seqlens_k, in.cu_seqlens_k.data());
    backend_->upload(f.last_token_rows, in.last_token_rows.data());
  } else {
    f.attention.context_lens = context_lens_.slice_rows(0, B);
    f.attention.max_context_len = max_context_len;
    backend_->upload(f.attention.context_lens, in.context_lens.data());
  }
  backend_->upload(sampling_.slice_rows(0, B), in.sampling.data());
  return f;
}

std::vector<int> ModelRunner::graph_batch_sizes() const {
  std::vector<int> sizes;
  for (const auto& g : graphs_) sizes.push_back(g.first);
  return sizes;
}

void ModelRunner::capture_cuda_graphs() {
  // nano-vllm's batch sizes 1, 2, 4, 8, 16, 32, ... (multiples of 16), plus max_num_seqs itself so that
  // every decode batch has a graph (nano-vllm crashes when max_num_seqs is not a multiple of 16).
  std::vector<int> sizes;
  for (int bs : {1, 2, 4, 8})
    if (bs < max_seqs_) sizes.push_back(bs);
  for (int bs = 16; bs < max_seqs_; bs += 16) sizes.push_back(bs);
  sizes.push_back(max_seqs_);
  for (int bs : sizes) {
    // Capture on dummy inputs: padding rows (slot -1, context 0) that write nothing and read nothing.
    StepInputs in;
    in.is_prefill = false;
    in.input_ids.assign(size_t(bs), 0);
    in.positions.assign(size_t(bs), 0);
    in.slot_mapping.assign(size_t(bs), -1);
    in.context_lens.assign(size_t(bs), 0);
    in.block_tables.assign(size_t(bs) * block_table_width_, -1);
    in.sampling.assign(size_t(bs), SamplingRow{0.0f, 0, 1.0f, 0, 0});
    // The grid of the decode kernel must cover any context: size it for max_model_len.
    ForwardInputs f = upload(in, max_model_len_);
    model_->forward_hidden(*backend_, f, workspace_, k_caches_, v_caches_);  // warm-up outside the capture
    backend_->synchronize();
    backend_->begin_capture();
    model_->forward_hidden(*backend_, f, workspace_, k_caches_, v_caches_);
    model_->compute_logits(*backend_, f, workspace_, bs);
    backend_->sample(tokens_.slice_rows(0, bs), workspace_.logits.slice_rows(0, bs), sampling_.slice_rows(0, bs));
    graphs_.push_back({bs, backend_->end_capture()});
  }
  backend_->synchronize();
}

void ModelRunner::execute(const ForwardInputs& f, int num_seqs) {
  model_->forward_hidden(*backend_, f, workspace_, k_caches_, v_caches_);
  model_->compute_logits(*backend_, f, workspace_, num_seqs);
  backend_->sample(tokens_.slice_rows(0, num_seqs), workspace_.logits.slice_rows(0, num_seqs),
                   sampling_.slice_rows(0, num_seqs));
}

std::vector<int32_t> ModelRunner::run(const std::vector<Sequence*>& seqs, bool is_prefill, std::vector<float>* logits) {
  StepInputs in = is_prefill ? prepare_prefill(seqs) : prepare_decode(seqs);
  const int B = in.num_seqs();
  // Decode under a CUDA graph: the smallest captured batch that holds B sequences, padded.
  const auto graph = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g.first >= B; });
  if (!is_prefill && graph != graphs_.end()) {
    const int bs = graph->first;
    in.input_ids.resize(size_t(bs), 0);
    in.positions.resize(size_t(bs), 0);
    in.slot_mapping.resize(size_t(bs), -1);    // padding rows store nothing...
    in.context_lens.resize(size_t(bs), 0);     // ...and attend to nothing
    in.block_tables.resize(size_t(bs) * block_table_width_, -1);
    in.sampling.resize(size_t(bs), SamplingRow{0.0f, 0, 1.0f, 0, 0});
    upload(in, max_model_len_);
    backend_->replay(graph->second);
  } else {
    execute(upload(in, in.max_seqlen_k), B);
  }

  std::vector<int32_t> out(size_t(B), 0);
  const Tensor step_logits = workspace_.logits.slice_rows(0, B);
  // Top-k / top-p rows are sampled on the host from the logits (the GPU sampler does greedy and
  // temperature only); the device's tokens for the other rows stand.
  bool host_sampling = false;
  for (int b = 0; b < B; b++) host_sampling |= in.sampling[b].top_k > 0 || in.sampling[b].top_p < 1.0f;
  std::vector<float> host_logits;
  if (logits || host_sampling) {
    host_logits.resize(size_t(step_logits.numel()));
    backend_->download(host_logits.data(), step_logits);
  }
  backend_->download(out.data(), tokens_.slice_rows(0, B));
  if (host_sampling) {
    const int vocab = int(step_logits.row_size());
    for (int b = 0; b < B; b++)
      if (in.sampling[b].top_k > 0 || in.sampling[b].top_p < 1.0f)
        out[b] = sample_row_cpu(host_logits.data() + int64_t(b) * vocab, vocab, in.sampling[b]);
  }
  if (logits) *logits = std::move(host_logits);
  return out;
}

ModelRunner::DecodeStepProfile ModelRunner::profile_decode_step(int batch, int context, int iterations) {
  const int blocks_per_seq = ceil_div(context, block_size_);
  if (batch > max_seqs_) fail("--batch ", batch, " exceeds max_num_seqs ", max_seqs_);
  if (context > max_model_len_) fail("--context ", context, " exceeds max_model_len ", max_model_len_);
  if (int64_t(batch) * blocks_per_seq > num_blocks_)
    fail("batch ", batch, " x context ", context, " needs ", int64_t(batch) * blocks_per_seq, " KV blocks; the cache has ", num_blocks_);
  std::vector<std::unique_ptr<Sequence>> owned;
  std::vector<Sequence*> seqs;
  SamplingParams params;
  params.temperature = 0.6f;
  for (int b = 0; b < batch; b++) {
    owned.push_back(std::make_unique<Sequence>(b, std::vector<int32_t>(size_t(context), 1), params, b, block_size_));
    for (int i = 0; i < blocks_per_seq; i++) owned.back()->block_table.push_back(b * blocks_per_seq + i);
    owned.back()->num_cached_tokens = context - 1;
    owned.back()->num_scheduled_tokens = 1;
    seqs.push_back(owned.back().get());
  }
  auto time_ms = [&](auto&& step) {
    step();  // warm-up
    backend_->synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; i++) step();
    backend_->synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iterations;
  };
  DecodeStepProfile p;
  auto eager_step = [&] {
    StepInputs in = prepare_decode(seqs);
    execute(upload(in, in.max_seqlen_k), batch);
  };
  p.eager_ms = time_ms(eager_step);
  p.graph_ms = time_ms([&] { run(seqs, false); });
  backend_->set_profiling(true);
  for (int i = 0; i < iterations; i++) eager_step();
  p.ops = backend_->profile_report();
  backend_->set_profiling(false);
  for (auto& op : p.ops) op.milliseconds /= iterations, op.calls /= iterations;
  return p;
}

}  // namespace nanovllm
