// The CUDA collectives against the CPU references, bit for bit, with N ranks as the engine runs them: one
// host thread and one non-blocking stream per rank, in one process. Ch06_AllReduceCuda tests the spinning
// one-shot kernels (v2, all_reduce.cu, the default); Ch06_AllReduceCudaEvents runs the same checks on the
// stream-ordered collectives (v1, all_reduce_events.cu), which compute-sanitizer can run (tests/gpu_check.sh,
// phase sanitize), and the spinning ones cannot.
//
//   SizesOnOneGpu       N = 2, 3, 4 ranks sharing a GPU; n = 1, 7, 8, 1000, 4097, 262144, 1 << 20 (the
//                       8-wide loads and the scalar tail), and a misaligned x (element by element)
//   ManyCallsOnOneGpu   250 calls of random sizes with fresh inputs, a fifth of them gathers: the per-block
//                       call counters stay in step whatever the grid size
//   GatherOnOneGpu      shard_cols not dividing out_cols (the padding cut), a shard cut away entirely,
//                       float4 and scalar copies, a 151936-column row
//   CudaGraphOnOneGpu   each rank captures two all-reduces and a gather (thread-local capture mode) and
//                       replays them 50 times with new inputs in the same buffers
//   ErrorsAndOneRank    bad arguments are Errors, thrown before anything is launched; one rank is a no-op
//   OneRankPerGpu       the same with rank r on device r, and two ranks per device (2+ GPUs, else skipped)
// Events only:
//   CaptureIsRefused    a call inside a stream capture is an Error on every rank, before any rank waits
//   AFailedRankDoesNotHangItsPeers   a rank that never comes: abort() makes its peers throw
//
// Inputs (all_reduce_test_inputs.h) make a wrong order of addition change many sums. A rank thread that
// fails must not hang the others: its peers' kernels trap after kSpinTimeout (spin), its peers waiting at
// the communicator's host barrier throw once it aborts the communicator (events), and the test's own host
// barrier it breaks throws in the others.
#include <gtest/gtest.h>

#ifdef NANOVLLM_CUDA
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "06_tensor_parallel/all_reduce.h"
#include "06_tensor_parallel/all_reduce_test_inputs.h"
#include "tests/cuda_test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

constexpr double kSpinTimeout = 5;  // seconds: a rank that never comes fails a test in 5 s, not never

using Collectives = CudaCommunicator::Collectives;
constexpr Collectives kSpin = Collectives::kSpin, kEvents = Collectives::kEvents;
const char* name(Collectives c) { return c == kSpin ? "spin" : "events"; }

// A barrier for the rank threads. A rank that fails breaks it, and then every wait throws instead of
// waiting for a rank that will not come.
class HostBarrier {
 public:
  explicit HostBarrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (broken_) fail("a rank failed");
    const int generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0, generation_++;
      changed_.notify_all();
      return;
    }
    if (!changed_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != generation || broken_; }))
      fail("the host barrier waited 60 s");
    if (broken_) fail("a rank failed");
  }
  void break_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_, arrived_ = 0, generation_ = 0;
  bool broken_ = false;
};

// The ranks of one test: a device, a non-blocking stream and a pinned staging buffer each, and device
// buffers. Made, and destroyed, on the main thread while no rank thread runs: cudaMalloc and cudaFree may
// wait for the whole device, which would wait for a spinning collective.
class Ranks {
 public:
  // staging_bytes: the largest host <-> device copy of one rank.
  Ranks(std::vector<int> devices, size_t staging_bytes) : devices_(std::move(devices)), barrier_(world()) {
    for (int d : devices_) {
      CUDA_CHECK(cudaSetDevice(d));
      cudaStream_t stream;
      // Non-blocking: a blocking stream waits for the legacy default stream, which waits for every
      // blocking stream, a peer's spinning collective included.
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      streams_.push_back(stream);
      void* staging = nullptr;
      CUDA_CHECK(cudaHostAlloc(&staging, std::max<size_t>(staging_bytes, 1), cudaHostAllocPortable));
      staging_.push_back(staging);
    }
    CUDA_CHECK(cudaSetDevice(devices_[0]));
  }
  ~Ranks() {
    for (auto [device, ptr] : buffers_) cudaSetDevice(device), cudaFree(ptr);
    for (size_t r = 0; r < streams_.size(); r++) cudaStreamDestroy(streams_[r]), cudaFreeHost(staging_[r]);
    cudaSetDevice(devices_[0]);
  }
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  int world() const { return int(devices_.size()); }
  cudaStream_t stream(int rank) const { return streams_[size_t(rank)]; }

  // One (count,) T buffer per rank, on its device: result[r] is rank r's.
  template <class T>
  std::vector<T*> alloc(size_t count) {
    std::vector<T*> out;
    for (int d : devices_) {
      CUDA_CHECK(cudaSetDevice(d));
      T* ptr = nullptr;
      CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T)));
      buffers_.push_back({d, ptr});
      out.push_back(ptr);
    }
    CUDA_CHECK(cudaSetDevice(devices_[0]));
    return out;
  }

  // Host -> rank's device and back, on the rank's stream, through its pinned buffer. Pageable copies
  // would stage through the driver's own buffers, which might make one rank's copy wait for another's.
  // (No cudaMemset in the rank threads either: a memset may be a kernel, and the first launch of a
  // kernel may wait for the device, where a peer's collective spins.)
  template <class T>
  void put(int rank, T* device_dst, const std::vector<T>& host) {
    if (host.empty()) return;
    std::memcpy(staging_[size_t(rank)], host.data(), host.size() * sizeof(T));
    CUDA_CHECK(cudaMemcpyAsync(device_dst, staging_[size_t(rank)], host.size() * sizeof(T), cudaMemcpyHostToDevice,
                               stream(rank)));
    CUDA_CHECK(cudaStreamSynchronize(stream(rank)));  // the staging buffer is free again
  }
  // A read-back must not overlap a peer's next collective (all_reduce.h: a device-to-host copy may then
  // never complete): every check waits at barrier() after its reads, before the next call's launches.
  template <class T>
  std::vector<T> get(int rank, const T* device_src, size_t count) {
    if (count == 0) return {};
    CUDA_CHECK(cudaMemcpyAsync(staging_[size_t(rank)], device_src, count * sizeof(T), cudaMemcpyDeviceToHost, stream(rank)));
    CUDA_CHECK(cudaStreamSynchronize(stream(rank)));
    std::vector<T> host(count);
    std::memcpy(host.data(), staging_[size_t(rank)], count * sizeof(T));
    return host;
  }

  // Every rank waits here for the others (only inside run's body).
  void barrier() { barrier_.wait(); }

  // Runs body(rank) on one thread per rank, the rank's device current, and joins them. Returns one line
  // per rank that threw. A rank that throws aborts comm, so that peers waiting for it there throw too.
  std::vector<std::string> run(CudaCommunicator& comm, const std::function<void(int rank)>& body) {
    std::vector<std::string> errors(devices_.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < world(); r++)
      threads.emplace_back([&, r] {
        try {
          CUDA_CHECK(cudaSetDevice(devices_[size_t(r)]));
          body(r);
        } catch (const std::exception& e) {
          errors[size_t(r)] = "rank " + std::to_string(r) + ": " + e.what();
          barrier_.break_all();
          comm.abort();
        }
      });
    for (std::thread& t : threads) t.join();
    std::vector<std::string> failed;
    for (const std::string& e : errors)
      if (!e.empty()) failed.push_back(e);
    return failed;
  }

 private:
  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;   // (N,) rank r's stream, on devices_[r]
  std::vector<void*> staging_;          // (N,) rank r's pinned (staging_bytes,) buffer
  std::vector<std::pair<int, void*>> buffers_;  // (device, pointer) of every alloc
  HostBarrier barrier_;
};

std::string lines(const std::vector<std::string>& errors) {
  std::string s;
  for (const std::string& e : errors) s += "\n  " + e;
  return s;
}

// "" when got and want hold the same bits, else how many elements differ and the first one.
template <class T>
std::string compare_bits(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return "got " + std::to_string(got.size()) + " elements, want " + std::to_string(want.size());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < want.size(); i++)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = i;
  if (differ == 0) return "";
  auto value = [](const T& v) {
    if constexpr (sizeof(T) == 2) return double(bf16_to_float(uint16_t(v)));
    else return double(v);
  };
  return std::to_string(differ) + " of " + std::to_string(want.size()) + " elements differ, the first at " +
         std::to_string(first) + ": got " + std::to_string(value(got[first])) + ", want " +
         std::to_string(value(want[first]));
}

std::vector<float> gather_reference(const std::vector<std::vector<float>>& shards, int rows, int shard_cols,
                                     int out_cols) {
  std::vector<const float*> ptrs;
  for (const auto& s : shards) ptrs.push_back(s.data());
  std::vector<float> out(size_t(rows) * out_cols);
  gather_cpu(out.data(), ptrs.data(), int(shards.size()), rows, shard_cols, out_cols);
  return out;
}

std::vector<std::vector<float>> random_shards(int world, int rows, int shard_cols, Rng& rng) {
  std::vector<std::vector<float>> shards;
  for (int r = 0; r < world; r++) shards.push_back(random_vector(size_t(rows) * shard_cols, rng));
  return shards;
}

uint16_t* bits(bf16* p) { return reinterpret_cast<uint16_t*>(p); }

// ---------------------------------------------------------------------------------------------------
// The checks, for any placement of the ranks on devices

void check_sizes(const std::vector<int>& devices, Collectives how) {
  const int world = int(devices.size());
  const int64_t max_n = 1 << 20;
  CudaCommunicator comm(devices, max_n, how, kSpinTimeout);
  Ranks ranks(devices, size_t(max_n) * sizeof(uint16_t));
  std::vector<bf16*> x = ranks.alloc<bf16>(size_t(max_n) + 8);  // + 8: room for a misaligned view
  struct Call {
    int64_t n;
    int offset;  // elements by which the last rank's x is moved: 1 = 2 bytes, no 16-byte loads
    std::vector<std::vector<uint16_t>> in;  // (world, n)
  };
  Rng rng(uint64_t(100 + world));
  std::vector<Call> calls;
  for (int64_t n : {1, 7, 8, 1000, 4097, 262144, 1 << 20}) calls.push_back({n, 0, reduce_inputs(world, n, rng)});
  for (int64_t n : {7, 1000, 4097}) calls.push_back({n, 1, reduce_inputs(world, n, rng)});

  std::vector<std::vector<std::vector<uint16_t>>> got(size_t(world), std::vector<std::vector<uint16_t>>(calls.size()));
  std::vector<std::string> errors = ranks.run(comm, [&](int rank) {
    for (size_t c = 0; c < calls.size(); c++) {
      std::vector<bf16*> view = x;
      view[size_t(world - 1)] += calls[c].offset;
      ranks.put(rank, bits(view[size_t(rank)]), calls[c].in[size_t(rank)]);
      comm.all_reduce(rank, view.data(), calls[c].n, ranks.stream(rank));
      got[size_t(rank)][c] = ranks.get(rank, bits(view[size_t(rank)]), size_t(calls[c].n));
      ranks.barrier();  // no rank starts the next call while a peer still reads back (get)
    }
  });
  ASSERT_TRUE(errors.empty()) << lines(errors);
  for (size_t c = 0; c < calls.size(); c++) {
    const std::vector<uint16_t> want = reduce_reference(calls[c].in);
    for (int r = 0; r < world; r++)
      EXPECT_EQ(compare_bits(got[size_t(r)][c], want), "")
          << name(how) << ", " << world << " ranks, n " << calls[c].n << ", offset " << calls[c].offset << ", rank " << r;
  }
}

void check_many_calls(const std::vector<int>& devices, Collectives how) {
  const int world = int(devices.size());
  const int64_t max_n = 40000;
  const int max_rows = 4, max_shard_cols = 3000;
  CudaCommunicator comm(devices, max_n, how, kSpinTimeout);
  Ranks ranks(devices, size_t(max_rows) * max_shard_cols * world * sizeof(float));
  std::vector<bf16*> x = ranks.alloc<bf16>(size_t(max_n));
  std::vector<float*> shards = ranks.alloc<float>(size_t(max_rows) * max_shard_cols);
  std::vector<float*> out = ranks.alloc<float>(size_t(max_rows) * max_shard_cols * world);  // out[0] is used
  struct Call {
    bool gather;
    int64_t n;                                // all-reduce
    std::vector<std::vector<uint16_t>> in;    // (world, n)
    int rows, shard_cols, out_cols;           // gather
    std::vector<std::vector<float>> logits;   // (world, rows * shard_cols)
  };
  Rng rng(uint64_t(200 + world));
  std::vector<Call> calls(250);
  for (Call& c : calls) {
    c.gather = rng.below(5) == 0;
    if (c.gather) {
      c.rows = 1 + rng.below(max_rows), c.shard_cols = 1 + rng.below(max_shard_cols);
      c.out_cols = (world - 1) * c.shard_cols + 1 + rng.below(c.shard_cols);  // up to world * shard_cols
      c.logits = random_shards(world, c.rows, c.shard_cols, rng);
    } else {
      const int64_t limits[] = {64, 8192, max_n + 1};  // small, medium and large, equally often
      c.n = int64_t(rng.next() % uint64_t(limits[rng.below(3)]));  // 0 included
      c.in = reduce_inputs(world, c.n, rng);
    }
  }

  std::vector<std::vector<std::vector<uint16_t>>> got(size_t(world), std::vector<std::vector<uint16_t>>(calls.size()));
  std::vector<std::vector<float>> gathered(calls.size());
  std::vector<std::string> errors = ranks.run(comm, [&](int rank) {
    const cudaStream_t stream = ranks.stream(rank);
    for (size_t i = 0; i < calls.size(); i++) {
      const Call& c = calls[i];
      if (c.gather) {
        ranks.put(rank, shards[size_t(rank)], c.logits[size_t(rank)]);
        const size_t out_elems = size_t(c.rows) * c.out_cols;
        if (rank == 0) ranks.put(rank, out[0], std::vector<float>(out_elems, NAN));  // an element not written shows
        comm.gather(rank, shards.data(), c.rows, c.shard_cols, rank == 0 ? out[0] : nullptr, c.out_cols, stream);
        if (rank == 0) gathered[i] = ranks.get(rank, out[0], out_elems);
      } else {
        ranks.put(rank, bits(x[size_t(rank)]), c.in[size_t(rank)]);
        comm.all_reduce(rank, x.data(), c.n, stream);
        got[size_t(rank)][i] = ranks.get(rank, bits(x[size_t(rank)]), size_t(c.n));
      }
      ranks.barrier();  // no rank starts the next call while a peer still reads back (get)
    }
  });
  ASSERT_TRUE(errors.empty()) << lines(errors);
  for (size_t i = 0; i < calls.size(); i++) {
    const Call& c = calls[i];
    if (c.gather) {
      EXPECT_EQ(compare_bits(gathered[i], gather_reference(c.logits, c.rows, c.shard_cols, c.out_cols)), "")
          << name(how) << ", " << world << " ranks, call " << i << ": gather of " << c.rows << " x " << c.shard_cols
          << " cut at " << c.out_cols;
    } else {
      const std::vector<uint16_t> want = reduce_reference(c.in);
      for (int r = 0; r < world; r++)
        EXPECT_EQ(compare_bits(got[size_t(r)][i], want), "")
            << name(how) << ", " << world << " ranks, call " << i << ": n " << c.n << ", rank " << r;
    }
  }
}

void check_gather(const std::vector<int>& devices, Collectives how) {
  const int world = int(devices.size());
  struct Case { int rows, shard_cols, out_cols; };
  const int vocab = 151936, vocab_shard = (vocab + world - 1) / world;  // padded to a multiple of world
  const std::vector<Case> cases = {
      {3, 10, world * 10 - (world - 1)},  // scalar copies (10 columns), the padding cut
      {5, 64, world * 64 - 4},            // float4 copies, the last shard cut by 4
      {2, 64, world * 64 - 3},            // scalar: out_cols is not a multiple of 4
      {2, 10, (world - 1) * 10},          // the last shard cut away entirely
      {4, 1, world},                      // one column per rank
      {1, vocab_shard, vocab},            // a decode row of Qwen3's vocabulary
      {3, vocab_shard, vocab},
  };
  size_t largest = 0;
  for (const Case& c : cases) largest = std::max(largest, size_t(c.rows) * c.shard_cols * world);
  CudaCommunicator comm(devices, 0, how, kSpinTimeout);
  Ranks ranks(devices, largest * sizeof(float));
  std::vector<float*> shards = ranks.alloc<float>(largest);
  std::vector<float*> out = ranks.alloc<float>(largest);
  Rng rng(uint64_t(300 + world));
  std::vector<std::vector<std::vector<float>>> logits;
  for (const Case& c : cases) logits.push_back(random_shards(world, c.rows, c.shard_cols, rng));

  std::vector<std::vector<float>> got(cases.size());
  std::vector<std::string> errors = ranks.run(comm, [&](int rank) {
    for (size_t i = 0; i < cases.size(); i++) {
      const Case& c = cases[i];
      ranks.put(rank, shards[size_t(rank)], logits[i][size_t(rank)]);
      const size_t out_elems = size_t(c.rows) * c.out_cols;
      if (rank == 0) ranks.put(rank, out[0], std::vector<float>(out_elems, NAN));
      comm.gather(rank, shards.data(), c.rows, c.shard_cols, rank == 0 ? out[0] : nullptr, c.out_cols, ranks.stream(rank));
      if (rank == 0) got[i] = ranks.get(rank, out[0], out_elems);
      ranks.barrier();  // no rank starts the next call while a peer still reads back (get)
    }
  });
  ASSERT_TRUE(errors.empty()) << lines(errors);
  for (size_t i = 0; i < cases.size(); i++) {
    const Case& c = cases[i];
    EXPECT_EQ(compare_bits(got[i], gather_reference(logits[i], c.rows, c.shard_cols, c.out_cols)), "")
        << name(how) << ", " << world << " ranks: " << c.rows << " rows of " << c.shard_cols << " columns cut at "
        << c.out_cols;
  }
}

// Spin only: the stream-ordered collectives refuse a capture (CaptureIsRefused).
void check_graph(const std::vector<int>& devices) {
  const int world = int(devices.size());
  const int64_t n1 = 4097, n2 = 1000;  // two grids: 2 blocks with a scalar tail, and 1 block
  const int rows = 2, shard_cols = 37, out_cols = world * shard_cols - 1;
  const int replays = 50;
  CudaCommunicator comm(devices, n1, kSpin, kSpinTimeout);
  Ranks ranks(devices, size_t(n1) * sizeof(uint16_t) + size_t(rows) * out_cols * sizeof(float));
  std::vector<bf16*> x1 = ranks.alloc<bf16>(size_t(n1)), x2 = ranks.alloc<bf16>(size_t(n2));
  std::vector<float*> shards = ranks.alloc<float>(size_t(rows) * shard_cols);
  std::vector<float*> out = ranks.alloc<float>(size_t(rows) * out_cols);
  // Inputs of step k: k = 0 eager before the capture, 1..replays the replays, replays + 1 eager after.
  struct Step {
    std::vector<std::vector<uint16_t>> in1, in2;
    std::vector<std::vector<float>> logits;
  };
  Rng rng(uint64_t(400 + world));
  std::vector<Step> steps(replays + 2);
  for (Step& s : steps)
    s.in1 = reduce_inputs(world, n1, rng), s.in2 = reduce_inputs(world, n2, rng),
    s.logits = random_shards(world, rows, shard_cols, rng);
  struct Result {
    std::vector<uint16_t> y1, y2;
    std::vector<float> gathered;  // rank 0 only
  };
  std::vector<std::vector<Result>> got(size_t(world), std::vector<Result>(steps.size()));

  std::vector<std::string> errors = ranks.run(comm, [&](int rank) {
    const cudaStream_t stream = ranks.stream(rank);
    float* my_out = rank == 0 ? out[0] : nullptr;
    auto step = [&](size_t k, cudaGraphExec_t graph) {
      ranks.put(rank, bits(x1[size_t(rank)]), steps[k].in1[size_t(rank)]);
      ranks.put(rank, bits(x2[size_t(rank)]), steps[k].in2[size_t(rank)]);
      ranks.put(rank, shards[size_t(rank)], steps[k].logits[size_t(rank)]);
      if (rank == 0) ranks.put(rank, my_out, std::vector<float>(size_t(rows) * out_cols, NAN));
      if (graph) {
        CUDA_CHECK(cudaGraphLaunch(graph, stream));
      } else {
        comm.all_reduce(rank, x1.data(), n1, stream);
        comm.all_reduce(rank, x2.data(), n2, stream);
        comm.gather(rank, shards.data(), rows, shard_cols, my_out, out_cols, stream);
      }
      Result& r = got[size_t(rank)][k];
      r.y1 = ranks.get(rank, bits(x1[size_t(rank)]), size_t(n1));
      r.y2 = ranks.get(rank, bits(x2[size_t(rank)]), size_t(n2));
      if (rank == 0) r.gathered = ranks.get(rank, my_out, size_t(rows) * out_cols);
      ranks.barrier();  // no rank starts the next step while a peer still reads back (get)
    };
    step(0, nullptr);
    // Thread-local capture: the other ranks' threads go on using CUDA meanwhile (as the engine's do).
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    comm.all_reduce(rank, x1.data(), n1, stream);
    comm.all_reduce(rank, x2.data(), n2, stream);
    comm.gather(rank, shards.data(), rows, shard_cols, my_out, out_cols, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    // No rank replays before every rank has instantiated its graph: instantiating is not promised never
    // to wait for the device, which a peer's spinning replay would occupy.
    ranks.barrier();
    for (int k = 1; k <= replays; k++) step(size_t(k), exec);
    step(size_t(replays + 1), nullptr);  // eager again: the counters the replays advanced are still in step
    CUDA_CHECK(cudaGraphExecDestroy(exec));
  });
  ASSERT_TRUE(errors.empty()) << lines(errors);
  for (size_t k = 0; k < steps.size(); k++) {
    const std::vector<uint16_t> want1 = reduce_reference(steps[k].in1), want2 = reduce_reference(steps[k].in2);
    for (int r = 0; r < world; r++) {
      EXPECT_EQ(compare_bits(got[size_t(r)][k].y1, want1), "") << world << " ranks, step " << k << ", rank " << r << ", x1";
      EXPECT_EQ(compare_bits(got[size_t(r)][k].y2, want2), "") << world << " ranks, step " << k << ", rank " << r << ", x2";
    }
    EXPECT_EQ(compare_bits(got[0][k].gathered, gather_reference(steps[k].logits, rows, shard_cols, out_cols)), "")
        << world << " ranks, step " << k << ", gather";
  }
}

// Every rank on the current device.
std::vector<int> one_gpu(int world) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return std::vector<int>(size_t(world), device);
}

// Bad arguments are refused on the host, before anything that would wait for the other rank; one rank
// leaves x as it is and cuts its one shard at out_cols.
void check_errors_and_one_rank(Collectives how) {
  EXPECT_NE(error_of([&] { CudaCommunicator({}, 8, how); }).find("0 ranks"), std::string::npos);
  EXPECT_NE(error_of([&] { CudaCommunicator(std::vector<int>(9, 0), 8, how); }).find("9 ranks"), std::string::npos);
  EXPECT_NE(error_of([&] { CudaCommunicator({0, 1000}, 8, how); }).find("rank 1's device 1000 does not exist"),
            std::string::npos);

  CudaCommunicator comm(one_gpu(2), 100, how, kSpinTimeout);
  DeviceArray<bf16> x0(100), x1(100);
  DeviceArray<float> s0(20), s1(20), out(40);
  bf16* x[] = {x0.ptr, x1.ptr};
  const float* shards[] = {s0.ptr, s1.ptr};
  EXPECT_NE(error_of([&] { comm.all_reduce(0, x, 101, nullptr); }).find("n = 101 (max_elems is 100)"), std::string::npos);
  EXPECT_NE(error_of([&] { comm.all_reduce(2, x, 10, nullptr); }).find("rank 2 of 2"), std::string::npos);
  EXPECT_NE(error_of([&] { comm.gather(0, shards, 2, 10, out.ptr, 21, nullptr); }).find("cannot fill 21 columns"),
            std::string::npos);
  EXPECT_NE(error_of([&] { comm.gather(0, shards, 2, 10, nullptr, 20, nullptr); }).find("rank 0's out is null"),
            std::string::npos);

  // One rank: the all-reduce leaves x as it is; the gather cuts the one shard at out_cols.
  CudaCommunicator alone(one_gpu(1), 100, how, kSpinTimeout);
  Rng rng(5);
  const std::vector<uint16_t> values = reduce_inputs(1, 100, rng)[0];
  CUDA_CHECK(cudaMemcpy(x0.ptr, values.data(), 200, cudaMemcpyHostToDevice));
  alone.all_reduce(0, x, 100, nullptr);
  std::vector<bf16> after = x0.get();
  EXPECT_EQ(std::memcmp(after.data(), values.data(), 200), 0);
  const std::vector<float> logits = random_vector(20, rng);  // (2, 10), cut at 7 columns
  CUDA_CHECK(cudaMemcpy(s0.ptr, logits.data(), 80, cudaMemcpyHostToDevice));
  out.poison();
  alone.gather(0, shards, 2, 10, out.ptr, 7, nullptr);
  std::vector<float> gathered = out.get();
  gathered.resize(14);
  EXPECT_EQ(compare_bits(gathered, gather_reference({logits}, 2, 10, 7)), "") << name(how);
}

// How many GPUs (up to 4) the multi-GPU tests use: 0 or 1 when there are fewer than two, or when two of
// the first four have no peer-to-peer path.
int gpus_with_peer_access() {
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  const int gpus = std::min(count, 4);
  for (int a = 0; a < gpus; a++)
    for (int b = 0; b < gpus; b++) {
      int possible = 1;
      if (a != b) CUDA_CHECK(cudaDeviceCanAccessPeer(&possible, a, b));
      if (!possible) return 1;
    }
  return gpus;
}

}  // namespace

TEST(Ch06_AllReduceCuda, SizesOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3, 4}) check_sizes(one_gpu(world), kSpin);
}

TEST(Ch06_AllReduceCuda, ManyCallsOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3, 4}) check_many_calls(one_gpu(world), kSpin);
}

TEST(Ch06_AllReduceCuda, GatherOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3, 4}) check_gather(one_gpu(world), kSpin);
}

TEST(Ch06_AllReduceCuda, CudaGraphOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3}) check_graph(one_gpu(world));
}

TEST(Ch06_AllReduceCuda, ErrorsAndOneRank) {
  SKIP_WITHOUT_GPU();
  check_errors_and_one_rank(kSpin);
}

TEST(Ch06_AllReduceCuda, OneRankPerGpu) {
  SKIP_WITHOUT_GPU();
  const int gpus = gpus_with_peer_access();
  if (gpus < 2) GTEST_SKIP() << "fewer than two GPUs with peer access to each other";
  std::vector<int> each, shared;  // rank r on device r; 4 ranks two to a GPU, {0, 1, 0, 1}
  for (int d = 0; d < gpus; d++) each.push_back(d);
  for (int r = 0; r < 4; r++) shared.push_back(r % 2);
  check_sizes(each, kSpin);
  check_many_calls(each, kSpin);
  check_gather(each, kSpin);
  check_graph(each);
  check_sizes(shared, kSpin);
  check_many_calls(shared, kSpin);
}

// The same checks on the stream-ordered collectives (v1), which spin nowhere: compute-sanitizer runs these.

TEST(Ch06_AllReduceCudaEvents, SizesOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3, 4}) check_sizes(one_gpu(world), kEvents);
}

TEST(Ch06_AllReduceCudaEvents, ManyCallsOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3, 4}) check_many_calls(one_gpu(world), kEvents);
}

TEST(Ch06_AllReduceCudaEvents, GatherOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (int world : {2, 3, 4}) check_gather(one_gpu(world), kEvents);
}

TEST(Ch06_AllReduceCudaEvents, ErrorsAndOneRank) {
  SKIP_WITHOUT_GPU();
  check_errors_and_one_rank(kEvents);
}

// A CUDA graph cannot hold one rank's half of a cross-stream event wait: every rank refuses alike, before
// the host barrier (no rank is left waiting there), and the capture itself stays valid.
TEST(Ch06_AllReduceCudaEvents, CaptureIsRefused) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = one_gpu(2);
  CudaCommunicator comm(devices, 64, kEvents);
  Ranks ranks(devices, 64 * sizeof(float));
  std::vector<bf16*> x = ranks.alloc<bf16>(64);
  std::vector<float*> shards = ranks.alloc<float>(64);
  std::vector<float*> out = ranks.alloc<float>(128);
  std::vector<std::string> refusals(2);
  std::vector<std::string> errors = ranks.run(comm, [&](int rank) {
    const cudaStream_t stream = ranks.stream(rank);
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    refusals[size_t(rank)] = error_of([&] { comm.all_reduce(rank, x.data(), 64, stream); }) + " | " +
                             error_of([&] { comm.gather(rank, shards.data(), 2, 32, rank == 0 ? out[0] : nullptr, 64, stream); });
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphDestroy(graph));
  });
  ASSERT_TRUE(errors.empty()) << lines(errors);
  for (const std::string& refusal : refusals) {
    EXPECT_NE(refusal.find("all_reduce: the stream-ordered collectives (events) cannot be captured"), std::string::npos)
        << refusal;
    EXPECT_NE(refusal.find("gather: the stream-ordered collectives (events) cannot be captured"), std::string::npos)
        << refusal;
  }
  // Eager calls still work afterwards.
  check_sizes(devices, kEvents);
}

// Rank 1 fails before its first collective. Its peers wait for it on the host, not on the GPU: abort()
// (what RankThreads' on_failure does in the engine, Ranks::run here) lets them out with an Error.
TEST(Ch06_AllReduceCudaEvents, AFailedRankDoesNotHangItsPeers) {
  SKIP_WITHOUT_GPU();
  const std::vector<int> devices = one_gpu(3);
  CudaCommunicator comm(devices, 64, kEvents);
  Ranks ranks(devices, 64 * sizeof(uint16_t));
  std::vector<bf16*> x = ranks.alloc<bf16>(64);
  std::vector<std::string> errors = ranks.run(comm, [&](int rank) {
    if (rank == 1) fail("rank 1 gives up");
    comm.all_reduce(rank, x.data(), 64, ranks.stream(rank));
    CUDA_CHECK(cudaStreamSynchronize(ranks.stream(rank)));
  });
  ASSERT_EQ(errors.size(), 3u) << lines(errors);
  EXPECT_NE(errors[0].find("rank 0: another tensor-parallel rank failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 1: rank 1 gives up"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("rank 2: another tensor-parallel rank failed"), std::string::npos) << errors[2];
}

TEST(Ch06_AllReduceCudaEvents, OneRankPerGpu) {
  SKIP_WITHOUT_GPU();
  const int gpus = gpus_with_peer_access();
  if (gpus < 2) GTEST_SKIP() << "fewer than two GPUs with peer access to each other";
  std::vector<int> each, shared;  // rank r on device r; 4 ranks two to a GPU, {0, 1, 0, 1}
  for (int d = 0; d < gpus; d++) each.push_back(d);
  for (int r = 0; r < 4; r++) shared.push_back(r % 2);
  check_sizes(each, kEvents);
  check_many_calls(each, kEvents);
  check_gather(each, kEvents);
  check_sizes(shared, kEvents);
  check_many_calls(shared, kEvents);
}

#else
TEST(Ch06_AllReduceCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif
