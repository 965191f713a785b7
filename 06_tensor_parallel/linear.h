// linear.h: the linear layers and how tensor parallelism splits them (nano-vllm: layers/linear.py,
// layers/embed_head.py).
//
// Every weight is stored as in PyTorch, W: (out_features, in_features), and y = x W^T.
// With tp_size GPUs, each rank holds one shard:
//   column parallel   rows [rank*out/tp, (rank+1)*out/tp) of W: each rank computes a slice of y
//                     (q/k/v and gate/up projections; no communication)
//   row parallel      columns [rank*in/tp, ...) of W: each rank computes a partial sum of y over its slice
//                     of x, then an all-reduce adds them (o_proj and down_proj)
//   QKV               q, k and v are column parallel by heads and packed in one weight per rank:
//                     [q heads of this rank; k heads of this rank; v heads of this rank]
//   merged gate/up    [gate rows of this rank; up rows of this rank]
//   vocab parallel    embedding and LM head rows [rank*V/tp, ...): each rank embeds or scores only
//                     its part of the vocabulary
// Two all-reduces per layer (after o_proj and after down_proj), and one after the vocab-parallel embedding:
// 57 for Qwen3-0.6B's 28 layers.
//
// The shard functions work on full host copies of checkpoint tensors (any element type) and return
// this rank's packed weight, so that loading is the same code for any (rank, tp_size).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "01_sequence/base/common.h"

namespace nanovllm {

// y (n, out) = x (n, in) @ W (out, in)^T, fp32 (the CPU reference of every projection).
void linear_cpu(float* y, const float* x, const float* W, int n, int in_features, int out_features);

// Checks that `total` splits evenly over tp_size ranks; returns the per-rank size.
inline int64_t divide(int64_t total, int tp_size, const char* what) {
  if (total % tp_size != 0) fail(what, " (", total, ") is not divisible by tensor_parallel_size ", tp_size);
  return total / tp_size;
}

// Rows [rank * rows/tp, (rank+1) * rows/tp) of a (rows, cols) matrix: column-parallel linear layers (the
// vocab-parallel embedding and LM head, whose vocabulary may not divide, take shard_rows_padded below).
template <class T>
std::vector<T> shard_rows(const std::vector<T>& w, int64_t rows, int64_t cols, int rank, int tp_size) {
  int64_t part = divide(rows, tp_size, "rows");
  auto begin = w.begin() + rank * part * cols;
  return std::vector<T>(begin, begin + part * cols);
}

// Columns [rank * cols/tp, (rank+1) * cols/tp) of a (rows, cols) matrix: row-parallel linear layers.
template <class T>
std::vector<T> shard_cols(const std::vector<T>& w, int64_t rows, int64_t cols, int rank, int tp_size) {
  int64_t part = divide(cols, tp_size, "columns");
  std::vector<T> out;
  out.reserve(size_t(rows * part));
  for (int64_t r = 0; r < rows; r++) {
    auto begin = w.begin() + r * cols + rank * part;
    out.insert(out.end(), begin, begin + part);
  }
  return out;
}

// Rows [rank * part, (rank + 1) * part) of a (rows, cols) matrix with part = ceil(rows / tp), zero rows
// past the end: the vocab-parallel embedding and LM head when the vocabulary does not split evenly
// (vLLM pads it too). A zero row of the LM head gives a logit of 0 for a token that does not exist; the
// gather cuts those columns off before anyone samples.
template <class T>
std::vector<T> shard_rows_padded(const std::vector<T>& w, int64_t rows, int64_t cols, int rank, int tp_size) {
  const int64_t part = (rows + tp_size - 1) / tp_size, begin = std::min(rows, rank * part);
  const int64_t end = std::min(rows, begin + part);
  std::vector<T> out(size_t(part * cols), T(0));
  std::copy(w.begin() + begin * cols, w.begin() + end * cols, out.begin());
  return out;
}

// Concatenates this rank's row shards of several weights that share `cols` (QKV: q, k, v; MLP: gate, up).
template <class T>
std::vector<T> pack_row_shards(const std::vector<const std::vector<T>*>& weights, const std::vector<int64_t>& rows,
                               int64_t cols, int rank, int tp_size) {
  std::vector<T> out;
  for (size_t i = 0; i < weights.size(); i++) {
    std::vector<T> shard = shard_rows(*weights[i], rows[i], cols, rank, tp_size);
    out.insert(out.end(), shard.begin(), shard.end());
  }
  return out;
}

// How tensor parallelism splits one model over tp_size ranks (nano-vllm asserts that every size
// divides; here more ranks than KV heads, and a vocabulary that does not divide, are handled as vLLM
// does).
struct TensorParallelLayout {
  int tp_size = 1;
  int heads_per_rank = 0;         // query heads of each rank
  int kv_heads_per_rank = 0;      // KV heads of each rank: num_kv_heads / tp, or 1 when tp > num_kv_heads
  int intermediate_per_rank = 0;  // MLP width of each rank
  int64_t vocab_per_rank = 0;     // ceil(vocab / tp): the last rank's shard may be padded
  int num_kv_heads = 0;

  // The first KV head of rank r. With more ranks than KV heads, each KV head is replicated on
  // tp / num_kv_heads consecutive ranks, and rank r's query heads all read head r * num_kv_heads / tp.
  int first_kv_head(int rank) const { return rank * num_kv_heads / tp_size; }
};

// Throws Error naming the first size that cannot be split: query heads or the MLP width not divisible
// by tp_size, or KV heads that neither divide by tp_size nor divide it.
TensorParallelLayout tensor_parallel_layout(int num_heads, int num_kv_heads, int intermediate_size, int64_t vocab_size,
                                            int tp_size);

}  // namespace nanovllm

// ---------------------------------------------------------------------------------------------------
// CUDA: y (n, out) = x (n, in) @ W (out, in)^T with x and W bf16 (rows contiguous), fp32 accumulation,
// y bf16 (activations) or fp32 (logits). Seven versions, each tested against linear_cpu (prediction and
// measurement in 04_model_runner/NOTES.md):
//   v1  linear_cuda        one cublasGemmEx call, cuBLAS's default algorithm    (linear_cuda.cpp)
//   v2  linear_gemv_cuda   our kernel for n <= 16: the weights streamed once     (linear_gemv.cu)
//   v3  CublasLtLinear     cuBLASLt, the fastest of its candidates, timed per shape (linear_cublaslt.cpp)
//   v4  linear_split_k_cuda  our tensor-core GEMM, 64 x 64 tiles and split-K   (linear_split_k.cu)
//   v5  linear_gemv_mma_cuda our GEMV on tensor cores for n <= 16               (linear_gemv_mma.cu)
//   v6  linear_wgmma_cuda    our GEMM on Hopper's wgmma, tiles as tall as the batch, split-K in a
//                            cluster                                           (linear_wgmma.cu)
//   v7  linear_prefetch_cuda for n <= 4: the weights copied into shared memory before the previous
//                            kernel ends, the norm or SiLU before and the residual add after the product
//                            in the same kernel                                 (linear_prefetch.cu)
// CudaLinear, what the CUDA backend calls, picks one by n and the engine's linear version:
//   --linear-version 1   v1 only
//   --linear-version 2   v2 for n <= kGemvFasterRows, v1 above, and v3's timed choice for an output wider
//                        than kTunedWideOut (the LM head) and above kTunedMaxRows (prefill), where it is
//                        made once per power-of-two bucket of n (CublasLtLinear)
//   --linear-version 3   as 2, and v3 for every projection with kGemvFasterRows < n <= kTunedMaxRows
//   --linear-version 4   as 2, and v4 for every projection with kGemvFasterRows < n <= kTunedMaxRows (in v1's
//                        place, and v3's for the LM head; measured: faster than cuBLAS at n = 2 only)
//   --linear-version 5   as 2, and v5 for kGemvFasterRows < n <= kGemvMmaFasterRows
//   --linear-version 6   as 5, and v6 for kGemvMmaFasterRows < n <= kWgmmaFasterRows (kWgmmaNarrowRows
//                        for a projection with at most kWgmmaNarrowOut outputs) where it runs
//                        (linear_wgmma_available; cuBLAS elsewhere), and the MLP's gate_up with its
//                        SiLU in one kernel (v2, v5 or v6) up to kWgmmaSiluRows (CudaLinear::fuses_silu),
//                        and the LM head with the sampler in v6's ending from kWgmmaSampleMinRows to
//                        kWgmmaSampleMaxRows (CudaLinear::fuses_sample)
//   --linear-version 7   as 6, and for n <= kPrefetchFasterRows the model's projections with the small
//                        operations around them, in v7 (CudaLinear::fuses, Backend::fuses_around_linear);
//                        measured no faster than 6 (04_model_runner/NOTES.md, section 2)
//   --linear-version 8   as 6, and for a projection with at most kWgmmaNarrowOut outputs (o_proj, down_proj)
//                        from kWgmmaPartialsMinRows to kWgmmaPartialsMaxRows rows, v6 with its split-K sum
//                        left to the norm after it (CudaLinear::run_partials, Backend::linear_add_rmsnorm):
//                        the blocks of a split need no cluster. The default, the fastest measured
//                        (04_model_runner/NOTES.md, section 2, "v6's split-K sum in the norm after it")
// Versions 2, 3 and 6 each add to the one before (6 to 5); 4 and 5 add one kernel to 2, 7 one kernel (v7) to 6,
// and 8 one use of v6 to 6. Every version runs in the same binary, so each step of the ladder is measured against the one it builds on.
namespace nanovllm {
constexpr int kLinearVersionMin = 1, kLinearVersionMax = 8, kLinearVersionDefault = 8;

// The largest n v3 times a choice for by multiples of 16 rows. Above it (prefill), prompts would bring too
// many distinct shapes to time each one: there CublasLtLinear times one choice per power-of-two bucket, for
// every version from 2 on (the model runner's prefill warm-up makes those choices:
// ModelRunner::warm_up_prefill). Measured against cuBLAS's own first choice there (H200, `bench --random
// qwen3-0.6b`, 04_model_runner/NOTES.md section 11): the prefill's GEMMs 176.6 -> 165.6 ms.
constexpr int kTunedMaxRows = 512;
// From version 2 on, a projection with more outputs than this (the LM head) takes v3's timed choice up to
// kTunedMaxRows too, where v1 would run: the LM head at 256 rows 133.6 -> 126.2 µs a step (H200; the layer
// projections gained nothing from v3: 04_model_runner/NOTES.md section 2).
constexpr int kTunedWideOut = 16384;
// SMs qkv's cuBLAS GEMM leaves to decode attention in a captured step, whose blocks start there as the GEMM's
// blocks start and copy their first K/V tiles before they wait for it: `bench` +0.25-0.5% with 20 of the
// H200's 132 (qkv leaving 32: the same within the spread; every GEMM leaving 12-32: +0.2%, 44: -0.1%).
constexpr int kSpareSmsBeforeAttention = 20;
}  // namespace nanovllm

#ifdef NANOVLLM_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstddef>

#include "01_sequence/base/cuda_utils.h"
#include "07_sampler/sampler.h"

namespace nanovllm {

// v1: on the handle's stream, with the handle's workspace. cuBLAS is column-major: see linear_cuda.cpp.
// sm_target > 0: cuBLAS chooses its kernel for that many SMs, leaving the others to the kernel after it
// (cublasSetSmCountTarget, set on the handle for this call; 0, the default, is every SM).
void linear_cuda(cublasHandle_t handle, void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n,
                 int in_features, int out_features, int sm_target = 0);

// v2: for 1 <= n <= kGemvMaxRows (decode's small batches). One warp per two weight rows computes them for
// all n rows of x with 16-byte loads and a warp-shuffle sum; rows longer than 1,024 in_features are split
// over up to 4 warps of a block, whose sums meet in shared memory. Needs in_features % 8 == 0 and 16-byte
// aligned x and W: linear_gemv_fits says whether a call qualifies (linear_gemv_cuda fails otherwise).
constexpr int kGemvMaxRows = 16;
// ...but it beats cuBLAS only for one row: on the H200 a decode step at batch 1 took 1.30 ms with it
// against 1.55 ms, at batch 2 1.52 against 1.47, at batch 16 4.99 against 1.99 (bench-step; the rows of
// x are reread by every warp). CudaLinear uses it up to this many rows.
constexpr int kGemvFasterRows = 1;
bool linear_gemv_fits(const bf16* x, const bf16* W, int n, int in_features);
void linear_gemv_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                      int out_features, cudaStream_t stream);
// v2 with the MLP's activation in its ending: y (n, out_features / 2) bf16 = silu(gate) * up of the
// projection's output (n, out_features) = [gate | up], each rounded to bf16 first: the same bits as
// linear_gemv_cuda followed by silu_and_mul_cuda (04_model_runner/layers.h), in one kernel, so that a
// decode step at one row has one dependent kernel less per layer. Needs what v2 needs and an even
// out_features.
void linear_gemv_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                           cudaStream_t stream);

// v4: our tensor-core GEMM with 64 x 64 tiles and split-K (linear_split_k.cu), for the decode batches
// where cuBLAS's large tiles leave most SMs idle. splits blocks per output tile each add up a range of
// in_features into an fp32 partial in `workspace` (splits * n * out_features floats), and a second kernel
// adds the partials in split order. linear_split_k_splits: the split count it uses for a shape (enough
// blocks for two per SM of a 132-SM GPU, at most 16 splits and at most in_features / 128: at least 128
// in_features deep on average, the last maybe less; the partials within workspace_bytes).
// Needs in_features % 8 == 0 and 16-byte aligned x and W (linear_split_k_fits).
int linear_split_k_splits(int n, int in_features, int out_features, size_t workspace_bytes);
// The in_features each of `splits` takes: whole 64-deep stages, with splits x depth >= in_features.
int linear_split_k_depth(int in_features, int splits);
bool linear_split_k_fits(const bf16* x, const bf16* W, int n, int in_features);
void linear_split_k_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                         int out_features, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// v5: for 1 <= n <= kGemvMaxRows: every warp streams 16-byte chunks of 16 weight rows straight into
// mma.sync fragments (the k order permuted the same way in W and x), a block's 16 outputs' in_features split
// over as many warps as take them in one round (linear_gemv_mma_warps, at most 24), all of it asked for
// before the kernel's wait. Needs what v2 needs (linear_gemv_fits).
int linear_gemv_mma_warps(int in_features);
// ...which beats v2 and cuBLAS from 2 to 8 rows only: a decode step on the H200 (bench-step, graph) took
// 1.187 ms at batch 2 (v2 and cuBLAS: 1.342), 1.423 at batch 8 (1.491), but 1.134 at batch 1 (v2: 0.989)
// and 2.009 at batch 16 (cuBLAS: 1.808), in the form it was first written (a block of 4 warps, and for few
// outputs a split over blocks; 04_model_runner/NOTES.md has both forms). CudaLinear uses it up to this many
// rows.
constexpr int kGemvMmaFasterRows = 8;
void linear_gemv_mma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                          int out_features, cudaStream_t stream);
// v5 with the MLP's activation in its ending, as linear_gemv_silu_cuda: the same bits as linear_gemv_mma_cuda
// followed by silu_and_mul_cuda. False, and nothing queued, where v5 cannot run (linear_gemv_fits) or
// out_features is odd.
bool linear_gemv_mma_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                               cudaStream_t stream);

// v6: our GEMM on Hopper's warpgroup tensor cores (wgmma; linear_wgmma.cu) for the decode batches where
// cuBLAS streams the weights at a third of the copy bandwidth: a block's tile is as tall as the batch (up
// to 2 warpgroups x 64 rows of x in linear_wgmma_plan; the kernel takes 4 for a plan of one's own) against
// `block_out` rows of W, and the in_features are split over
// `splits` blocks that form one thread-block cluster and add up their tiles in distributed shared memory
// (no partials in memory, no second kernel); the copy engine (TMA) loads both operands. Needs a compute
// capability 9.0 GPU running code built for sm_90a (linear_wgmma_available) and what v4 needs
// (linear_split_k_fits).
constexpr int kWgmmaMaxSplits = 8;  // v6's splits of in_features: blocks of a cluster, at most the portable 8
struct LinearWgmmaPlan {
  int warpgroups = 1;         // 64 rows of x each: 1 or 2 (linear_wgmma_plan; the kernel takes 4 too)
  int block_out = 64;         // outputs per block: 64 or 128
  int splits = 1;             // blocks (one cluster) per output tile, 1-8
  int k_tiles_per_split = 1;  // stages of 64 in_features per split
};
// The plan for a shape on a GPU of `multiprocessors` SMs. Up to kWgmmaFasterRows rows: one warpgroup, 128
// outputs a block when that still gives 16 tiles (64 otherwise), and the fewest splits (at most 8, at least
// two stages of 64 in_features deep on average: the last may hold fewer) that give a block per SM. Above:
// ceil(n / 64) warpgroups up to 128 rows (1 at 49-64 rows, 2 at 65-128) and row tiles of one warpgroup beyond
// (small blocks, two an SM, W reread from L2 rather than a 193 KB block alone on its SM), 64 outputs a block
// up to 128 rows and 128 beyond, and the fewest splits (at most 6) that give 96 blocks for a projection with
// at most kWgmmaNarrowOut outputs, 288 for a wider one: what the sweeps of kWgmmaNarrowRows and
// kWgmmaSiluRows found fastest on the H200's 132 SMs (o_proj and down_proj; gate_up), scaled to the GPU's.
// Either way the clusters must fit in one wave: clusters_per_wave(plan) says how many clusters of plan.splits
// blocks of that block shape the GPU holds at once (linear_wgmma_cuda asks the CUDA occupancy calculator).
LinearWgmmaPlan linear_wgmma_plan(int n, int in_features, int out_features, int multiprocessors,
                                  const std::function<int(const LinearWgmmaPlan&)>& clusters_per_wave);
bool linear_wgmma_available();
// CudaLinear runs v6 for the layer projections only: with an LM head's 151,936 outputs x is reread by
// 1,187 output tiles, more bytes than the weight (measured at 256 rows: 277 µs against cuBLAS's 135).
constexpr int kWgmmaMaxOut = 16384;
// Measured on the H200 (bench-step, graph step, v6 for 9-512 rows against version 5, 2026-12-01): v6 is
// faster at batch 9 (1.308 against 1.401 ms), 12 (1.370 / 1.499), 16 (1.486 / 1.545) and 48 (2.514 /
// 2.584), as fast at 24 and 32, slower from 64 on (64: 2.942 / 2.931; 128: 4.855 / 4.704; 256: 8.520 /
// 8.232). CudaLinear uses it for every projection up to this many rows...
constexpr int kWgmmaFasterRows = 48;
// ...and above, up to kWgmmaNarrowRows, for the projections with at most kWgmmaNarrowOut outputs (o_proj
// and down_proj: 1,024), whose few output tiles cuBLAS splits over in_features with a second kernel to add
// the partials. A sweep of v6's plans against cuBLAS, 28 calls in a CUDA graph on distinct weights
// (04_model_runner/NOTES.md, section 2, "v6 for the narrow projections"), found plans (linear_wgmma_plan
// above 48 rows) that take o_proj in 4.2-5.4 µs a call from 64 to 192 rows against cuBLAS's 5.8-6.2, and
// down_proj in 4.9-6.6 against 7.1-7.6. In the decode step that held at first at 64 rows only (2.868-2.883
// ms against 2.908-2.919), not from 96 on. Since decode attention lets o_proj launch only after its tile
// loop (05_attention/v9_tensor_core_decode.cu), it holds to 192 rows (batch 160: 5.482-5.490 ms against
// 5.521-5.594), and at 256 v6 still loses (8.03 against 7.91; 04_model_runner/NOTES.md, section 2, "v6 for
// the narrow projections to 192 rows").
constexpr int kWgmmaNarrowOut = 2048, kWgmmaNarrowRows = 192;
// ...and, up to kWgmmaSiluRows, for the MLP's gate_up projection with its SiLU in the ending (CudaLinear::
// run_silu), which saves silu_and_mul's kernel: with the plans above 48 rows (288 blocks for its 96 output
// tiles of 64: 3 splits at 64 rows) the decode step at batch 64 took 2.866 / 2.867 ms against 2.89 / 2.904
// with cuBLAS and silu_and_mul, 96 3.851 / 3.843 against 3.872 / 3.844, 128 4.683 / 4.695 against 4.727 /
// 4.707 (04_model_runner/NOTES.md, section 2). The plain projections with many outputs (qkv) stay on
// cuBLAS above 48 rows: v6 ran them slower (batch 64: 2.920 / 2.926 ms). Both limits were tried again once
// o_proj could start early (kWgmmaNarrowRows above): qkv to 128 rows was slower at 64 and 128, gate_up to 192
// slower at 160 (5.467-5.487 ms against 5.354-5.398); qkv to 64 rows again with version 8 (2026-12-04), slower
// at 56 and 64 by 0.02-0.06 ms (04_model_runner/NOTES.md, section 2, "qkv on v6 at 49-64 rows, once more").
constexpr int kWgmmaSiluRows = 128;
// Version 8 leaves the split-K sum of the projections with at most kWgmmaNarrowOut outputs to the norm after
// them (CudaLinear::run_partials) from this many rows. Measured on the H200 (bench-step, graph step, two
// alternating rounds, both versions with the same buffers allocated; 04_model_runner/NOTES.md, section 2):
// slower at batch 16 (1.215-1.227 ms against 1.207-1.214), faster from 32 to 192 (batch 64: 2.542-2.557
// against 2.588-2.618; 96: 3.499-3.505 against 3.552-3.572). Up to v6's own rows for them: above 192 the
// cluster-summed v6 lost to cuBLAS (kWgmmaNarrowRows), and so did version 8 up to 256 rows (batch 256
// 7.831-7.922 ms against 7.807-7.829, `bench` -0.25%; 04_model_runner/NOTES.md, section 2, "Where the
// buffers land, version 8 to 256 rows, its plan at 17-48 rows").
constexpr int kWgmmaPartialsMinRows = 17, kWgmmaPartialsMaxRows = kWgmmaNarrowRows;
void linear_wgmma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                       int out_features, cudaStream_t stream);
// The same with a plan of one's own (the plan sweep, tests/linear_sweep.cpp): 1, 2 or 4 warpgroups, 64 or
// 128 outputs a block, 1-8 splits that cover the in_features with none empty, and clusters the GPU can
// hold (linear_wgmma_clusters_per_wave >= 1); fails otherwise.
void linear_wgmma_cuda(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features,
                       int out_features, const LinearWgmmaPlan& plan, cudaStream_t stream);
// How many clusters of the plan's blocks the GPU holds at once (the CUDA occupancy calculator; 0: none).
int linear_wgmma_clusters_per_wave(const LinearWgmmaPlan& plan);
// v6 with its split-K sum left to the caller (linear version 8): partials (splits, n, out_features) fp32, split
// s the product over its range of in_features, for linear_wgmma_plan's plan; returns its splits (at most
// kWgmmaMaxSplits). Their sum in split order, from +0.0f (from -0.0f for one split, which leaves it as it is),
// rounded to bf16, is linear_wgmma_cuda's bf16 y bit for bit: add_rmsnorm_partials_cuda (04_model_runner/layers.h)
// adds them so.
int linear_wgmma_partials_cuda(float* partials, const bf16* x, const bf16* W, int n, int in_features,
                               int out_features, cudaStream_t stream);
// v6 with the MLP's activation in its ending: y (n, out_features / 2) bf16 = silu(gate) * up of the
// projection by W = [gate; up] (out_features rows, an even number), each half rounded to bf16 first: the
// same bits as linear_wgmma_cuda followed by silu_and_mul_cuda (04_model_runner/layers.h), in one kernel.
void linear_wgmma_silu_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                            cudaStream_t stream);
// v6 with the sampler in its ending: the LM head's logits x W^T (n, vocab) sampled where each block computes
// its tile, without writing them (07_sampler/sample_tile.cuh scores a tile into per-row keys, and
// sample_from_keys_cuda turns the keys into tokens and samples the top-k / top-p rows again). tokens (n,)
// as sample_cuda gives them from those logits; logits (n, vocab) fp32 receives only the rows that ask for
// top-k or top-p, or every row with all_logits. best_keys (n,) and broken (n,) must be zero, and are again
// after the call. One block of 64 or 128 rows per 128 vocabulary entries: four blocks an SM at up to 64 rows (2
// stages), two at 65-128 (3 stages).
void linear_sample_cuda(int32_t* tokens, float* logits, const bf16* x, const bf16* W, int n, int in_features,
                        int vocab, const SamplingRow* rows, unsigned long long* best_keys, int* broken,
                        bool all_logits, cudaStream_t stream);
// Whether linear_sample_cuda takes these operands: a GPU with v6, 1 to kWgmmaSampleMaxRows rows, and x and W
// as linear_split_k_fits wants them.
constexpr int kWgmmaSampleMaxRows = 128;
bool linear_sample_fits(const bf16* x, const bf16* W, int n, int in_features);
// CudaLinear samples in the LM head's kernel from this many rows up to kWgmmaSampleMaxRows (fuses_sample): measured on
// the H200 against cuBLAS's fp32 logits + sample_cuda, 20 calls in a CUDA graph (04_model_runner/NOTES.md,
// section 5): 92 against 100 µs at 16 rows, 111 against 134 at 64, 126 against 171 at 128; at 256 rows no
// faster. Below 9 rows the LM head stays v2's or v5's GEMV + sample_cuda: the fused kernel measured 8-20 µs
// slower a step at 1 and 4 rows (the same section).
constexpr int kWgmmaSampleMinRows = 9;

// v7: for 1 <= n <= kPrefetchMaxRows (linear_prefetch.cu). Every warp's weight rows are copied whole into
// shared memory by the copy engine before the kernel waits for the previous one, so they stream while the
// previous kernel runs; and the small operations around a projection run in the same kernel, on its input
// (LinearInput) and on its output (add_to_y). y and x bf16.
enum class LinearInput {
  Plain,       // x (n, in) as it is
  RmsNorm,     // rmsnorm_cuda(x) * norm_weight, x (n, in)
  SiluAndMul,  // silu_and_mul_cuda(x), x = gate_up (n, 2 in)
};
struct LinearFusion {
  LinearInput input = LinearInput::Plain;
  const bf16* norm_weight = nullptr;  // RmsNorm: (in,)
  float eps = 0;                      // RmsNorm
  bool add_to_y = false;              // y (the residual) += the product rounded to bf16, rounded again
};
constexpr int kPrefetchMaxRows = 4;
// ...used by the model at batch 1 (measured: 04_model_runner/NOTES.md, section 2).
constexpr int kPrefetchFasterRows = 1;
// A launch: `blocks` blocks of `warps` warps, `rows_per_warp` consecutive weight rows per warp, about one
// block per SM, within 112 KB of shared memory where one row a block allows, else 226 KB (blocks 0: a
// weight row and x do not fit in that).
struct LinearPrefetchPlan {
  int blocks = 0, warps = 0, rows_per_warp = 0, smem_bytes = 0;
};
LinearPrefetchPlan linear_prefetch_plan(int n, int in_features, int out_features, int num_sms);
// A GPU of compute capability 9.0 or later running code built for it (the bulk copy is sm_90).
bool linear_prefetch_available();
// Whether linear_prefetch_cuda takes these operands: a GPU with v7, 1 to kPrefetchMaxRows rows, in_features
// % 8 == 0, 16-byte aligned x and W, and a plan (a weight row and x within 226 KB of shared memory).
bool linear_prefetch_fits(const bf16* x, const bf16* W, int n, int in_features, int out_features);
void linear_prefetch_cuda(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features,
                          const LinearFusion& fusion, cudaStream_t stream);

// v3: cuBLASLt with an algorithm chosen per shape by timing (nano-vllm leaves the choice to PyTorch, that
// is to cuBLAS's heuristic). A shape is (device, rows, in, out, output dtype, pointer alignment), where
// rows is n rounded up to a multiple of 16: the batch sizes of one bucket share a choice, so eager decode
// does not time every n.
//
// The first run() of a shape outside stream capture asks cublasLtMatmulAlgoGetHeuristic for up to
// kCandidates algorithms, runs each once, then kTimedRuns times between CUDA events with L2 flushed before
// each run (a decode step streams its weights from memory, not from L2), and keeps the fastest. Every
// later run uses it, inside a capture or not. During a capture nothing is timed or allocated: a shape
// never seen before returns false and the caller runs v1, which is why the model runner runs every decode
// shape once before capturing (ModelRunner::capture_cuda_graph).
//
// Above kTunedMaxRows (prefill) rows is the power of two at or above n: the candidates are timed at the
// first n of the bucket, and the choice serves every n of it. cublasGemmEx chooses again at every row count
// it has not seen, which took 0.3-4 ms on the host per new prompt length (04_model_runner/NOTES.md, section
// 11); here a bucket chooses once, and the model runner's warm-up chooses for every bucket a prefill can
// reach, at its top (ModelRunner::warm_up_prefill).
//
// The choices live in one table for the whole process, behind a mutex: two engines in one process run
// the same algorithm and compute the same bits. Two processes may choose differently when two algorithms
// time alike (the last bits of the logits then differ).
class CublasLtLinear {
 public:
  static constexpr int kCandidates = 8;
  static constexpr int kTimedRuns = 3;

  // workspace (workspace_bytes, the backend's 32 MiB): device memory the algorithms may use, which only
  // work queued on `stream` touches.
  CublasLtLinear(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  // y = x W^T as linear_cuda, queued on the stream. Returns false, having queued nothing, when cuBLASLt
  // has no algorithm for this shape, or the shape is new and the stream is capturing.
  bool run(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features, int out_features);

  // How many shapes have an algorithm chosen, in this process (tests).
  static size_t chosen_shapes();
  // Whether n rows of (in_features -> out_features) on the current device, with buffers aligned to 256
  // bytes (every buffer the engine allocates), have their choice made (tests).
  static bool has_choice(int n, int in_features, int out_features, bool y_is_fp32);

 private:
  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;  // for timing the candidates
  void* flush_ = nullptr;                          // (flush_bytes_,) written before each timed run: evicts L2
  size_t flush_bytes_ = 0;
};

// The projection of the CUDA backend: v1 to v7 by n, the projection's shape and `version`
// (kLinearVersionMin .. kLinearVersionMax, see there). `cublas` must be bound to `stream` and to the same workspace
// (cublasSetStream, cublasSetWorkspace): the versions share it, one after another on the one stream.
class CudaLinear {
 public:
  CudaLinear(cublasHandle_t cublas, cudaStream_t stream, void* workspace, size_t workspace_bytes,
             int version = kLinearVersionDefault);
  // spare_sms: where the call runs v1 (cuBLAS), SMs its GEMM leaves free for the kernel after it, whose
  // blocks a graph lets in as the GEMM's blocks start (start_successors_early, cuda_utils.h); 0: none.
  // qkv before decode attention leaves kSpareSmsBeforeAttention (04_model_runner/NOTES.md, section 18).
  void run(void* y, bool y_is_fp32, const bf16* x, const bf16* W, int n, int in_features, int out_features,
           int spare_sms = 0);
  // Whether n rows of the model's projections run fused, in v7 (version 7, n <= kPrefetchFasterRows, a GPU
  // that has it): the backend's rmsnorm_linear, linear_add and silu_linear_add then call linear_prefetch_cuda.
  bool fuses(int n) const { return version_ == 7 && n >= 1 && n <= kPrefetchFasterRows && linear_prefetch_available(); }
  // Whether n rows of the MLP's gate_up projection may take its activation into their kernel (version 6 or
  // more: v2's and v5's rows, and v6's up to kWgmmaSiluRows); run_silu is then that kernel, y (n, out_features / 2)
  // = silu(gate) * up. run_silu returns false, queuing nothing, where it does not fuse (the caller then runs
  // the projection and silu_and_mul).
  bool fuses_silu(int n) const {
    if (version_ < 6 || n < 1) return false;
    return n <= kGemvMmaFasterRows || (n <= kWgmmaSiluRows && linear_wgmma_available());
  }
  bool run_silu(bf16* y, const bf16* x, const bf16* W, int n, int in_features, int out_features);
  // Version 8, for a projection with at most kWgmmaNarrowOut outputs that v6 can run, from
  // kWgmmaPartialsMinRows to kWgmmaPartialsMaxRows rows: that product's split-K partials into `partials`
  // (kWgmmaMaxSplits x n x out_features floats at most), and their count. Elsewhere 0, queuing nothing (the
  // caller then runs the projection).
  int run_partials(float* partials, const bf16* x, const bf16* W, int n, int in_features, int out_features);
  // Whether n rows of the LM head take the sampler into their kernel (version 6 or more, kWgmmaSampleMinRows <=
  // n <= kWgmmaSampleMaxRows, a GPU with v6): the backend then calls linear_sample_cuda.
  bool fuses_sample(int n) const {
    return version_ >= 6 && n >= kWgmmaSampleMinRows && n <= kWgmmaSampleMaxRows && linear_wgmma_available();
  }

  // cuBLAS's SM target that leaves spare_sms of this device's SMs free (0: all of them, cuBLAS's default).
  static int sm_target(int spare_sms);

  // How many calls, in this process, took the two paths whose answers are those of another version, so that
  // a test comparing answers cannot tell it ran them (tests; a captured call counts once, at its capture):
  // run_partials queuing v6's partials, and run queuing v6 above kWgmmaFasterRows rows for a narrow
  // projection (kWgmmaNarrowOut, kWgmmaNarrowRows).
  static size_t partials_runs();
  static size_t narrow_wgmma_runs();

 private:
  // Whether this call runs v6: version 6 or more, more rows than v5 takes, up to max_rows, a layer
  // projection (not the LM head), and a GPU and operands v6 can take. run passes kWgmmaFasterRows (or
  // kWgmmaNarrowRows for a narrow projection), run_silu kWgmmaSiluRows.
  bool runs_wgmma(const bf16* x, const bf16* W, int n, int in_features, int out_features, int max_rows) const;

  cublasHandle_t cublas_;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  CublasLtLinear lt_;
  int version_;
};

}  // namespace nanovllm
#endif
