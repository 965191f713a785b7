// rank_threads.h: one thread per tensor-parallel rank (nano-vllm: one process per GPU; rank 0 calls a
// method on every worker through shared memory and one event per worker, ModelRunner.call and loop).
// Here the ranks share one process: rank 0 runs on the caller's thread, ranks 1..N-1 on threads that
// live as long as this object and wait for the next job.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nanovllm {

class RankThreads {
 public:
  // on_failure runs once when a rank throws, while the others may still be inside a collective waiting
  // for it (the communicator's abort() lets them out).
  explicit RankThreads(int world_size, std::function<void()> on_failure = nullptr);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // Runs job(rank) on every rank at once and returns when all have finished. If any rank threw, the
  // first exception is rethrown here.
  void run(const std::function<void(int rank)>& job);

 private:
  void worker(int rank);
  void record_failure(std::exception_ptr e);

  const int world_size_;
  std::function<void()> on_failure_;
  std::mutex mutex_;
  std::condition_variable job_posted_, job_done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t job_id_ = 0;     // advances with every run(): the job a worker has not run yet
  int running_ = 0;         // workers still running the current job
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::vector<std::thread> threads_;  // ranks 1..N-1
};

}  // namespace nanovllm
