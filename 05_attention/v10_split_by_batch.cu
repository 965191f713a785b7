// v10_split_by_batch.cu: v9's kernel, with the context split as many ways as the batch needs to fill the
// GPU, and no combine kernel once it needs none.
//
// Idea:     v2-v9 cut every context into partitions of decode_partition_size keys (64 to 512, by batch), so a
//           sequence of 1,000 keys at batch 256 became 2 blocks per KV head, and their partial results a
//           second kernel to merge: 28 more launches per step and a round trip of the partials through
//           memory. The split exists for one reason, to give the GPU enough blocks when the batch is small.
//           Measured (NOTES.md, v10): with v9's kernel, more blocks than about one per SM only shorten each
//           block's run of keys while its fixed costs (q, filling the pipeline, merging 4 warps) stay; at
//           batch 16 one block per (sequence, KV head) over the whole context, 128 blocks, beat every split.
//           So v10 asks how many blocks the batch gives (num_seqs x num_kv_heads), splits each context into
//           decode_splits(...) = ceil(128 / that) near-equal partitions, and from 16 sequences (8 KV heads)
//           on that is 1: the block sees the whole context, normalises O by l itself and writes `out`.
// Adds:     over v9: the partition size is per sequence (partition_size_for: context / splits, in whole
//           16-key tiles), computed on the device from the sequence's own length. The grid no longer
//           depends on the context, so a CUDA graph captured for max_model_len launches no idle blocks.
// Launch:   grid (splits, num_kv_heads, num_seqs), v9's kernel (v9_tensor_core_decode.cu, which holds the
//           one-split ending: normalise and write `out`, zeros for a padding row); the combine only when
//           splits > 1 (batches below 16 sequences with 8 KV heads).
// Measured: see NOTES.md.
#include "05_attention/kernels.cuh"

namespace nanovllm {

void launch_v10_split_by_batch(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  // p.splits and p.max_partitions (equal) were set from decode_splits by attention.cu's decode_params, through
  // decode(), which decode_attention_cuda and decode_attention_fused_cuda both call.
  launch_tensor_core_decode_kernel(p, dims.num_seqs, stream);
  if (p.splits > 1) launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
