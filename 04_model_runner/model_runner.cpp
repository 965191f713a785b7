// model_runner.cpp: KV capacity, input preparation, CUDA graphs and the step (nano-vllm: engine/model_runner.py).
#include "04_model_runner/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <climits>
#include <numeric>
#include <utility>

#include "01_sequence/base/log.h"
#include "06_tensor_parallel/all_reduce.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {

namespace {

// GPU memory kept out of the KV cache for what we do not allocate ourselves: CUDA graphs, the CUDA
// context's own growth, cuBLAS internals.
constexpr size_t kGpuReserveBytes = size_t(256) << 20;

// The block manager gives a sequence a block for every token it computes (chapter 03); a table one block
// short would put a token's K/V in a slot read from past the table's end. block_size: the runner's, which
// the slots are computed with.
void check_blocks_hold(const Sequence& seq, int end, int block_size) {
  if (int64_t(seq.block_table.size()) * block_size < end)
    fail("internal: sequence ", seq.seq_id, " computes up to position ", end - 1, " but holds ",
         counted(int64_t(seq.block_table.size()), "block"), " of ", block_size, " tokens");
}

}  // namespace

void check_fits_cuda_kernels(const ModelConfig& mc, const TensorParallelLayout& tp, const std::string& source) {
  const char* why = ", which the CUDA kernels need (--device cpu runs it)";
  if (mc.hidden_size % 8 != 0 || mc.hidden_size > kMaxCudaHidden)
    fail(source, ": hidden_size ", mc.hidden_size, " is not a multiple of 8 up to ", kMaxCudaHidden, why);
  if (tp.intermediate_per_rank % 8 != 0)
    fail(source, ": intermediate_size ", mc.intermediate_size, " is not a multiple of 8 on each of ",
         counted(tp.tp_size, "rank"), why);
  if (mc.head_dim != 64 && mc.head_dim != 128 && mc.head_dim != 256)
    fail(source, ": head_dim ", mc.head_dim, " is not 64, 128 or 256", why);
}

ModelRunner::ModelRunner(EngineConfig& config)
    : block_size_(config.kvcache_block_size),
      enforce_eager_(config.enforce_eager),
      checkpoint_(Checkpoint::open(config.model)) {
  const ModelConfig mc = ModelConfig::load(config.model);
  const TensorParallelLayout tp = tensor_parallel_layout(mc, config.tensor_parallel_size);  // a bad split refused before loading
  const bool event_collectives = settle_config(config, mc);

  // Every rank: its device (rank r on GPU r when there are enough GPUs, else ranks share them), its
  // shard of the weights, its buffers. The KV cache comes last, sized from what is left.
  const int devices = config.device == "cuda" ? cuda_device_count() : 0;
  for (int r = 0; r < config.tensor_parallel_size; r++) {
    ranks_.push_back(std::make_unique<Rank>());
    ranks_.back()->rank = r;
    load_rank(*ranks_.back(), mc, tp, config.device == "cuda" ? r % std::max(devices, 1) : -1, config);
  }
  allocate_kv_cache(config);
  if (device() == Device::CUDA) warm_up_ranks(event_collectives);
  if (ranks_.size() > 1) join_ranks(mc, event_collectives);
  threads_ = std::make_unique<RankThreads>(int(ranks_.size()), [this] {
    if (cpu_comm_) cpu_comm_->abort();
#ifdef NANOVLLM_CUDA
    if (cuda_comm_) cuda_comm_->abort();  // the stream-ordered collectives' ranks wait on the host too
#endif
  });
  rank_steps_.assign(ranks_.size(), 0);
  token_staging_ = Buffer(Device::CPU, 2 * size_t(max_seqs_) * sizeof(int32_t), device() == Device::CUDA);
  if (ranks_[0]->backend->supports_graphs() && !enforce_eager_) capture_cuda_graphs();
}

bool ModelRunner::settle_config(EngineConfig& config, const ModelConfig& mc) {
  config.device = device_or_default(config.device);
  if (config.device == "cpu" && config.enforce_eager) log("note: --enforce-eager changes nothing on the CPU, which has no CUDA graphs");
  if (config.device == "cpu" && (config.attention_version >= 0 || config.linear_version != EngineConfig().linear_version))
    log("note: --attention-version and --linear-version choose CUDA kernels; the CPU runs its reference code");
  // The stream-ordered collectives wait for each other through CUDA events across the ranks' streams,
  // which no rank's own graph can capture: they run eagerly (06_tensor_parallel/all_reduce_events.cu).
  const bool event_collectives = config.device == "cuda" && config.tensor_parallel_size > 1 && config.collectives == "events";
  if (event_collectives && !config.enforce_eager) {
    log("note: --collectives events runs eagerly: CUDA graphs off");
    config.enforce_eager = enforce_eager_ = true;
  } else if (config.collectives == "events" && !event_collectives) {
    log("note: --collectives events changes nothing without several ranks on the GPU");
  }
  config.max_model_len = std::min(config.max_model_len, mc.max_position_embeddings);
  config.max_position_embeddings = mc.max_position_embeddings;
  max_model_len_ = config.max_model_len;
  block_table_width_ = ceil_div(max_model_len_, block_size_);
  max_seqs_ = config.max_num_seqs;
  max_tokens_ = std::max(config.max_num_batched_tokens, config.max_num_seqs);
  if (config.eos.empty()) config.eos.assign(mc.eos_token_ids.begin(), mc.eos_token_ids.end());
  return event_collectives;
}

void ModelRunner::warm_up_ranks(bool event_collectives) {
  // Before the ranks are joined, every rank on its own, collectives off: the prefill warm-up, and with
  // several ranks each decode batch size once. The first call of a kernel or a GEMM shape may set things
  // up on the device (module loading, cuBLAS's first use of an algorithm), and set-up that waits for the
  // device must not happen while a peer spins in a collective waiting for this rank
  // (06_tensor_parallel/all_reduce.h). The stream-ordered collectives never spin, so they need none of
  // the decode runs (their capture runs each batch size first).
  for (auto& r : ranks_) {
    r->backend->bind_to_thread();
    warm_up_prefill(*r);
    if (ranks_.size() > 1 && !event_collectives) {
      for (int bs : graph_sizes()) {
        StepInputs in;
        pad_decode(in, bs);
        execute(*r, upload(*r, in, max_model_len_), bs);
      }
    }
    r->backend->synchronize();  // this rank's set-up done before the next rank's, and before any collective
  }
}

void ModelRunner::join_ranks(const ModelConfig& mc, bool event_collectives) {
  RankGroup group;
  group.size = int(ranks_.size());
  for (auto& r : ranks_) group.workspaces.push_back(static_cast<char*>(r->workspace.storage.data()));
  if (device() == Device::CPU) {
    cpu_comm_ = std::make_unique<CpuCommunicator>(group.size);
    group.cpu = cpu_comm_.get();
  } else {
#ifdef NANOVLLM_CUDA
    std::vector<int> rank_devices;
    for (auto& r : ranks_) rank_devices.push_back(r->backend->device_id());
    // The largest tensor all-reduced: the residual stream of a full step, (max_tokens, hidden).
    cuda_comm_ = std::make_unique<CudaCommunicator>(
        rank_devices, int64_t(max_tokens_) * mc.hidden_size,
        event_collectives ? CudaCommunicator::Collectives::kEvents : CudaCommunicator::Collectives::kSpin);
    group.cuda = cuda_comm_.get();
#else
    (void)mc, (void)event_collectives;
#endif
  }
  for (auto& r : ranks_) {
    group.rank = r->rank;
    r->backend->set_rank_group(group);
  }
}

void ModelRunner::capture_cuda_graphs() {
  // Every rank captures its own graphs on its own thread and stream, one batch size at a time, in
  // lock step: the warm-up run before a capture executes the collectives, so the ranks run it
  // together; and no rank starts the next warm-up (a kernel that spins until its peers join) while a
  // peer may still be instantiating its graph, which can wait for the whole GPU when ranks share one.
  for (int bs : graph_sizes()) {
    threads_->run([&](int r) {  // returns when every rank is done: a barrier
      Rank& rank = *ranks_[size_t(r)];
      rank.backend->bind_to_thread();
      StepInputs in;  // a batch of padding rows only
      pad_decode(in, bs);
      // The grid of the decode kernel must cover any context: size it for max_model_len.
      execute(rank, upload(rank, in, max_model_len_), bs);
      rank.backend->synchronize();
    });
    threads_->run([&](int r) {
      Rank& rank = *ranks_[size_t(r)];
      rank.backend->bind_to_thread();
      capture_cuda_graph(rank, bs);
    });
  }
}

void ModelRunner::load_rank(Rank& r, const ModelConfig& mc, const TensorParallelLayout& tp, int device_id,
                            const EngineConfig& config) {
  r.backend = device_id >= 0 ? make_cuda_backend(device_id, config.attention_version, config.linear_version)
                             : make_cpu_backend();
  if (device_id >= 0) check_fits_cuda_kernels(mc, tp, config.model + "/config.json");
  r.model = std::make_unique<Qwen3Model>(mc, load_qwen3_weights(*r.backend, checkpoint_, mc, tp, r.rank), tp, r.rank);
  const auto fail_for_buffers = [&](const std::string& why) {
    fail("the buffers for steps of up to ", max_tokens_, " tokens and ", max_seqs_, " sequences of up to ",
         max_model_len_, " positions (max_num_batched_tokens, max_num_seqs, max_model_len): ", why);
  };
  // The buffers below grow with the largest step (max_num_batched_tokens rows, max_num_seqs sequences) and
  // the longest sequence (max_model_len: RoPE's table, the block tables), so running out of memory here is
  // the settings' fault, not the model's: the error names them.
  try {
    r.workspace = make_qwen3_workspace(*r.backend, mc, tp, max_tokens_, max_seqs_, max_model_len_);
    const AttentionShape shape = r.model->attention_shape(block_size_);
    r.attention_scratch =
        Buffer(r.backend->device(), r.backend->attention_scratch_bytes(max_seqs_, max_model_len_, shape));
    // Step inputs: one layout, carved on the device and mirrored on the host (one upload per step). For a
    // GPU the host mirror is pinned, so that the upload is a DMA queued on the stream (upload_async), or,
    // in a CUDA graph, read by the graph's first kernel (pull_async).
    r.step_storage = Arena::carve(r.backend->device(), [&](Arena& a) {
      r.step = carve_step_tensors(a);
      r.tokens = a.take(DType::I32, {max_seqs_});
    });
    const bool pinned = r.backend->device() == Device::CUDA;
    r.step_staging = Arena::carve(Device::CPU, [&](Arena& a) { r.staged = carve_step_tensors(a); }, pinned);
  } catch (const Error& e) {
    const std::string what = e.what();  // Buffer's: "out of host/GPU memory ...", "cannot allocate ..."
    if (what.rfind("out of ", 0) != 0 && what.rfind("cannot allocate ", 0) != 0) throw;  // not an allocation's
    fail_for_buffers(what);
  } catch (const std::bad_alloc&) {  // a host-side table on its way to the device (RoPE's)
    fail_for_buffers("out of host memory");
  }
}

void ModelRunner::wrap_backend(const std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)>& wrap) {
  for (auto& r : ranks_) {
    const RankGroup group = r->backend->rank_group();
    r->backend = wrap(std::move(r->backend));
    r->backend->set_rank_group(group);
  }
}

int blocks_that_fit(double budget_bytes, size_t block_bytes) {
  if (!(budget_bytes > 0)) return 0;
  return int(std::min(std::floor(budget_bytes / double(block_bytes)), double(INT_MAX)));
}

void ModelRunner::allocate_kv_cache(EngineConfig& config) {
  const ModelConfig& mc = model_config();
  const HeadLayout heads = ranks_[0]->model->heads();
  const Backend& b0 = *ranks_[0]->backend;
  const DType kv_dtype = b0.act_dtype();
  const int tp_size = int(ranks_.size());
  // One block on one rank: 2 (K and V) x layers x block_size x this rank's kv heads x head_dim elements.
  const size_t rank_block_bytes = 2 * size_t(mc.num_hidden_layers) * block_size_ * heads.kv_dim() * dtype_size(kv_dtype);
  kv_block_bytes_ = rank_block_bytes * size_t(tp_size);
  const bool blocks_given = config.num_kvcache_blocks > 0;  // --kv-cache-blocks
  if (blocks_given) {
    num_blocks_ = config.num_kvcache_blocks;
  } else if (b0.device() == Device::CPU) {
    // The CPU has no memory figure as telling as the GPU's: the KV cache budget there is a stated size,
    // --cpu-memory-mib (EngineConfig::cpu_memory_mib, 512 MiB by default: a CPU run is for tiny models), put
    // through the GPU's formula, so --gpu-memory-utilization changes it too; but always room for one sequence
    // of max_model_len (--kv-cache-blocks, above, overrides it).
    const double budget = double(config.cpu_memory_mib) * (1 << 20) * config.gpu_memory_utilization - double(allocated_bytes());
    num_blocks_ = std::max(blocks_that_fit(budget, kv_block_bytes_), block_table_width_);
  } else {
    // nano-vllm: total * utilization - used - (activation peak - current). Our activations are all
    // allocated already (weights, workspace, step inputs, scratch), so their peak is in `used`: the
    // formula is exact, with a small reserve for what CUDA itself allocates later (and, with several ranks,
    // the all-reduce's buffer, (max_tokens, hidden) bf16 a rank, allocated after: 32 MiB for Qwen3-0.6B).
    // Ranks that share a GPU share its budget; every rank gets the same number of blocks (the smallest that
    // fits).
    num_blocks_ = -1;
    for (auto& r : ranks_) {
      r->backend->bind_to_thread();  // memory_info reports the current device: this rank's
      int sharing = 0;
      for (auto& other : ranks_) sharing += other->backend->device_id() == r->backend->device_id();
      size_t free_bytes, total_bytes;
      r->backend->memory_info(&free_bytes, &total_bytes);
      const double budget = double(total_bytes) * config.gpu_memory_utilization - double(total_bytes - free_bytes) -
                            double(kGpuReserveBytes);
      const int blocks = blocks_that_fit(budget, rank_block_bytes * size_t(sharing));
      if (blocks < 1)
        fail("no GPU memory left for the KV cache (", (total_bytes - free_bytes) >> 20, " MiB in use of ",
             total_bytes >> 20, " MiB; raise --gpu-memory-utilization or lower --max-num-batched-tokens / --max-num-seqs)");
      num_blocks_ = num_blocks_ < 0 ? blocks : std::min(num_blocks_, blocks);
    }
  }
  config.num_kvcache_blocks = num_blocks_;
  const size_t layer_bytes = rank_block_bytes / (2 * mc.num_hidden_layers) * num_blocks_;
  for (auto& r : ranks_) {
    r->backend->bind_to_thread();  // a Buffer is allocated on the current device: this rank's
    try {
      r->kv_storage = Buffer(r->backend->device(), rank_block_bytes * num_blocks_);
    } catch (const Error&) {
      if (r->backend->device() != Device::CPU) throw;
      // The CPU's cache holds at least one sequence of max_model_len, however small its budget.
      if (blocks_given || num_blocks_ > block_table_width_)
        fail("cannot allocate ", (kv_block_bytes_ * num_blocks_) >> 20, " MiB for the KV cache on the CPU (", num_blocks_,
             " blocks; use --kv-cache-blocks N to use less)");
      fail("cannot allocate ", (kv_block_bytes_ * num_blocks_) >> 20, " MiB for the KV cache on the CPU (", num_blocks_,
           " blocks, one sequence of max_model_len ", max_model_len_, "; use --max-model-len N to use less)");
    }
    char* base = static_cast<char*>(r->kv_storage.data());
    for (int l = 0; l < mc.num_hidden_layers; l++) {
      // kv[0, l] and kv[1, l] of the (2, layers, blocks, block_size, kv_heads, head_dim) allocation.
      const std::initializer_list<int64_t> dims = {num_blocks_, block_size_, heads.num_kv_heads, heads.head_dim};
      r->k_caches.emplace_back(base + layer_bytes * l, kv_dtype, r->backend->device(), dims);
      r->v_caches.emplace_back(base + layer_bytes * (mc.num_hidden_layers + l), kv_dtype, r->backend->device(), dims);
    }
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
  t.input_rows = a.take(DType::I32, {B});
  t.token_slot = a.take(DType::I32, {1});
  return t;
}

ModelRunner::~ModelRunner() = default;

size_t ModelRunner::allocated_bytes() const {
  size_t bytes = 0;
  for (const auto& r : ranks_)
    bytes += r->model->weight_bytes() + r->workspace.storage.bytes() + r->attention_scratch.bytes() +
             r->step_storage.bytes() + r->step_staging.bytes() + r->kv_storage.bytes();
  return bytes;
}

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
    check_blocks_hold(*seq, end, block_size_);
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
    check_blocks_hold(*seq, pos + 1, block_size_);
    in.input_ids.push_back(seq->last_token);
    in.positions.push_back(pos);
    in.slot_mapping.push_back(seq->block_table[pos / block_size_] * block_size_ + pos % block_size_);
    in.context_lens.push_back(seq->num_tokens());
    in.input_rows.push_back(-1);  // launch() gives the rows of tokens still on the device
    in.max_seqlen_k = std::max(in.max_seqlen_k, seq->num_tokens());
  }
  fill_block_tables(in, seqs);
  fill_sampling(in, seqs);
  return in;
}

// ---------------------------------------------------------------------------------------------------
// Running

namespace {

// Copies `values` into the first values.size() elements of a host tensor (the same elements of its device
// twin are what the model reads once uploaded).
template <class T>
void stage(const Tensor& host, const std::vector<T>& values) {
  if (values.size() * sizeof(T) > host.nbytes()) fail("internal: step input of ", values.size(), " values overflows its buffer");
  std::copy(values.begin(), values.end(), host.as<T>());
}

}  // namespace

void ModelRunner::stage_inputs(Rank& r, const StepInputs& in) {
  const int T = in.num_tokens(), B = in.num_seqs();
  if (T > max_tokens_ || B > max_seqs_) fail("internal: step of ", T, " tokens / ", B, " sequences exceeds the workspace");
  // The device reads the mirror after this returns (a DMA from pinned memory, or a graph's first kernel),
  // so the last step's read may not be done: wait for it before writing. In a step this wait returns at
  // once or nearly: the read was queued before the last step's forward pass, and either that step's tokens
  // have been collected (the plain loop), or the device is running that step (the overlapped loop: its
  // step before was collected), or it was launched just now on an idle device. It matters where uploads
  // follow each other with no synchronisation between them: the constructor's warm-up of every batch size
  // before the ranks are joined.
  r.backend->wait_for_upload_async();
  stage(r.staged.input_ids, in.input_ids);
  stage(r.staged.positions, in.positions);
  stage(r.staged.slot_mapping, in.slot_mapping);
  stage(r.staged.block_tables, in.block_tables);
  stage(r.staged.sampling, in.sampling);
  stage(r.staged.cu_seqlens_q, in.cu_seqlens_q);
  stage(r.staged.cu_seqlens_k, in.cu_seqlens_k);
  stage(r.staged.last_token_rows, in.last_token_rows);
  stage(r.staged.context_lens, in.context_lens);
  stage(r.staged.input_rows, in.input_rows);
}

std::vector<Backend::ByteRange> ModelRunner::decode_step_ranges(const Rank& r, int bs) const {
  const char* base = static_cast<const char*>(r.step_storage.data());
  std::vector<Backend::ByteRange> ranges;
  auto rows = [&](const Tensor& t, int64_t n) {
    ranges.push_back({static_cast<const char*>(t.data) - base, int64_t(t.slice_rows(0, n).nbytes())});
  };
  const StepTensors& t = r.step;
  for (const Tensor* x : {&t.input_ids, &t.positions, &t.slot_mapping, &t.context_lens, &t.last_token_rows,
                          &t.block_tables, &t.sampling, &t.input_rows})
    rows(*x, bs);
  rows(t.cu_seqlens_q, bs + 1);
  rows(t.cu_seqlens_k, bs + 1);
  rows(t.token_slot, 1);
  return ranges;
}

Tensor ModelRunner::mirrored_step_bytes(const Rank& r) {
  // The mirror's bytes, not the device buffer's: the device layout is the mirror's followed by the
  // sampled tokens, which have no host twin (copying the device size read past the mirror's end).
  return Tensor(r.step_storage.data(), DType::U8, r.backend->device(), {int64_t(r.step_staging.bytes())});
}

ForwardInputs ModelRunner::upload(Rank& r, const StepInputs& in, int max_context_len) {
  const int T = in.num_tokens(), B = in.num_seqs();
  stage_inputs(r, in);
  r.backend->upload_async(mirrored_step_bytes(r), r.step_staging.data());

  ForwardInputs f;
  f.input_ids = r.step.input_ids.slice_rows(0, T);
  f.positions = r.step.positions.slice_rows(0, T);
  f.last_token_rows = r.step.last_token_rows.slice_rows(0, B);
  AttentionMetadata& m = f.attention;
  m.is_prefill = in.is_prefill;
  m.num_seqs = B;
  m.slot_mapping = r.step.slot_mapping.slice_rows(0, T);
  m.block_tables = r.step.block_tables.slice_rows(0, B);
  m.cu_seqlens_q = r.step.cu_seqlens_q.slice_rows(0, B + 1);
  m.cu_seqlens_k = r.step.cu_seqlens_k.slice_rows(0, B + 1);
  m.max_seqlen_q = in.max_seqlen_q;
  m.context_lens = r.step.context_lens.slice_rows(0, B);
  m.max_context_len = max_context_len;
  m.scratch = Tensor(r.attention_scratch.data(), DType::F32, r.backend->device(), {int64_t(r.attention_scratch.bytes() / 4)});
  return f;
}

std::vector<int> ModelRunner::graph_batch_sizes() const {
  std::vector<int> sizes;
  for (const auto& g : ranks_[0]->graphs) sizes.push_back(g.first);
  return sizes;
}

const std::pair<int, int>* ModelRunner::graph_for(const Rank& r, int num_seqs) const {
  for (const auto& g : r.graphs)
    if (g.first >= num_seqs) return &g;
  return nullptr;
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
  in.input_rows.resize(bs, -1);
}

std::vector<int> ModelRunner::prefill_warm_up_sizes() const {
  // Sequences of up to max_model_len tokens, at most max_seqs of them, each in blocks of its own.
  const int per_seq_blocks = ceil_div(max_model_len_, block_size_);
  const int64_t fit_seqs = std::min<int64_t>(max_seqs_, num_blocks_ / std::max(per_seq_blocks, 1));
  int64_t most = std::min<int64_t>(max_tokens_, fit_seqs * max_model_len_);
  if (fit_seqs == 0) most = std::min<int64_t>(max_tokens_, int64_t(num_blocks_) * block_size_);  // one shorter sequence
  std::vector<int> sizes;
  for (int64_t t = 2 * int64_t(kTunedMaxRows); t < most; t *= 2) sizes.push_back(int(t));
  if (most > kTunedMaxRows) sizes.push_back(int(most));
  return sizes;
}

void ModelRunner::warm_up_prefill(Rank& r) {
  // As nano-vllm's warmup_model: sequences of token 0, each scheduled whole, through prepare_prefill; here
  // each holds KV blocks of its own (nothing holds any yet) and greedy sampling, its token dropped.
  SamplingParams greedy;
  greedy.temperature = 0;
  for (int tokens : prefill_warm_up_sizes()) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<Sequence*> batch;
    int next_block = 0;
    for (int start = 0; start < tokens; start += max_model_len_) {
      const int len = std::min(max_model_len_, tokens - start);
      seqs.push_back(std::make_unique<Sequence>(int64_t(seqs.size()), std::vector<int32_t>(size_t(len), 0), greedy,
                                                0, block_size_));
      for (int b = 0; b < ceil_div(len, block_size_); b++) seqs.back()->block_table.push_back(next_block++);
      seqs.back()->num_scheduled_tokens = len;
      batch.push_back(seqs.back().get());
    }
    const StepInputs in = prepare_prefill(batch);
    execute(r, upload(r, in, in.max_seqlen_k), in.num_seqs());
  }
}

std::vector<int> ModelRunner::graph_sizes() const {
  std::vector<int> sizes;
  for (int bs : {1, 2, 4, 8})
    if (bs < max_seqs_) sizes.push_back(bs);
  for (int bs = 16; bs < max_seqs_; bs += 16) sizes.push_back(bs);
  sizes.push_back(max_seqs_);
  return sizes;
}

void ModelRunner::capture_cuda_graph(Rank& r, int bs) {
  StepInputs in;  // a batch of padding rows only; the inputs of a replay are uploaded into the same buffers
  pad_decode(in, bs);
  ForwardInputs f = upload(r, in, max_model_len_);
  // The graph brings its own inputs and takes its own tokens: its first kernel reads the step tensors it
  // uses from the host mirror, its last writes the sampled tokens to token_staging_ (rank 0), so that no
  // copy runs between two replays (04_model_runner/NOTES.md section 3, "The step's inputs read by the graph").
  r.backend->begin_capture();
  r.backend->pull_async(mirrored_step_bytes(r), r.step_staging.data(), decode_step_ranges(r, bs));
  execute(r, f, bs);
  if (r.rank == 0) r.backend->push_tokens_async(token_staging_.data(), max_seqs_, r.tokens.slice_rows(0, bs), r.step.token_slot);
  r.graphs.push_back({bs, r.backend->end_capture()});
  r.backend->synchronize();  // idle before the next batch size, which the ranks capture in lock step
}

void ModelRunner::execute(Rank& r, const ForwardInputs& f, int num_seqs) {
  // A decode step's input tokens that were still on the device when it was queued (input_rows; in a CUDA
  // graph this kernel runs at every replay, a no-op where every row is -1).
  if (!f.attention.is_prefill)
    r.backend->take_sampled_tokens(f.input_ids, r.tokens, r.step.input_rows.slice_rows(0, f.input_ids.numel()));
  r.model->forward_hidden(*r.backend, f, r.workspace, r.k_caches, r.v_caches);
  // One rank whose backend has the LM head with the sampler in its kernel for this many rows: the tokens
  // come straight from the hidden states (the logits are written only where download_logits asks again).
  if (r.model->samples_in_lm_head(*r.backend, num_seqs)) {
    r.model->sample_in_lm_head(*r.backend, f, r.workspace, r.tokens.slice_rows(0, num_seqs),
                               r.step.sampling.slice_rows(0, num_seqs), num_seqs);
    return;
  }
  r.model->compute_logits(*r.backend, f, r.workspace, num_seqs);
  if (r.rank == 0)  // rank 0 samples from the gathered logits (nano-vllm: the sampler runs on rank 0)
    r.backend->sample(r.tokens.slice_rows(0, num_seqs), r.workspace.logits.slice_rows(0, num_seqs),
                      r.step.sampling.slice_rows(0, num_seqs));
}

std::vector<int32_t> ModelRunner::run(const std::vector<Sequence*>& seqs, bool is_prefill, std::vector<float>* logits) {
  launch(seqs, is_prefill);
  std::vector<int32_t> tokens = collect();
  if (logits) download_logits(int(seqs.size()), logits);
  return tokens;
}

void ModelRunner::download_logits(int num_seqs, std::vector<float>* logits) {
  if (!in_flight_.empty()) fail("internal: logits asked for while a later step is in flight");
  Rank& r0 = *ranks_[0];
  const Tensor step_logits = r0.workspace.logits.slice_rows(0, num_seqs);
  if (collected_order_.size() != size_t(num_seqs))
    fail("internal: logits of ", num_seqs, " rows asked for a step of ", collected_order_.size());
  // A step sampled in the LM head's kernel wrote no logits: the same kernel writes them now from the
  // hidden states the step left (nothing has run since), the same products its tokens came from.
  if (collected_sampled_in_lm_head_)
    r0.model->logits_of_sampled_step(*r0.backend, collected_is_prefill_, r0.workspace, r0.tokens.slice_rows(0, num_seqs),
                                     r0.step.sampling.slice_rows(0, num_seqs), num_seqs);
  logits->resize(size_t(step_logits.numel()));
  // A permutation is the identity exactly when it is sorted: a prefill, or a decode batch already longest
  // first, needs no reordering.
  if (std::is_sorted(collected_order_.begin(), collected_order_.end())) {
    r0.backend->download(logits->data(), step_logits);
    return;
  }
  std::vector<float> device_rows(size_t(step_logits.numel()));
  r0.backend->download(device_rows.data(), step_logits);
  const size_t vocab = device_rows.size() / size_t(num_seqs);  // num_seqs > 0: the order is not the identity
  for (size_t i = 0; i < collected_order_.size(); i++)  // back in the caller's order
    std::copy_n(device_rows.begin() + ptrdiff_t(i * vocab), vocab,
                logits->begin() + ptrdiff_t(size_t(collected_order_[i]) * vocab));
}

namespace {

// The order in which a step's sequences become the device's rows: row i is seqs[order[i]]. A decode step
// runs longest context first. Decode attention gives each (sequence, KV head) one block over its whole
// context, taken in row order, several waves of them at 33-112 sequences; longest first, the grid's last
// blocks are its shortest, and the SMs run out of work together (longest-processing-time-first list
// scheduling; 04_model_runner/NOTES.md, section 12). Every row's result is its own, so every token is the
// same in any order. A prefill keeps the caller's order.
std::vector<int> device_order(const std::vector<Sequence*>& seqs, bool is_prefill) {
  std::vector<int> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  if (!is_prefill)
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return seqs[size_t(a)]->num_tokens() > seqs[size_t(b)]->num_tokens(); });
  return order;
}

}  // namespace

void ModelRunner::launch(const std::vector<Sequence*>& seqs, bool is_prefill, const std::vector<int32_t>& input_rows) {
  const auto t_start = std::chrono::steady_clock::now();
  if (in_flight_.size() >= 2) fail("internal: a third step launched before the first was collected");
  std::vector<int> order = device_order(seqs, is_prefill);
  std::vector<Sequence*> rows;
  for (int i : order) rows.push_back(seqs[size_t(i)]);
  StepInputs in = is_prefill ? prepare_prefill(rows) : prepare_decode(rows);
  const int B = in.num_seqs();
  if (!input_rows.empty()) {
    if (is_prefill || input_rows.size() != size_t(B) || ranks_.size() > 1 || in_flight_.empty())
      fail("internal: input rows for a prefill, a batch of another size, several ranks, or no step before");
    // input_rows are rows of the step in flight in the caller's order; its tokens are in its device order.
    const std::vector<int>& before = in_flight_.back().order;
    std::vector<int32_t> device_row(before.size());
    for (size_t i = 0; i < before.size(); i++) device_row[size_t(before[i])] = int32_t(i);
    for (int i = 0; i < B; i++) {
      const int32_t row = input_rows[size_t(order[size_t(i)])];
      if (row < 0 || size_t(row) >= before.size()) fail("internal: input row ", row, " outside the step before");
      in.input_rows[size_t(i)] = device_row[size_t(row)];
    }
  }
  // Decode replays the CUDA graph of the smallest captured batch that holds B sequences: its inputs are
  // padded to that batch in place (B keeps the real count).
  const std::pair<int, int>* graph = is_prefill || enforce_eager_ ? nullptr : graph_for(*ranks_[0], B);
  if (graph) pad_decode(in, graph->first);
  // The slot for this step's tokens: the one the step in flight (if any) is not using.
  const int slot = in_flight_.empty() ? 0 : 1 - in_flight_.back().slot;
  // Every rank runs the same step on its own thread (nano-vllm: rank 0 calls "run" on every worker).
  threads_->run([&](int rank) {
    Rank& r = *ranks_[size_t(rank)];
    r.backend->bind_to_thread();
    if (graph) {  // the graph reads the mirror and writes the tokens to the slot itself
      stage_inputs(r, in);
      *r.staged.token_slot.as<int32_t>() = slot;
      r.backend->replay(graph_for(r, B)->second);
      if (rank == 0) r.backend->record_download_async(slot);
    } else {
      execute(r, upload(r, in, in.max_seqlen_k), B);
      if (rank == 0)  // queued after the step: the tokens land in the slot when the step is done
        r.backend->download_async(static_cast<int32_t*>(token_staging_.data()) + size_t(slot) * max_seqs_, r.tokens.slice_rows(0, B), slot);
    }
    if (rank != 0) r.backend->synchronize();  // the step's collectives finish before the job does
    rank_steps_[size_t(rank)]++;
  });
  // Which way the step samples (execute): decided by the rows the step computes, the graph's when it replays one.
  const bool sampled_in_lm_head = ranks_[0]->model->samples_in_lm_head(*ranks_[0]->backend, graph ? graph->first : B);
  in_flight_.push_back({B, slot, std::move(order), is_prefill, sampled_in_lm_head});
  last_run_times_.queue_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
}

std::vector<int32_t> ModelRunner::collect() {
  if (in_flight_.empty()) fail("internal: collect() with no step in flight");
  const auto t_start = std::chrono::steady_clock::now();
  InFlight step = std::move(in_flight_.front());  // its order is kept below for download_logits
  in_flight_.pop_front();
  ranks_[0]->backend->wait_for_download_async(step.slot);
  const int32_t* slot = static_cast<int32_t*>(token_staging_.data()) + size_t(step.slot) * max_seqs_;
  std::vector<int32_t> tokens(size_t(step.num_seqs));
  for (size_t i = 0; i < tokens.size(); i++) tokens[size_t(step.order[i])] = slot[i];  // back in the caller's order
  collected_order_ = std::move(step.order);
  collected_is_prefill_ = step.is_prefill, collected_sampled_in_lm_head_ = step.sampled_in_lm_head;
  last_run_times_.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return tokens;
}

}  // namespace nanovllm
