// communicator.h: how the tensor-parallel ranks of one process add up their partial results on the
// CPU (nano-vllm: torch.distributed's all_reduce and gather over NCCL, one process per GPU). Here the
// ranks are threads of one process: rank r's thread calls each collective with its own buffer, and the
// call returns once every rank has taken part. The CUDA collectives are in all_reduce.h.
//
// Every rank calls every collective in the same order with the same sizes (they run the same model on
// the same inputs, so they do).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace nanovllm {

// A reusable barrier for a fixed number of threads: wait() returns once all of them have called it.
// abort() (a rank failed and will never arrive) makes every wait, now and later, throw Error.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait();
  void abort();

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  const int count_;
  int waiting_ = 0;
  uint64_t generation_ = 0;  // advances when the last thread arrives: who waits for which round
  bool aborted_ = false;
};

class CpuCommunicator {
 public:
  // world_size ranks (at least 1, else Error), each calling every collective from its own thread.
  explicit CpuCommunicator(int world_size);

  // x (n,) of every rank becomes the elementwise sum over ranks, added in rank order 0, 1, ..., N-1, so
  // that every rank holds the same bits.
  void all_reduce(int rank, float* x, int64_t n);

  // Rank 0's out (rows, out_cols) = the ranks' shards (rows, shard_cols) side by side, rank r's columns
  // starting at r * shard_cols, cut at out_cols (a vocabulary padded to a multiple of N is cut back).
  // Every rank calls it; only rank 0 writes (out is ignored on the others).
  void gather(int rank, const float* shard, int rows, int shard_cols, float* out, int out_cols);

  // A rank failed: the others, waiting for it in a collective, throw instead of waiting forever.
  void abort() { barrier_.abort(); }

 private:
  const int world_size_;
  Barrier barrier_;
  std::vector<const float*> published_;  // (world_size,): each rank's buffer, for the others to read
};

}  // namespace nanovllm
