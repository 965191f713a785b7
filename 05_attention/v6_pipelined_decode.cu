// v6_pipelined_decode.cu: v2's split-K decode with K/V streamed through shared memory by a multi-stage
// cp.async pipeline, so that a block always has several steps of loads in flight, whatever its warps
// are doing.
//
// Idea:     decode is a stream: at 4.2 TB/s and ~1 us of latency an SM needs ~32 KB in flight (Little's
//           law: bytes in flight = bandwidth x latency, 4.2 MB over 132 SMs), and v2 has a warp's loads in
//           flight only between its load and its use; v4 tried to keep more in flight with registers and
//           lost two blocks of five per SM to them. cp.async copies global
//           memory to shared memory without holding registers: the block keeps kStages - 1 steps of
//           K/V (16 KB each) in flight while its warps compute on the oldest.
// Adds:     over v2: per block step (kStepKeys keys: 32 for head_dim 128) all 128 threads issue 16-byte
//           cp.async copies of that step's K and V rows into one of kStages shared-memory stages; a
//           step's keys are read back from shared memory by the same lanes that v2 loads them into
//           (gqa_tile.cuh: attend_keys is unchanged). One __syncthreads per step.
// Launch:   as v2 (grid (max_partitions, num_kv_heads, num_seqs), 128 threads, then the combine), plus
//           dynamic shared memory kStages x 16 KB = 64 KB: 3 blocks per SM, up to 9 steps (144 KB) in
//           flight per SM.
// Measured: see NOTES.md (slower than v2: the pipeline does not shorten v2's arithmetic, which v9 does).
#include "05_attention/gqa_tile.cuh"
#include "01_sequence/base/ptx.cuh"

namespace nanovllm {
namespace {

constexpr int kStages = 4;  // shared-memory stages: kStages - 1 steps in flight while one is computed

// As attention_v2_split_k_kernel: block (partition, kv_head, seq) -> partial (m, l, O) of its G heads.
template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kWarps * 32) attention_v6_pipelined_decode_kernel(AttentionParams p) {
  using L = LaneLayout<HEAD_DIM>;
  constexpr int kStageBytes = L::kStepKeys * HEAD_DIM * 2;  // one step's K (or V): 32 x 128 x 2 = 8 KB
  extern __shared__ __align__(16) unsigned char smem[];      // (kStages, 2 (K, V), kStepKeys, HEAD_DIM) bf16
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / L::KG, c = lane % L::KG;
  const int seq = blockIdx.z, kv_head = blockIdx.y, partition = blockIdx.x;
  const int G = p.num_heads / p.num_kv_heads;
  const SeqRange r = seq_range(p, seq);
  const int key_begin = partition * p.partition_size;
  const int key_end = min(r.seqlen_k, key_begin + p.partition_size);
  if (key_begin >= key_end) return;
  const int num_steps = (key_end - key_begin + L::kStepKeys - 1) / L::kStepKeys;

  // Step s (keys key_begin + kStepKeys s ..) into stage s % kStages. Element i = threadIdx.x + 128 k of
  // the step is key row i / KG, chunk i % KG (head_dim 128: rows tid / 16 + 8 k, chunk tid % 16,
  // k = 0..3): a K row is 16 consecutive threads, 256 contiguous bytes.
  const int32_t* block_table = p.block_tables + int64_t(seq) * p.block_table_width;
  const int64_t kv_dim = int64_t(p.num_kv_heads) * HEAD_DIM;
  const uint32_t stages = smem_address(smem);
  auto load_step = [&](int s) {
    const uint32_t stage = stages + uint32_t((s % kStages) * 2 * kStageBytes);
    for (int i = threadIdx.x; i < L::kStepKeys * L::KG; i += kWarps * 32) {
      const int row = i / L::KG, chunk = i % L::KG, j = key_begin + s * L::kStepKeys + row;
      const bool valid = j < key_end;  // past key_end: zeros (attend_keys masks them; 0 * NaN = NaN)
      const int64_t offset =
          valid ? key_slot(block_table, j, p.block_size) * kv_dim + int64_t(kv_head) * HEAD_DIM + 8 * chunk : 0;
      cp_async_16(stage + uint32_t(i * 16), p.k_cache + offset, valid);
      cp_async_16(stage + uint32_t(kStageBytes + i * 16), p.v_cache + offset, valid);
    }
  };
  // Fill the pipeline: steps 0 .. kStages - 2, one commit group each (empty groups past the last step
  // keep the count uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if (s < num_steps) load_step(s);
    cp_async_commit();
  }

  float q[ROWS][8];
  int limit[ROWS];
  load_query_rows<HEAD_DIM, ROWS>(p, r, kv_head, 0, G, c, q, limit);
  RowStates<ROWS> st;
  st.init();

  // This lane's keys in a step, as in v2: rows warp * GROUPS * 4 + group * 4 + u, dims [8c, 8c + 8).
  const int lane_row = (warp * L::GROUPS + group) * kKeysPerGroup;
  for (int s = 0; s < num_steps; s++) {
    cp_async_wait<kStages - 2>();  // groups 0 .. s are complete: step s is in, for this thread's copies
    __syncthreads();  // ... and for every thread; and every warp is done with step s - 1, whose stage refills now
    if (s + kStages - 1 < num_steps) load_step(s + kStages - 1);
    cp_async_commit();
    const unsigned char* stage = smem + (s % kStages) * 2 * kStageBytes;
    uint4 k_raw[kKeysPerGroup], v_raw[kKeysPerGroup];
#pragma unroll
    for (int u = 0; u < kKeysPerGroup; u++) {
      const int i = (lane_row + u) * L::KG + c;  // element index in the stage, as load_step numbered it
      k_raw[u] = reinterpret_cast<const uint4*>(stage)[i];
      v_raw[u] = reinterpret_cast<const uint4*>(stage + kStageBytes)[i];
    }
    attend_keys<L::KG, ROWS>(st, q, limit, key_begin + s * L::kStepKeys + lane_row, key_end, k_raw, v_raw);
  }

  if (reduce_block<HEAD_DIM, ROWS>(st)) store_partials<HEAD_DIM, ROWS>(p, seq, st, kv_head, partition, c);
}

}  // namespace

void launch_v6_pipelined_decode(const AttentionParams& p, const LaunchDims& dims, cudaStream_t stream) {
  const dim3 grid(unsigned(p.max_partitions), unsigned(p.num_kv_heads), unsigned(dims.num_seqs));
  with_head_dim_and_rows(p.head_dim, decode_rows(p.num_heads / p.num_kv_heads), [&](auto head_dim, auto rows) {
    constexpr int kHeadDim = decltype(head_dim)::value;
    auto kernel = attention_v6_pipelined_decode_kernel<kHeadDim, decltype(rows)::value>;
    const int smem_bytes = kStages * 2 * LaneLayout<kHeadDim>::kStepKeys * kHeadDim * 2;
    static PerDeviceOnce once;  // one for each kernel this generic lambda is instantiated for
    allow_dynamic_shared_memory(once, reinterpret_cast<const void*>(kernel), smem_bytes);
    kernel<<<grid, kWarps * 32, smem_bytes, stream>>>(p);
  });
  launch_decode_combine(p, dims.num_seqs, stream);
}

}  // namespace nanovllm
