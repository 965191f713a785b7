// model_runner.cpp: KV capacity, input preparation, CUDA graphs and the step (nano-vllm: engine/model_runner.py).
#include "04_model_runner/model_runner.h"

#include <algorithm>

#include "01_sequence/base/log.h"

namespace nanovllm {

namespace {

// The CPU has no memory figure as telling as the GPU's: give the KV cache a fixed budget unless the user
// sets --kv-cache-blocks, but always room for one sequence of max_model_len.
constexpr size_t kCpuKvBudgetBytes = size_t(1) << 30;
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
  if (config.device == "cpu" && config.enforce_eager) log("note: --enforce-eager changes nothing on the CPU, which has no CUDA graphs");
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

  // Step inputs: one layout, carved on the device and mirrored on the host (one upload per step).
  step_storage_ = Arena::carve(backend_->device(), [&](Arena& a) {
    step_ = carve_step_tensors(a);
    tokens_ = a.take(DType::I32, {max_seqs_});
  });
  step_staging_ = Arena::carve(Device::CPU, [&](Arena& a) { staged_ = carve_step_tensors(a); });

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
    num_blocks_ = std::max(int(kCpuKvBudgetBytes / kv_block_bytes_), block_table_width_);
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
  kv_storage_ = Buffer(backend_->device(), kv_block_bytes_ * num_blocks_);
  const size_t layer_bytes = kv_block_bytes_ / (2 * mc.num_hidden_layers) * num_blocks_;
  char* base = static_cast<char*>(kv_storage_.data());
  for (int l = 0; l < mc.num_hidden_layers; l++) {
    // kv[0, l] and kv[1, l] of the (2, layers, blocks, block_size, kv_heads, head_dim) allocation.
    const std::initializer_list<int64_t> dims = {num_blocks_, block_size_, heads.num_kv_heads, heads.head_dim};
    k_caches_.emplace_back(base + layer_bytes * l, kv_dtype, backend_->device(), dims);
    v_caches_.emplace_back(base + layer_bytes * (mc.num_hidden_layers + l), kv_dtype, backend_->device(), dims);
  }
}

ModelRunner::StepTensors ModelRunner::carve_step_tensors(Arena& a) const {
  const int64_t T = max_tokens_, B = max_seqs_, W = block_table_width_;
  StepTensors t;
  t.input_ids = a.take(DType::I32, {T});
  t.positions = a.take(DType::I32, {T});
  t.slot_mapping = a.take(DType::I32, {T});
  t.cu_seqlens_q = a.take(DType::I32, {B + 1});
  t.cu_seqlens_k = a.take(DType::I32, {B + 1});
  t.context_lens = a.take(DType::I32, {B});
  t.last_token_rows = a.take(DType::I32, {B});
  t.block_tables = a.take(DType::I32, {B, W});
  t.sampling = a.take(DType::U8, {B, int64_t(sizeof(SamplingRow))});
  return t;
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

namespace {

// Copies `values` into the first values.size() elements of a host tensor; returns that slice (the
// same rows of its device twin are what the model reads).
template <class T>
void stage(const Tensor& host, const std::vector<T>& values) {
  if (values.size() * sizeof(T) > host.nbytes()) fail("internal: step input of ", values.size(), " values overflows its buffer");
  std::copy(values.begin(), values.end(), host.as<T>());
}

}  // namespace

ForwardInputs ModelRunner::upload(const StepInputs& in, int max_context_len) {
  const int T = in.num_tokens(), B = in.num_seqs();
  if (T > max_tokens_ || B > max_seqs_) fail("internal: step of ", T, " tokens / ", B, " sequences exceeds the workspace");
  // Fill the host mirror, then copy it to the device in one transfer.
  stage(staged_.input_ids, in.input_ids);
  stage(staged_.positions, in.positions);
  stage(staged_.slot_mapping, in.slot_mapping);
  stage(staged_.block_tables, in.block_tables);
  stage(staged_.sampling, in.sampling);
  stage(staged_.cu_seqlens_q, in.cu_seqlens_q);
  stage(staged_.cu_seqlens_k, in.cu_seqlens_k);
  stage(staged_.last_token_rows, in.last_token_rows);
  stage(staged_.context_lens, in.context_lens);
  backend_->upload(Tensor(step_storage_.data(), DType::U8, backend_->device(), {int64_t(step_storage_.bytes())}),
                   step_staging_.data());

  ForwardInputs f;
  f.input_ids = step_.input_ids.slice_rows(0, T);
  f.positions = step_.positions.slice_rows(0, T);
  f.last_token_rows = step_.last_token_rows.slice_rows(0, B);
  AttentionMetadata& m = f.attention;
  m.is_prefill = in.is_prefill;
  m.num_seqs = B;
  m.slot_mapping = step_.slot_mapping.slice_rows(0, T);
  m.block_tables = step_.block_tables.slice_rows(0, B);
  m.cu_seqlens_q = step_.cu_seqlens_q.slice_rows(0, B + 1);
  m.cu_seqlens_k = step_.cu_seqlens_k.slice_rows(0, B + 1);
  m.max_seqlen_q = in.max_seqlen_q;
  m.max_seqlen_k = in.max_seqlen_k;
  m.context_lens = step_.context_lens.slice_rows(0, B);
  m.max_context_len = max_context_len;
  m.scratch = Tensor(attention_scratch_.data(), DType::F32, backend_->device(), {int64_t(attention_scratch_.bytes() / 4)});
  return f;
}

std::vector<int> ModelRunner::graph_batch_sizes() const {
  std::vector<int> sizes;
  for (const auto& g : graphs_) sizes.push_back(g.first);
  return sizes;
}

// Padding rows of a CUDA graph batch: slot -1 stores nothing and context 0 attends to nothing.
void ModelRunner::pad_decode(StepInputs& in, int batch_size) const {
  const size_t bs = size_t(batch_size);
  in.input_ids.resize(bs, 0);
  in.positions.resize(bs, 0);
  in.slot_mapping.resize(bs, -1);
  in.context_lens.resize(bs, 0);
  in.block_tables.resize(bs * block_table_width_, -1);
  in.sampling.resize(bs, SamplingRow{0.0f, 0, 1.0f, 0, 0});
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
    StepInputs in;  // a batch of padding rows only
    pad_decode(in, bs);
    // The grid of the decode kernel must cover any context: size it for max_model_len.
    ForwardInputs f = upload(in, max_model_len_);
    execute(f, bs);  // warm-up outside the capture
    backend_->synchronize();
    backend_->begin_capture();
    execute(f, bs);
    graphs_.push_back({bs, backend_->end_capture()});
  }
  backend_->synchronize();
}

void ModelRunner::execute(const ForwardInputs& f, int num_seqs) {
  model_->forward_hidden(*backend_, f, workspace_, k_caches_, v_caches_);
  model_->compute_logits(*backend_, f, workspace_, num_seqs);
  backend_->sample(tokens_.slice_rows(0, num_seqs), workspace_.logits.slice_rows(0, num_seqs),
                   step_.sampling.slice_rows(0, num_seqs));
}

std::vector<int32_t> ModelRunner::run(const std::vector<Sequence*>& seqs, bool is_prefill, std::vector<float>* logits) {
  StepInputs in = is_prefill ? prepare_prefill(seqs) : prepare_decode(seqs);
  const int B = in.num_seqs();
  // Decode replays the CUDA graph of the smallest captured batch that holds B sequences, padded.
  auto graph = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g.first >= B; });
  if (!is_prefill && !enforce_eager_ && graph != graphs_.end()) {
    pad_decode(in, graph->first);
    upload(in, max_model_len_);
    backend_->replay(graph->second);
  } else {
    execute(upload(in, in.max_seqlen_k), B);
  }

  std::vector<int32_t> tokens(static_cast<size_t>(B));
  backend_->download(tokens.data(), tokens_.slice_rows(0, B));
  const Tensor step_logits = workspace_.logits.slice_rows(0, B);
  const bool host_rows = device() == Device::CUDA && cuda_leaves_rows_to_host(in.sampling.data(), B);
  if (logits || host_rows) {
    std::vector<float> host_logits(size_t(step_logits.numel()));
    backend_->download(host_logits.data(), step_logits);
    if (host_rows) sample_rows_left_to_host(tokens.data(), host_logits.data(), B, int(step_logits.row_size()), in.sampling.data());
    if (logits) *logits = std::move(host_logits);
  }
  return tokens;
}

}  // namespace nanovllm
