// all_reduce_events.cu: v1 of the GPU collectives, stream-ordered: the ranks wait for each other through
// CUDA events and a host barrier, and a plain kernel does the arithmetic. Read it before v2, the one-shot
// kernel of all_reduce.cu, which does the same four steps with flags in memory instead.
//
// The tools, all of them ordinary CUDA:
//   cudaEventRecord(e, s)       e marks "everything queued on stream s so far"
//   cudaStreamWaitEvent(s, e)   what is queued on s from now on starts only once e's work is done; e may
//                               belong to another stream, even to another GPU; the wait is on the GPU, the
//                               calling thread does not wait
//   Barrier::wait()             the N rank threads meet (communicator.h): once it returns, every rank's
//                               cudaEventRecord before it has been issued. A wait sees the last record
//                               issued: without the barrier it could see the previous call's record, or
//                               none, and not wait for this call's work at all
//
// all_reduce, rank i of N, on its stream s_i; x[r] is rank r's (n,) bf16 tensor:
//   1. start   record ready[i] on s_i                 x[i] is written (by what came before on s_i)
//              barrier                                every rank has recorded its ready event
//              s_i waits for ready[r], every peer r   every x[r] is written
//   2. sum     tmp[i] = x[0] + x[1] + ... + x[N-1]    fp32, in rank order, rounded once (all_reduce_cpu)
//   3. end     record read[i] on s_i                  rank i has read every x[r]
//              barrier                                every rank has recorded its read event
//              s_i waits for read[r], every peer r    no rank reads x[i] any more
//   4. copy    x[i] = tmp[i]
// The sum cannot go straight into x[i]: a slower peer may still be reading x[i] for its own sum. Step 3
// is the end barrier of v2.
//
// Why an event may be recorded again at the next call: ready[r] is re-recorded at step 1 of the next
// call, after rank r's second barrier of this one, which every peer reaches only after its step-1 waits;
// read[r] at step 3 of the next call, after its first barrier, which every peer reaches only after its
// step-3 waits of this call. So a wait always sees the record of its own call.
//
// gather, rank i; shards[r] is rank r's (rows, shard_cols) fp32, out rank 0's (rows, out_cols): record
// ready[i]; barrier; rank 0 waits for every ready[r], copies each shard's kept columns into out and records
// read[0]; barrier; every other rank waits for read[0] (its shard may be overwritten once rank 0 has
// copied it). The same reasoning lets the events be recorded again, whichever collective comes next.
//
// What this costs: two host barriers per call (the rank threads wait for each other twice at every
// collective, and a decode step of Qwen3-0.6B has 58: 57 all-reduces and the gather), and cross-stream
// event waits, which a CUDA graph captured by one rank cannot hold: eager only. What it buys: every wait
// on the GPU is for work submitted before it (the barrier sees to that), and no kernel waits inside itself
// for another one, as v2's do. So the GPU may run the ranks' work in any order that respects the waits,
// even one kernel at a time: nothing deadlocks, whatever else runs on the GPU, and compute-sanitizer,
// which runs one kernel at a time, checks it like any other code.
#include <algorithm>

#include "06_tensor_parallel/all_reduce.h"

namespace nanovllm {

namespace {

constexpr int kMaxRanks = CudaCommunicator::kMaxRanks;
constexpr int kThreads = 256;
constexpr int kMaxGrid = 1024;  // blocks; a grid-stride loop covers any n

// Blocks for a grid-stride loop over `elements`: one thread each, at most kMaxGrid blocks.
int grid_for(int64_t elements) { return int(std::clamp<int64_t>(ceil_div<int64_t>(elements, kThreads), 1, kMaxGrid)); }

// Every rank's input, by value: a kernel's arguments are copied to the device at launch.
struct RankInputs {
  const bf16* x[kMaxRanks];  // x[r]: rank r's (n,) bf16, on rank r's device (peer memory is read directly)
};

// out (n,) = x[0] + x[1] + ... + x[world-1], element by element: added in fp32 in rank order, starting
// from rank 0's value (-0 + -0 stays -0), rounded once to bf16. The same arithmetic as all_reduce_cpu and
// as v2, so every version gives the same bits.
__global__ void sum_in_rank_order_kernel(bf16* out, RankInputs in, int world, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float sum = __bfloat162float(in.x[0][i]);
    // Unrolled, so that in.x[r] has a constant index: a run-time index into a kernel argument array
    // would copy the whole array to local memory.
#pragma unroll
    for (int r = 1; r < kMaxRanks; r++)
      if (r < world) sum += __bfloat162float(in.x[r][i]);
    out[i] = __float2bfloat16_rn(sum);
  }
}

// out (rows, cols) with row stride out_stride = shard (rows, cols) with row stride shard_stride: one
// rank's kept columns put in place (shard may be a peer's memory).
__global__ void copy_columns_kernel(float* out, int64_t out_stride, const float* shard, int64_t shard_stride,
                                    int rows, int cols) {
  const int64_t total = int64_t(rows) * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols, col = i % cols;
    out[row * out_stride + col] = shard[row * shard_stride + col];
  }
}

// Cross-rank event waits cannot be part of one rank's captured graph: refuse before touching the barrier
// (every rank capturing refuses alike, so none is left waiting there).
void refuse_capture(cudaStream_t stream, const char* collective) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone)
    fail("CudaCommunicator::", collective, ": the stream-ordered collectives (events) cannot be captured in a CUDA "
         "graph; run eagerly, or use the spinning ones");
}

}  // namespace

void CudaCommunicator::all_reduce_events(int rank, bf16* const* x, int64_t n, cudaStream_t stream) {
  const int world = world_size();
  refuse_capture(stream, "all_reduce");
  // 1. start: every rank's x is written.
  CUDA_CHECK(cudaEventRecord(ready_[size_t(rank)], stream));
  barrier_.wait();
  for (int r = 0; r < world; r++)
    if (r != rank) CUDA_CHECK(cudaStreamWaitEvent(stream, ready_[size_t(r)], 0));
  // 2. sum, into this rank's temporary.
  RankInputs in{};
  for (int r = 0; r < world; r++) in.x[r] = x[r];
  bf16* tmp = tmp_[size_t(rank)];
  sum_in_rank_order_kernel<<<grid_for(n), kThreads, 0, stream>>>(tmp, in, world, n);
  CUDA_CHECK_LAUNCH();
  // 3. end: no rank reads any x any more.
  CUDA_CHECK(cudaEventRecord(read_[size_t(rank)], stream));
  barrier_.wait();
  for (int r = 0; r < world; r++)
    if (r != rank) CUDA_CHECK(cudaStreamWaitEvent(stream, read_[size_t(r)], 0));
  // 4. copy back.
  CUDA_CHECK(cudaMemcpyAsync(x[rank], tmp, size_t(n) * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
}

void CudaCommunicator::gather_events(int rank, const float* const* shards, int rows, int shard_cols, float* out,
                                     int out_cols, cudaStream_t stream) {
  const int world = world_size();
  refuse_capture(stream, "gather");
  // Start: every rank's shard is written.
  CUDA_CHECK(cudaEventRecord(ready_[size_t(rank)], stream));
  barrier_.wait();
  if (rank == 0) {
    for (int r = 1; r < world; r++) CUDA_CHECK(cudaStreamWaitEvent(stream, ready_[size_t(r)], 0));
    // Rank r's columns go to [r * shard_cols, r * shard_cols + width): the last shard is cut at out_cols
    // (a vocabulary padded to a multiple of N), or left out entirely.
    for (int r = 0; r < world; r++) {
      const int width = std::min(shard_cols, out_cols - r * shard_cols);
      if (width <= 0) continue;
      copy_columns_kernel<<<grid_for(int64_t(rows) * width), kThreads, 0, stream>>>(out + int64_t(r) * shard_cols,
                                                                                     out_cols, shards[r], shard_cols,
                                                                                     rows, width);
      CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(cudaEventRecord(read_[0], stream));
  }
  // End: rank 0 has read every shard.
  barrier_.wait();
  if (rank != 0) CUDA_CHECK(cudaStreamWaitEvent(stream, read_[0], 0));
}

}  // namespace nanovllm
