// communicator.cpp: the CPU collectives: publish a pointer, meet at a barrier, read the others.
#include "06_tensor_parallel/communicator.h"

#include <algorithm>

#include "01_sequence/base/common.h"

namespace nanovllm {

void Barrier::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) fail("another tensor-parallel rank failed");
  const uint64_t my_generation = generation_;
  if (++waiting_ == count_) {  // the last to arrive releases this round and resets for the next
    waiting_ = 0;
    generation_++;
    all_arrived_.notify_all();
    return;
  }
  all_arrived_.wait(lock, [&] { return generation_ != my_generation || aborted_; });
  if (generation_ == my_generation) fail("another tensor-parallel rank failed");
}

void Barrier::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  all_arrived_.notify_all();
}

// Checked before the members are built from it: a negative count would size published_ past max_size().
static int at_least_one_rank(int world_size) {
  if (world_size < 1) fail("a communicator needs at least one rank, got ", world_size);
  return world_size;
}

CpuCommunicator::CpuCommunicator(int world_size)
    : world_size_(at_least_one_rank(world_size)), barrier_(world_size_), published_(size_t(world_size_), nullptr) {}

void CpuCommunicator::all_reduce(int rank, float* x, int64_t n) {
  if (world_size_ == 1) return;
  published_[size_t(rank)] = x;
  barrier_.wait();  // every rank's partial result is published
  // In rank order from rank 0's value, as all_reduce_cpu (not from 0.0f: -0 + -0 stays -0).
  std::vector<float> sum(published_[0], published_[0] + n);
  for (int r = 1; r < world_size_; r++) {
    const float* peer = published_[size_t(r)];
    for (int64_t i = 0; i < n; i++) sum[size_t(i)] += peer[i];
  }
  barrier_.wait();  // every rank has read every x: now each may overwrite its own
  std::copy(sum.begin(), sum.end(), x);
  // The next collective's first barrier keeps a fast rank from reading a slow one's buffer before the slow
  // one has copied its sum into it and published its next one: nobody passes it until everybody has arrived.
}

void CpuCommunicator::gather(int rank, const float* shard, int rows, int shard_cols, float* out, int out_cols) {
  published_[size_t(rank)] = shard;
  barrier_.wait();  // every shard is published
  if (rank == 0) {
    for (int r = 0; r < world_size_; r++) {
      const int first = r * shard_cols, cols = std::min(shard_cols, out_cols - first);
      for (int i = 0; i < rows && cols > 0; i++)
        std::copy(published_[size_t(r)] + int64_t(i) * shard_cols, published_[size_t(r)] + int64_t(i) * shard_cols + cols,
                  out + int64_t(i) * out_cols + first);
    }
  }
  barrier_.wait();  // rank 0 has read every shard: each rank may overwrite its own
}

}  // namespace nanovllm
