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

#include <memory>
#include <vector>

#include "01_sequence/engine_config.h"
#include "01_sequence/sequence.h"
#include "04_model_runner/qwen3.h"

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
  std::vector<SamplingRow> sampling;     // (B,)
  int max_seqlen_q = 0, max_seqlen_k = 0;
  int num_seqs() const { return int(sampling.size()); }
  int num_tokens() const { return int(input_ids.size()); }
};

class ModelRunner {
 public:
  // Loads config.model onto config.device. Sets config.num_kvcache_blocks (unless the user fixed it) and
  // clamps config.max_model_len to the model's max_position_embeddings, as nano-vllm's Config does.
  explicit ModelRunner(EngineConfig& config);
  ~ModelRunner();

  // Runs one scheduled step and returns the sampled token of each sequence (for a prefill chunk that
  // does not finish its prompt, a token the scheduler will discard; -1 for a sequence whose logits hold
  // a NaN or an infinity). If `logits` is given it receives
  // the (B, vocab) logits the tokens were sampled from.
  std::vector<int32_t> run(const std::vector<Sequence*>& seqs, bool is_prefill, std::vector<float>* logits = nullptr);

  StepInputs prepare_prefill(const std::vector<Sequence*>& seqs) const;
  StepInputs prepare_decode(const std::vector<Sequence*>& seqs) const;

  const ModelConfig& model_config() const { return model_->config(); }
  Device device() const { return backend_->device(); }
  int num_kvcache_blocks() const { return num_blocks_; }
  size_t kv_cache_bytes() const { return kv_storage_.bytes(); }
  size_t kv_block_bytes() const { return kv_block_bytes_; }
  // Decode batch sizes with a captured CUDA graph (empty on the CPU or with --enforce-eager).
  std::vector<int> graph_batch_sizes() const;

  // A micro-benchmark of one decode step: `batch` sequences of `context` tokens each (K/V from whatever
  // the cache holds), run `iterations` times. Reports the step time eagerly and under a CUDA graph
  // (host work included), and the time of every operation (eager, profiled).
  struct DecodeStepProfile {
    double eager_ms = 0, graph_ms = 0;
    std::vector<Backend::OpTime> ops;  // per step
  };
  DecodeStepProfile profile_decode_step(int batch, int context, int iterations);
  Backend& backend() { return *backend_; }

 private:
  void fill_block_tables(StepInputs& in, const std::vector<Sequence*>& seqs) const;
  void fill_sampling(StepInputs& in, const std::vector<Sequence*>& seqs) const;
  ForwardInputs upload(const StepInputs& in, int max_context_len);
  void allocate_kv_cache(EngineConfig& config);
  void capture_cuda_graphs();
  // forward + logits + sampling of a step whose inputs are uploaded: replayed from a graph when one fits.
  void execute(const ForwardInputs& f, int num_seqs);

  int block_size_;
  int max_model_len_;
  int block_table_width_;  // ceil(max_model_len / block_size)
  int max_tokens_, max_seqs_;
  int num_blocks_;
  size_t kv_block_bytes_ = 0;
  bool enforce_eager_;
  std::unique_ptr<Backend> backend_;
  Checkpoint checkpoint_;
  std::unique_ptr<Qwen3Model> model_;
  Qwen3Workspace workspace_;
  Buffer kv_storage_;
  std::vector<Tensor> k_caches_, v_caches_;  // per layer: (num_blocks, block_size, kv_heads, head_dim)
  Buffer attention_scratch_;                 // decode attention's partial results (GPU)
  std::vector<std::pair<int, int>> graphs_;  // (batch size, graph id), ascending batch size
  // Device copies of StepInputs, sized for the largest step.
  Buffer step_storage_;
  Tensor input_ids_, positions_, slot_mapping_, cu_seqlens_q_, cu_seqlens_k_, context_lens_, block_tables_,
      last_token_rows_, sampling_, tokens_;
};

}  // namespace nanovllm
