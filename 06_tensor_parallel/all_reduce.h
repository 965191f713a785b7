// all_reduce.h: the collectives of tensor parallelism, written here instead of taken from NCCL
// (nano-vllm: dist.all_reduce in layers/linear.py and layers/embed_head.py, dist.gather in
// layers/embed_head.py).
//
//   all_reduce   every rank's (n,) bf16 tensor becomes the sum over ranks: after each row-parallel layer
//                (o_proj, down_proj) and after the vocab-parallel embedding
//   gather       rank 0 gets every rank's (rows, shard_cols) logits side by side: after the vocab-parallel
//                LM head, so that rank 0 can sample
//
// The N ranks live in one process, one host thread each. The CPU references are plain loops. On the GPU
// every rank reads its peers' buffers directly, in one of two ways (CudaCommunicator::Collectives):
//   v1 events  (all_reduce_events.cu) stream-ordered: CUDA events and a host barrier order the ranks'
//              streams, then a plain kernel adds; eager only; what compute-sanitizer can run
//   v2 spin    (all_reduce.cu) one kernel per collective, synchronised by flags in memory that every rank
//              can address; capturable in CUDA graphs; the default
#pragma once

#include <cstdint>
#include <vector>

#include "01_sequence/base/common.h"

namespace nanovllm {

// x[r]: rank r's (n,) bf16 values (raw bits), for r < world. out (n,): x[0] + x[1] + ... + x[world-1],
// added in fp32 in that order and rounded once to bf16. This is what every rank holds after
// CudaCommunicator::all_reduce, bit for bit (fp32 addition is not associative: the order is part of the
// result).
void all_reduce_cpu(uint16_t* out, const uint16_t* const* x, int world, int64_t n);

// shards[r]: rank r's (rows, shard_cols). out (rows, out_cols): the shards side by side, rank r's columns
// starting at r * shard_cols, cut at out_cols (a vocabulary padded to a multiple of world is cut back).
void gather_cpu(float* out, const float* const* shards, int world, int rows, int shard_cols, int out_cols);

}  // namespace nanovllm

#ifdef NANOVLLM_CUDA
#include "01_sequence/base/cuda_utils.h"
#include "06_tensor_parallel/communicator.h"  // Barrier

namespace nanovllm {

// The collectives of the N ranks of one process, each rank on a CUDA device (ranks may share one).
//
// Two ways to make the ranks wait for each other, chosen when the communicator is made; both give the
// same bits (all_reduce_cpu, gather_cpu):
//   kEvents  v1, stream-ordered (all_reduce_events.cu). Each rank records a CUDA event on its stream, the
//            rank threads meet at a host barrier, each rank's stream waits for its peers' events, and a
//            plain kernel adds. The GPU only ever waits for work submitted before the wait, never for a
//            kernel that has yet to start, so it runs under compute-sanitizer (which runs kernels one at
//            a time) and needs none of the rules below but the first; but the host threads meet twice per call, and a CUDA graph cannot capture it
//            (a call during a capture is an Error). Slower; for checking, and to read first.
//   kSpin    v2, one-shot (all_reduce.cu), the default. One kernel per call on every rank, which spins on
//            flags in memory until its peers' kernels arrive: no host synchronisation, capturable.
//
// How to call it (the v2 kernels spin while they wait for their peers, so every rule below is about
// never leaving a peer waiting for something that cannot happen):
//   - Every rank calls every collective, in the same order, with the same sizes, each from its own host
//     thread, on its own stream (one stream per rank: a rank's calls must run one after another).
//   - The buffers (x, shards, out) are the same addresses on every call of a captured CUDA graph (the
//     graph keeps the pointers it was captured with); the communicator's own memory never moves. kSpin
//     calls are capture-safe: no allocation, no host synchronisation, and the call count lives on the
//     device.
//   - kSpin, ranks that share a GPU: create their streams with cudaStreamNonBlocking, and while a peer may
//     be inside a collective, call nothing that waits for the whole device (cudaDeviceSynchronize,
//     cudaFree, work on the legacy default stream) or that may (the first launch of a kernel: the
//     driver may load it or grow the local memory for it; the constructor runs its own kernels once, alone). Such a call waits for the
//     peer's spinning kernel, which waits for this rank: a deadlock, broken only by the spin timeout.
//     Nor copy from the device to the host (cudaMemcpy*, DeviceToHost) while a peer may already be inside
//     the next collective: on an H200, a rank's 2-byte read-back after its first all-reduce, with its
//     peers spinning in the second, now and then never completed (7 of 362 test processes, until the
//     spin timeout; 0 of 342 once the test's ranks met at a host barrier after their reads). Read back
//     after every rank has left the collectives, as the engine does (rank 0 downloads a step's tokens
//     once every rank's job has finished).
// A kSpin kernel that waits longer than spin_timeout_s for a peer prints which barrier, rank and block,
// then traps: the CUDA context is lost, the next CUDA call of every rank fails, nothing hangs. A kEvents
// rank waits for its peers on the host instead, for as long as they take: a rank that fails must call
// abort() (RankThreads' on_failure does), so that its peers throw instead of waiting forever.
class CudaCommunicator {
 public:
  static constexpr int kMaxRanks = 8;
  static constexpr int kMaxBlocks = 32;  // blocks of one kSpin collective's grid, at most

  enum class Collectives {
    kEvents,  // v1: stream-ordered, CUDA events and a host barrier; eager only (all_reduce_events.cu)
    kSpin,    // v2: one-shot kernels that spin on flags; capturable (all_reduce.cu)
  };

  // devices[r]: rank r's CUDA device. Enables peer access between every two distinct devices (an Error
  // naming them if they have no peer-to-peer path). max_elems: the largest all_reduce, in elements.
  // Allocates the flags, call counters and a (max_elems,) bf16 temporary per rank (kEvents: two events
  // per rank), and loads the kernels on every device. Call it, and the destructor, while no collective
  // runs. spin_timeout_s: kSpin only.
  CudaCommunicator(std::vector<int> devices, int64_t max_elems, Collectives collectives = Collectives::kSpin,
                   double spin_timeout_s = 10.0);
  ~CudaCommunicator();
  CudaCommunicator(const CudaCommunicator&) = delete;
  CudaCommunicator& operator=(const CudaCommunicator&) = delete;

  int world_size() const { return int(devices_.size()); }

  // x[r]: rank r's (n,) bf16 tensor on devices[r], for every r (the same array on every rank). Called by
  // rank `rank` on `stream`, a stream of devices[rank]. Afterwards every x[r] holds the sum over ranks,
  // added in fp32 in rank order 0, 1, ..., N-1 and rounded once to bf16 (all_reduce_cpu): every rank holds
  // the same bits. n <= max_elems; x[r] 16-byte aligned is kSpin's fast path (8 elements per load), any
  // other alignment works, element by element.
  void all_reduce(int rank, bf16* const* x, int64_t n, cudaStream_t stream);

  // shards[r]: rank r's (rows, shard_cols) fp32 on devices[r], for every r. Rank 0's out (rows, out_cols),
  // on devices[0]: the shards side by side, rank r's columns from r * shard_cols, cut at out_cols <=
  // N * shard_cols (gather_cpu). Every rank calls it; only rank 0 writes (out is ignored elsewhere and may
  // be null). On every rank's stream it completes only once rank 0 has read everything, so a shard may be
  // overwritten by the next operation on its rank's stream.
  void gather(int rank, const float* const* shards, int rows, int shard_cols, float* out, int out_cols,
              cudaStream_t stream);

  // A rank failed and will make no more calls: kEvents peers waiting for it at the host barrier, now or
  // later, throw Error instead of waiting forever. (kSpin kernels time out on the device instead.)
  void abort() { barrier_.abort(); }

 private:
  void release() noexcept;
  void warm_up();  // each kernel once per device, alone, before any rank can spin (all_reduce.cu)
  // v1, all_reduce_events.cu: the same contracts as all_reduce and gather, arguments already checked,
  // n > 0 and N > 1, devices[rank] current.
  void all_reduce_events(int rank, bf16* const* x, int64_t n, cudaStream_t stream);
  void gather_events(int rank, const float* const* shards, int rows, int shard_cols, float* out, int out_cols,
                     cudaStream_t stream);

  std::vector<int> devices_;      // (N,) rank r's device
  int64_t max_elems_;
  Collectives collectives_;
  uint64_t spin_timeout_ns_;
  int max_blocks_;  // kSpin blocks per collective: 32, or fewer where the ranks sharing a GPU would not all fit
  std::vector<uint32_t*> flags_;     // (N,) rank r's flag slots on devices[r], (2, kMaxBlocks, kMaxRanks)
  std::vector<uint32_t*> counters_;  // (N,) rank r's per-block call counters on devices[r], (kMaxBlocks,)
  std::vector<bf16*> tmp_;           // (N,) rank r's (max_elems,) sum before it is copied into x[r]
  // kEvents only: the host barrier of the N rank threads, and two events per rank, on devices[r]:
  Barrier barrier_;
  std::vector<cudaEvent_t> ready_;  // (N,) rank r's input is written (recorded before the sum)
  std::vector<cudaEvent_t> read_;   // (N,) rank r has read its peers' inputs (recorded after the sum)
};

}  // namespace nanovllm
#else
namespace nanovllm {
// Without CUDA the type exists only so that its owners compile (a unique_ptr that stays empty).
class CudaCommunicator {};
}  // namespace nanovllm
#endif  // NANOVLLM_CUDA
