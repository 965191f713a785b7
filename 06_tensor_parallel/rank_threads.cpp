// rank_threads.cpp: post a job, let every rank run it, wait for all.
#include "06_tensor_parallel/rank_threads.h"

namespace nanovllm {

RankThreads::RankThreads(int world_size, std::function<void()> on_failure)
    : world_size_(world_size), on_failure_(std::move(on_failure)) {
  for (int r = 1; r < world_size; r++) threads_.emplace_back(&RankThreads::worker, this, r);
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  job_posted_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::record_failure(std::exception_ptr e) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    first = !failure_;
    if (first) failure_ = e;
  }
  if (first && on_failure_) on_failure_();
}

void RankThreads::worker(int rank) {
  uint64_t done = 0;  // the last job this worker ran
  while (true) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      job_posted_.wait(lock, [&] { return stopping_ || job_id_ != done; });
      if (stopping_) return;
      done = job_id_;
      job = job_;
    }
    try {
      (*job)(rank);
    } catch (...) {
      record_failure(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--running_ == 0) job_done_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int rank)>& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &job;
    running_ = world_size_ - 1;
    failure_ = nullptr;
    job_id_++;
  }
  job_posted_.notify_all();
  try {
    job(0);
  } catch (...) {
    record_failure(std::current_exception());
  }
  std::unique_lock<std::mutex> lock(mutex_);
  job_done_.wait(lock, [&] { return running_ == 0; });
  if (failure_) std::rethrow_exception(failure_);
}

}  // namespace nanovllm
