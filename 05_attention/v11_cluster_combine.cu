// v11_cluster_combine.cu: v10's splits of a context merged inside a thread-block cluster, not by a second
// kernel.
//
// Idea:     below 16 sequences (8 KV heads) v10 splits each context so that the GPU still gets about 128
//           blocks (batch 1: 16 splits), and each split's partial result (m, l, O) goes to memory for
//           decode_combine_kernel to merge: one more kernel per layer, 28 a step, each a dependent launch
//           that costs about 2 µs on the chain whatever it does (04_model_runner/NOTES.md, section 9), for
//           a few KB of work. On sm_90 the blocks of a cluster can read each other's shared memory, so the
//           splits of one (sequence, KV head) can be one cluster and merge there, as 06_tensor_parallel's
//           v6 adds its split-K tiles and 07_sampler adds its chunks' candidates.
// Adds:     over v10: at most 16 splits, Hopper's largest cluster (a non-portable size the kernel asks
//           for; 8 where the GPU holds no cluster of 16: tensor_core_decode_max_cluster), which v10 never
//           exceeds with 8 KV heads; the grid's x dimension, a (sequence, KV head)'s splits, launched as one
//           cluster; the outputs dealt to the cluster's blocks in slices, each block storing its merged
//           state of the G rows into every slice owner's shared memory, and each owner merging its slice
//           with the combine's formula in the combine's order once its mbarrier has counted every
//           partition's bytes (SliceMerge in v9_tensor_core_decode.cu, which holds the kernel): the same
//           bits as v10. Blocks past the context no longer return at once: they own a slice too.
//           And where v10's one split would leave each SM a single block (16-31 sequences at 8 KV heads),
//           2 splits (cluster_decode_splits): the same work in twice the blocks, merged in the cluster.
// Launch:   grid (splits, num_kv_heads, num_seqs), clusters of (splits, 1, 1), v9's kernel with its CLUSTER
//           parameter; no combine. With one split (32 sequences and more) or no cluster support (code not
//           built for sm_90), exactly v10.
// Measured: see NOTES.md.
#include "05_attention/kernels.cuh"

namespace nanovllm {

void launch_v11_cluster_combine(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  // p.splits and p.max_partitions (equal) were set by attention.cu's decode_params, through decode() (for
  // decode_attention_cuda and decode_attention_fused_cuda): cluster_decode_splits, at most
  // tensor_core_decode_max_cluster(), where the GPU holds clusters; else v10's decode_splits, merged by the
  // combine kernel below.
  const bool cluster = p.splits > 1 && tensor_core_decode_clusters_available();
  launch_tensor_core_decode_kernel(p, dims.num_seqs, stream, cluster);
  if (p.splits > 1 && !cluster) launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
