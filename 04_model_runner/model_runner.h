// model_runner.h: turns a scheduled batch of sequences into the model's inputs, runs the model, samples
// (nano-vllm: engine/model_runner.py; article, "fifth stop").
//
// At start-up it loads the weights, allocates the activation workspace, and gives everything that is
// left of the memory budget to the paged KV cache: one allocation shaped
//   (2, num_layers, num_blocks, block_size, num_kv_heads, head_dim)
// carved per layer into k_cache = kv[0, layer] and v_cache = kv[1, layer].
//
// Each step, prepare_prefill / prepare_decode build the flat inputs from the sequences' counters and
// block tables: token ids and positions of the tokens to compute, the slot each one's K/V goes to
// (slot = block_table[pos / block_size] * block_size + pos % block_size), and for attention the
// cumulative query/key lengths (prefill) or context lengths (decode) and the block tables.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "01_sequence/engine_config.h"
#include "01_sequence/sequence.h"
#include "04_model_runner/qwen3.h"
#include "06_tensor_parallel/communicator.h"
#include "06_tensor_parallel/rank_threads.h"

namespace nanovllm {

// One step's inputs, built on the host. Shapes: T tokens, B sequences, W = block table width.
struct StepInputs {
  bool is_prefill = false;
  std::vector<int32_t> input_ids;        // (T,)
  std::vector<int32_t> positions;        // (T,) absolute positions in their sequences
  std::vector<int32_t> slot_mapping;     // (T,)
  std::vector<int32_t> cu_seqlens_q;     // (B + 1,) prefill
  std::vector<int32_t> cu_seqlens_k;     // (B + 1,) prefill
  std::vector<int32_t> context_lens;     // (B,) decode
  std::vector<int32_t> block_tables;     // (B, W) row-major, -1 padded
  std::vector<int32_t> last_token_rows;  // (B,) prefill: row of each sequence's last token
  std::vector<int32_t> input_rows;       // (B,) decode: the row of the step before's sampled tokens that is
                                         // this row's input token, or -1: input_ids has it (Backend::take_sampled_tokens)
  std::vector<SamplingRow> sampling;     // (B,)
  // The most tokens a sequence computes in this step (prefill; 0 in decode), and the most keys it attends
  // to (prefill: its computed tokens and this chunk; decode: its context, which bounds decode's launch).
  int max_seqlen_q = 0, max_seqlen_k = 0;
  int num_seqs() const { return int(sampling.size()); }
  int num_tokens() const { return int(input_ids.size()); }
};

// The CUDA kernels' limits on a model's shape (04_model_runner/layers.h, 05_attention): hidden_size and
// each rank's intermediate width multiples of 8 (16-byte copies), hidden_size at most kMaxCudaHidden (a row
// kernel's 128 threads hold 8 chunks of 8 each), head_dim 64, 128 or 256. Throws Error naming `source`
// (config.json) and the field; the model runner calls it before loading onto a GPU.
constexpr int kMaxCudaHidden = 8192;
void check_fits_cuda_kernels(const ModelConfig& mc, const TensorParallelLayout& tp, const std::string& source);

// How many KV blocks of block_bytes a memory budget holds: 0 for a budget of 0 or less (or NaN), at most
// INT_MAX, since block counts are ints (a budget of terabytes over blocks of a few KB is more, and the
// cast wrapped to a small pool). allocate_kv_cache sizes the cache with it on the CPU and on the GPU.
int blocks_that_fit(double budget_bytes, size_t block_bytes);

class ModelRunner {
 public:
  // Loads config.model onto config.device, split over config.tensor_parallel_size ranks. Sets
  // config.num_kvcache_blocks (unless the user fixed it) and clamps config.max_model_len to the model's
  // max_position_embeddings, as nano-vllm's Config does. Also: resolves an empty config.device
  // (device_or_default), turns config.enforce_eager on for --collectives events with several GPU ranks,
  // sets config.max_position_embeddings, and fills config.eos from the model when it is empty. Throws Error
  // for an unreadable or unsupported checkpoint, a split that cannot work, and settings memory cannot hold.
  explicit ModelRunner(EngineConfig& config);
  ~ModelRunner();

  // Runs one scheduled step and returns the sampled token of each sequence (for a prefill chunk that
  // does not finish its prompt, a token the scheduler will discard; -1 for a sequence whose logits hold
  // a NaN or have no finite maximum: -Inf entries alone are masked, not an error). If `logits` is given
  // it receives the (B, vocab) logits the tokens were sampled from.
  std::vector<int32_t> run(const std::vector<Sequence*>& seqs, bool is_prefill, std::vector<float>* logits = nullptr);
  // run() in its two halves, for the overlapped loop (LLMEngine::step): launch prepares and queues a step
  // and the copy of its tokens to the host (on a GPU it returns while the device works); collect waits for
  // the tokens of the oldest step launched and not collected. At most two steps are in flight. For a decode
  // step launched before the tokens of the step before reached the host, input_rows (B,) gives, for each
  // sequence, the row of that step's batch whose sampled token is its input (its last token on the host is
  // kPendingToken); one rank only (the other ranks have no sampled tokens).
  // The device may run the sequences in another order (device_order in model_runner.cpp); launch, collect and
  // download_logits speak of rows in the caller's order.
  void launch(const std::vector<Sequence*>& seqs, bool is_prefill, const std::vector<int32_t>& input_rows = {});
  std::vector<int32_t> collect();
  // The (num_seqs, vocab) logits of the last step collected, when no step has been launched since.
  void download_logits(int num_seqs, std::vector<float>* logits);
  // Where the last run() spent its time on the host: preparing the step's inputs and queuing the work
  // (uploads, the graph or the kernels; on a GPU the device starts meanwhile), then waiting for the
  // sampled tokens (on a GPU, mostly the device finishing; on the CPU, nothing: the work ran in the first).
  // With launch and collect called apart (the overlapped loop): the last launch's queuing and the last
  // collect's wait, usually of different steps.
  struct RunTimes {
    double queue_seconds = 0, wait_seconds = 0;
  };
  const RunTimes& last_run_times() const { return last_run_times_; }

  // The step's inputs from the scheduled sequences, each with num_scheduled_tokens set and a block table
  // covering every token it computes. Prefill: the tokens [num_cached_tokens, + num_scheduled_tokens) of
  // each, cu_seqlens_q/k and last_token_rows (context_lens and input_rows empty). Decode: each sequence's
  // last token, context_lens, and input_rows all -1 (launch fills them for a step scheduled ahead);
  // cu_seqlens and last_token_rows empty. Both: block_tables and sampling.
  StepInputs prepare_prefill(const std::vector<Sequence*>& seqs) const;
  StepInputs prepare_decode(const std::vector<Sequence*>& seqs) const;

  const ModelConfig& model_config() const { return ranks_[0]->model->config(); }
  Device device() const { return ranks_[0]->backend->device(); }
  int num_kvcache_blocks() const { return num_blocks_; }
  size_t kv_cache_bytes() const { return kv_block_bytes_ * size_t(num_blocks_); }  // all ranks together
  size_t kv_block_bytes() const { return kv_block_bytes_; }                       // all ranks together
  // Decode batch sizes with a captured CUDA graph (empty on the CPU or with --enforce-eager).
  std::vector<int> graph_batch_sizes() const;
  // Steps each rank has run: with tensor parallelism every rank runs every step (generate's summary prints
  // them, "steps run by each").
  const std::vector<int64_t>& rank_steps() const { return rank_steps_; }
  // The prefill sizes the GPU warm-up runs (warm_up_prefill): 1024, 2048, ... below the largest prefill
  // the workspace and the KV cache hold (max_num_batched_tokens tokens, in sequences of at most
  // max_model_len, at most max_num_seqs of them, each in blocks of its own), then that largest one; none
  // when it is kTunedMaxRows (512) or less.
  std::vector<int> prefill_warm_up_sizes() const;
  // The decode batch sizes a GPU runner captures a graph of (capture_cuda_graphs): nano-vllm's 1, 2, 4, 8
  // and multiples of 16, those below max_num_seqs, then max_num_seqs itself; increasing, no size twice.
  std::vector<int> graph_sizes() const;

  // For tools (bench --profile, bench-step): wrap every rank's backend (a profiler forwarding every
  // operation; called once per rank, rank 0 first), and switch graph replay off and on (graphs captured
  // at start-up stay).
  void wrap_backend(const std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)>& wrap);
  void set_enforce_eager(bool eager) { enforce_eager_ = eager; }

 private:
  // The step inputs in memory, on the device and mirrored on the host with the same layout, so that one
  // copy uploads them all.
  struct StepTensors {
    Tensor input_ids, positions, slot_mapping;  // (T,) i32
    Tensor cu_seqlens_q, cu_seqlens_k;          // (B + 1,) i32
    Tensor context_lens, last_token_rows;       // (B,) i32
    Tensor block_tables;                        // (B, W) i32
    Tensor sampling;                            // (B, sizeof(SamplingRow)) U8
    Tensor input_rows;                          // (B,) i32
    Tensor token_slot;                          // (1,) i32: the slot of token_staging_ a graph pushes its tokens to
  };

  // One tensor-parallel rank (nano-vllm: one ModelRunner process per GPU): its device, its shard of the
  // weights and of the KV cache, its buffers and graphs. With one rank, that is the whole model.
  struct Rank {
    int rank = 0;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Qwen3Model> model;
    Qwen3Workspace workspace;
    Buffer kv_storage;  // (2, layers, num_blocks, block_size, kv heads of this rank, head_dim), activation dtype
    std::vector<Tensor> k_caches, v_caches;    // per layer: (num_blocks, block_size, kv_heads, head_dim)
    Buffer attention_scratch;                  // decode attention's partial results (GPU)
    Buffer step_storage, step_staging;         // the step tensors on the device, and their host mirror
    StepTensors step, staged;                  // views of step_storage and step_staging
    Tensor tokens;                             // (B,) i32: the sampled tokens (rank 0), on the device
    std::vector<std::pair<int, int>> graphs;   // (batch size, graph id), ascending batch size
  };

  // The constructor's steps, in its order. settle_config: the settings the model and the device decide
  // (the constructor's contract lists them) into config and this runner; returns whether the ranks'
  // collectives are the stream-ordered ones (--collectives events on several GPU ranks), which run eagerly.
  bool settle_config(EngineConfig& config, const ModelConfig& mc);
  // warm_up_ranks (GPU): each rank on its own, before join_ranks, runs what may set things up on its device.
  void warm_up_ranks(bool event_collectives);
  // join_ranks (tp > 1): one communicator for all ranks, handed to every rank's backend.
  void join_ranks(const ModelConfig& mc, bool event_collectives);
  // capture_cuda_graphs: every rank's graph of each graph_sizes() batch, the ranks in lock step.
  void capture_cuda_graphs();
  StepTensors carve_step_tensors(Arena& arena) const;
  size_t allocated_bytes() const;  // weights, buffers and KV cache of every rank
  // device_id: the CUDA device of this rank, or -1 for the CPU (which ignores the kernel versions of config).
  void load_rank(Rank& r, const ModelConfig& mc, const TensorParallelLayout& tp, int device_id,
                 const EngineConfig& config);
  // in.block_tables (B, W): each sequence's table, -1 past its blocks.
  void fill_block_tables(StepInputs& in, const std::vector<Sequence*>& seqs) const;
  // in.sampling (B,): each sequence's parameters, seed, and the position of the token it samples next
  // (num_tokens(), chapter 07's `step`: the same noise however the batch is formed).
  void fill_sampling(StepInputs& in, const std::vector<Sequence*>& seqs) const;
  // Pads a decode step to a captured graph's batch_size rows: padding rows have slot -1, context 0.
  void pad_decode(StepInputs& in, int batch_size) const;
  // Fills rank r's host mirror with `in` (after waiting until the device has read the step before's).
  void stage_inputs(Rank& r, const StepInputs& in);
  // stage_inputs, then queues the mirror's copy to the device; returns the device tensors of the step.
  ForwardInputs upload(Rank& r, const StepInputs& in, int max_context_len);
  // What a captured decode step of bs rows reads of the step tensors: the first bs rows of each (and the
  // token slot), as byte ranges of step_storage, which the graph pulls from the mirror (Backend::pull_async).
  std::vector<Backend::ByteRange> decode_step_ranges(const Rank& r, int bs) const;
  // The part of rank r's step_storage the host mirror has a twin of (U8), for upload_async and pull_async.
  static Tensor mirrored_step_bytes(const Rank& r);
  void allocate_kv_cache(EngineConfig& config);
  // The prefill warm-up (nano-vllm's warmup_model runs one prefill of max_num_batched_tokens): on the GPU,
  // one prefill of each size prefill_warm_up_sizes() gives, so that every power-of-two bucket of rows a
  // prefill can reach has its GEMM algorithm chosen (06_tensor_parallel/linear.h, CublasLtLinear) and
  // every kernel of a prefill has run once before the first request: choosing cost cublasGemmEx 0.3-4 ms
  // of host time per new prompt length, and 81-122 ms the first time (04_model_runner/NOTES.md, section 11).
  // Sequences of token 0 (Sequence objects through prepare_prefill), written into the first KV blocks, which
  // nothing holds yet; the tokens are dropped.
  void warm_up_prefill(Rank& r);
  // Captures rank r's graph of a decode step of bs padding rows (after a warm-up run of the same step).
  void capture_cuda_graph(Rank& r, int bs);
  // forward + logits (+ sampling on rank 0) of a step whose inputs are uploaded: what a graph captures.
  void execute(Rank& r, const ForwardInputs& f, int num_seqs);
  // The CUDA graph of the smallest captured batch size >= num_seqs, or nullptr.
  const std::pair<int, int>* graph_for(const Rank& r, int num_seqs) const;

  int block_size_;
  int max_model_len_;
  int block_table_width_;  // ceil(max_model_len / block_size)
  int max_tokens_, max_seqs_;
  int num_blocks_ = 0;
  size_t kv_block_bytes_ = 0;  // one block on all ranks together
  bool enforce_eager_;
  Checkpoint checkpoint_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<CpuCommunicator> cpu_comm_;    // the ranks' collectives on the CPU...
  std::unique_ptr<CudaCommunicator> cuda_comm_;  // ...or on the GPU (06_tensor_parallel)
  std::unique_ptr<RankThreads> threads_;  // one thread per rank; rank 0 is the caller's
  std::vector<int64_t> rank_steps_;
  RunTimes last_run_times_;
  // Launched steps whose tokens are not collected yet, oldest first: their batch size, the slot of
  // token_staging_ their tokens are copied to, and their rows' order on the device (device_order: row i
  // is the caller's sequence order[i]).
  struct InFlight {
    int num_seqs, slot;
    std::vector<int> order;
    bool is_prefill;
    bool sampled_in_lm_head;  // its tokens came from the LM head's kernel: no logits were written
  };
  std::deque<InFlight> in_flight_;
  std::vector<int> collected_order_;  // the order of the step collected last, for download_logits
  bool collected_is_prefill_ = false, collected_sampled_in_lm_head_ = false;  // the same step's
  Buffer token_staging_;  // (2, max_seqs) i32 on the host (pinned on a GPU): rank 0's sampled tokens, by slot
};

}  // namespace nanovllm
