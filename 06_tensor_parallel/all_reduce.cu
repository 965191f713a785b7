// all_reduce.cu: the all-reduce and the gather of tensor parallelism, one-shot over peer memory (v2;
// v1, the same steps ordered by CUDA events and a host barrier, is all_reduce_events.cu: read it first).
// Also the communicator's set-up and its argument checks, which both versions share.
//
// The N ranks are threads of one process, so every rank can address every other rank's buffers: with a
// plain device pointer when they share a GPU, through peer access (NVLink or PCIe) when they do not.
// No copy into a staging buffer, no NCCL: each rank's kernel reads its peers' tensors directly.
//
// all_reduce_kernel, one call, on every rank at once (each rank runs the same grid on its own stream):
//   1. start barrier   block b of this rank waits until block b of every rank has started, which means
//                      every rank's x is written (the kernels before the collective on its stream are done)
//   2. sum             each thread loads the same 16 bytes (8 bf16; one element at a time in the tail, or
//                      everywhere when some x[r] is not 16-byte aligned) of every x[r], adds them in fp32
//                      in rank order 0, 1, ..., N-1 and writes the bf16 sum to this rank's temporary, tmp
//   3. end barrier     block b waits until block b of every rank has finished reading; only then may x be
//                      overwritten, since a peer may still be reading this rank's x
//   4. copy back       tmp -> x[rank]
// Every rank computes the same sum in the same order from the same bits, so every rank holds the same
// bits afterwards (the CPU reference is all_reduce_cpu in all_reduce_cpu.cpp).
//
// Why per block, not per grid: block b of every rank reads and writes exactly the same elements: vectors
// v = b * kThreads + thread + k * (blocks * kThreads), elements [8 v, 8 v + 8), and in the one-at-a-time
// loop elements 8 n_vec + (the same index), n_vec the same on every rank (each checks every x[r]'s
// alignment): the same grid-stride loops on every rank, so
// "block b of every rank has finished reading" is all that block b's copy back needs. Blocks never wait
// for blocks of their own grid, only for blocks with the same index in other grids.
//
// The flags. Rank r's flag slots live on rank r's device: (2 barriers, kMaxBlocks, kMaxRanks) uint32.
// At barrier `which` of a call, block b of rank s writes the call's number ("epoch") into slot
// (which, b, s) of every rank, then waits until its own slots (which, b, p) hold the epoch for every p.
// Each rank spins on its own memory; the writes cross to the peers. The epoch is a per-block counter on
// the device (counters[b], one set per rank), incremented by every collective that uses block b: nothing
// on the host changes from call to call, so a CUDA graph replay advances it like an eager call.
// Why two slot sets: a fast rank that leaves the end barrier of call k may reach the start barrier of
// call k+1 while a slow one still waits at the end of call k; were the sets shared, it would overwrite
// the slot with k+1 before the slow rank read k. With two sets, a rank is at most one barrier ahead of
// any peer, so a slot holds either the epoch the waiter wants or the one before it: "== epoch" is exact.
//
// Ranks on ONE GPU. Rank 0's kernel spins until rank 1's kernel runs, so both must run at the same time.
// CUDA does not promise that kernels of two streams run concurrently, it only allows it; they do when the
// GPU has room, which is why grids are small: at most kMaxBlocks = 32 blocks of 512 threads per rank,
// fewer if the ranks sharing a GPU would not all fit at once (the constructor asks the occupancy
// calculator); 4 ranks on an H200 take 128 of the 264 such blocks its 132 SMs hold. The peers' other
// kernels (GEMMs, attention) still get SMs while a collective spins. What breaks it is anything
// that waits for the whole device while a peer spins (see all_reduce.h). Every spin is bounded: after
// spin_timeout_s the kernel prints who waited for whom and traps, so a bug fails in seconds instead of
// hanging the GPU.
//
// Versions: v1, stream-ordered (all_reduce_events.cu): the barriers are CUDA events and a host barrier,
// two host round trips per call, eager only, but nothing spins, so compute-sanitizer can run it. v2, this
// one-shot kernel (each rank reads N x n elements). Larger messages would prefer a two-shot
// reduce-scatter + all-gather (each rank reads 2n); Qwen3-0.6B's decode all-reduces are 2 KB (one row of
// 1,024 bf16) to 1 MB (512 rows), latency-bound (at 256 rows, 512 KB, a call took 14.9 µs: README), where
// a two-shot's second round of flags would add latency. Two-shot was not measured.
#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "06_tensor_parallel/all_reduce.h"

namespace nanovllm {

namespace {

constexpr int kMaxRanks = CudaCommunicator::kMaxRanks;
constexpr int kMaxBlocks = CudaCommunicator::kMaxBlocks;  // blocks of one collective, at most: 32
constexpr int kThreads = 512;   // threads per block
constexpr int kUnroll = 4;      // gather: vectors a thread has in flight
constexpr int kStart = 0, kEnd = 1;  // the two barriers of a collective, each with its own slots

// Rank r's slots: flags[r] + slot(which, block, peer) is where `peer` says that its block `block` has
// reached barrier `which`. Each slot is a whole 32-bit word (byte flags sharing a word would race).
__host__ __device__ constexpr int slot(int which, int block, int peer) {
  return (which * kMaxBlocks + block) * kMaxRanks + peer;
}
constexpr int kFlagSlots = 2 * kMaxBlocks * kMaxRanks;  // 512 words per rank

// What every collective's kernel needs to meet its peers.
struct Flags {
  uint32_t* slots[kMaxRanks];  // slots[r]: rank r's (2, kMaxBlocks, kMaxRanks) flag slots, on rank r's device
  uint32_t* counters;          // this rank's (kMaxBlocks,) call counters, one per block index
  int rank, world;
  uint64_t timeout_ns;
};

// ---------------------------------------------------------------------------------------------------
// Flags: memory order and the barrier

// array[i] for an array that is a kernel parameter, as an unrolled select: indexing a parameter array
// with a run-time i would make the compiler copy the whole array into local memory (a stack frame).
template <class T>
__device__ __forceinline__ T pick(const T (&array)[kMaxRanks], int i) {
  T value = array[0];
#pragma unroll
  for (int r = 1; r < kMaxRanks; r++)
    if (r == i) value = array[r];
  return value;
}

// The GPU's nanosecond clock (the same on every SM), for the spin timeout.
__device__ inline uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A release store of a flag, written as the two instructions of PTX's "release pattern" (st.release.sys
// is the same in one instruction; spelled out, the fence shows what the release covers):
//   fence.acq_rel.sys   every memory access this thread has made or observed is ordered before what
//                       follows, for observers anywhere in the system (peer GPUs included). "Observed"
//                       is what makes it cover more than this thread: the accesses of the whole block,
//                       which this thread has synchronised with at the __syncthreads before the barrier,
//                       and the writes of the kernels before this one on the stream.
//   st.relaxed.sys      the flag itself: a strong store at system scope (not cached in L1, not torn),
//                       so a waiter on another GPU sees it; the fence gives it its release meaning.
__device__ inline void store_release(uint32_t* flag, uint32_t value) {
  asm volatile("fence.acq_rel.sys;\n\tst.relaxed.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

// An acquire load of a flag: once it returns the value a peer released, everything the peer did before
// its release is visible to this thread and to what this thread does next (and, through the
// __syncthreads after the barrier, to the whole block).
__device__ inline uint32_t load_acquire(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

// The number of this call for this block: counters[b] + 1, stored back. Only thread 0 of block b of this
// rank's collectives touches counters[b], and they run one after another on the rank's stream, so a plain
// read and write is enough.
__device__ uint32_t next_epoch(uint32_t* counters) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = ++counters[blockIdx.x];
  __syncthreads();  // every thread reads the epoch thread 0 has just written
  return epoch;
}

// A barrier waited too long: say who waited for whom, then trap (the context is lost; nothing hangs).
// Not inlined, so that the spin loop keeps no register live across the printf call: the 48-byte stack
// frame that `nvcc -Xptxas -v` reports for both kernels is printf's argument buffer, used only here.
__device__ __noinline__ void report_timeout(const char* collective, int rank, int peer, int which, uint32_t epoch,
                                            uint32_t seen, uint64_t timeout_ns) {
  printf("CudaCommunicator %s: rank %d, block %d waited %.1f s at the %s barrier of call %u for rank %d "
         "(its flag holds %u): did every rank make the same calls with the same sizes? (Under compute-sanitizer, "
         "which runs one kernel at a time, use the stream-ordered collectives: --collectives events)\n",
         collective, rank, int(blockIdx.x), double(timeout_ns) * 1e-9, which == kStart ? "start" : "end", epoch, peer, seen);
  __trap();
}

// Block blockIdx.x of every rank meets here: returns once the same block of every rank has reached
// barrier `which` of call `epoch`. Thread p < world talks to rank p (this rank included: one code path).
// The caller has made the block's earlier accesses visible to threads 0..world-1 with a __syncthreads.
__device__ __forceinline__ void block_barrier(const Flags& f, int which, uint32_t epoch, const char* collective) {
  if (threadIdx.x < f.world) {
    const int peer = threadIdx.x;
    // Arrive: our slot in the peer's flags. Released: the peer that sees it may read what we published
    // (start: our x, written by the kernels before this one) or overwrite what we were reading (end).
    store_release(pick(f.slots, peer) + slot(which, blockIdx.x, f.rank), epoch);
    // Wait: the peer's slot in our flags, acquired: once it holds the epoch, the peer's release covers
    // everything the peer published.
    const uint32_t* mine = pick(f.slots, f.rank) + slot(which, blockIdx.x, peer);
    const uint64_t start = now_ns();
    uint32_t seen;
    while ((seen = load_acquire(mine)) != epoch) {
      if (now_ns() - start > f.timeout_ns) report_timeout(collective, f.rank, peer, which, epoch, seen, f.timeout_ns);
    }
  }
  // The rest of the block waits for threads 0..world-1; what they acquired becomes visible to every thread.
  __syncthreads();
}

// ---------------------------------------------------------------------------------------------------
// All-reduce

struct AllReduceArgs {
  const bf16* x[kMaxRanks];  // x[r]: rank r's (n,) input
  bf16* out;                 // (n,) x[rank], where the sum goes
  bf16* tmp;                 // (n,) this rank's temporary
  int64_t n;
  int64_t n_vec;             // 8-element vectors: n / 8, or 0 when an x[r] is not 16-byte aligned
};

// Grid: ceil(n / 8 / kThreads) blocks of kThreads, at least 1 and at most max_blocks_ (<= kMaxBlocks), from n
// alone, so the same on every rank. Every x[rank] becomes the rank-ordered fp32 sum of all x[r], rounded once
// to bf16.
__global__ void __launch_bounds__(kThreads) all_reduce_kernel(Flags f, AllReduceArgs a) {
  const uint32_t epoch = next_epoch(f.counters);
  block_barrier(f, kStart, epoch, "all_reduce");  // every rank's x is written

  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  // 8 elements at a time: elements [8v, 8v + 8) of every rank. __ldcg reads through L2, not L1: the
  // data comes from other kernels and other GPUs, and is read once.
  for (int64_t v = first; v < a.n_vec; v += stride) {
    uint4 raw[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; r++)  // every load in flight before the first add
      if (r < f.world) raw[r] = __ldcg(reinterpret_cast<const uint4*>(a.x[r]) + v);
    float sum[8], term[8];
    bf16x8_to_float(raw[0], sum);
#pragma unroll
    for (int r = 1; r < kMaxRanks; r++) {
      if (r >= f.world) break;
      bf16x8_to_float(raw[r], term);
#pragma unroll
      for (int i = 0; i < 8; i++) sum[i] += term[i];
    }
    store_bf16x8(a.tmp + 8 * v, sum);
  }
  // The rest one element at a time: the last n % 8, or all of them when some x[r] is misaligned.
  for (int64_t i = 8 * a.n_vec + first; i < a.n; i += stride) {
    float sum = __bfloat162float(__ldcg(a.x[0] + i));
#pragma unroll
    for (int r = 1; r < kMaxRanks; r++) {
      if (r >= f.world) break;
      sum += __bfloat162float(__ldcg(a.x[r] + i));
    }
    a.tmp[i] = __float2bfloat16_rn(sum);
  }

  __syncthreads();  // every thread of the block has read its elements of every x[r] before we say so
  block_barrier(f, kEnd, epoch, "all_reduce");  // no rank reads our block's elements of x any more

  // The same elements as above, so the end barrier of this block covered every reader of them.
  for (int64_t v = first; v < a.n_vec; v += stride)
    reinterpret_cast<uint4*>(a.out)[v] = reinterpret_cast<const uint4*>(a.tmp)[v];
  for (int64_t i = 8 * a.n_vec + first; i < a.n; i += stride) a.out[i] = a.tmp[i];
}

// ---------------------------------------------------------------------------------------------------
// Gather

struct GatherArgs {
  const float* shards[kMaxRanks];  // shards[r]: rank r's (rows, shard_cols)
  float* out;                      // rank 0's (rows, out_cols)
  int rows, shard_cols, out_cols;
  int segments;                    // segments per shard row: ceil(shard_cols / segment columns)
  bool vec4;                       // float4 copies: every width a multiple of 4, every pointer 16-byte aligned
};

// Rank 0's copy. The work is cut into tiles (row, rank r, segment s): columns [s * kCols, (s + 1) * kCols)
// of shard r's row, cut at the shard's kept width, where kCols = kUnroll * kThreads * VEC (8192 floats
// with float4). A tile is one block's: kUnroll vectors per thread, all in flight before the first store
// (the reads cross NVLink: latency, not bandwidth, limits one load at a time). Tiles rather than rows, so
// that a single row (decode at batch 1: 151936 logits) still spreads over every block.
template <int VEC>
__device__ __forceinline__ void gather_copy(const GatherArgs& a, int world) {
  using Vec = typename std::conditional<VEC == 4, float4, float>::type;
  constexpr int kCols = kUnroll * kThreads * VEC;
  const int64_t tiles = int64_t(a.rows) * world * a.segments;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int row = int(t / (int64_t(world) * a.segments));
    const int r = int(t / a.segments % world);
    const int col0 = int(t % a.segments) * kCols;
    const int width = min(a.shard_cols, a.out_cols - r * a.shard_cols);  // the last shard is cut at out_cols
    const float* src = pick(a.shards, r) + int64_t(row) * a.shard_cols;
    float* dst = a.out + int64_t(row) * a.out_cols + int64_t(r) * a.shard_cols;
    Vec v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int c = col0 + (u * kThreads + int(threadIdx.x)) * VEC;
      if (c < width) v[u] = __ldcg(reinterpret_cast<const Vec*>(src + c));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int c = col0 + (u * kThreads + int(threadIdx.x)) * VEC;
      if (c < width) *reinterpret_cast<Vec*>(dst + c) = v[u];
    }
  }
}

// Grid: the same blocks on every rank. Rank 0's out = the shards side by side; the other ranks only meet.
__global__ void __launch_bounds__(kThreads) gather_kernel(Flags f, GatherArgs a) {
  const uint32_t epoch = next_epoch(f.counters);
  block_barrier(f, kStart, epoch, "gather");  // every rank's shard is written
  if (f.rank == 0) {
    if (a.vec4) gather_copy<4>(a, f.world);
    else gather_copy<1>(a, f.world);
  }
  // End barrier: a peer may overwrite its shard (the next step's logits) once rank 0 has read it. Without
  // it, the next all-reduce would also hold the peers back, but only if one comes before the next write.
  __syncthreads();  // rank 0: every thread of the block has read its part of the shards before we say so
  block_barrier(f, kEnd, epoch, "gather");
}

// ---------------------------------------------------------------------------------------------------
// Host side

// Makes a device current for the rest of the scope; puts the caller's device back at the end.
class DeviceGuard {
 public:
  DeviceGuard() {
    CUDA_CHECK(cudaGetDevice(&saved_));
    current_ = saved_;
  }
  explicit DeviceGuard(int device) : DeviceGuard() { set(device); }
  ~DeviceGuard() {
    if (current_ != saved_) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  void set(int device) {
    if (device != current_) CUDA_CHECK(cudaSetDevice(device));
    current_ = device;
  }

 private:
  int saved_ = 0;    // the caller's device
  int current_ = 0;  // the device current now
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

CudaCommunicator::CudaCommunicator(std::vector<int> devices, int64_t max_elems, Collectives collectives,
                                   double spin_timeout_s)
    : devices_(std::move(devices)),
      max_elems_(max_elems),
      collectives_(collectives),
      spin_timeout_ns_(0),
      max_blocks_(kMaxBlocks),
      barrier_(int(devices_.size())) {
  const int world = world_size();
  if (world < 1 || world > kMaxRanks) fail("CudaCommunicator: ", world, " ranks (1 to ", kMaxRanks, " are supported)");
  if (max_elems < 0) fail("CudaCommunicator: max_elems is ", max_elems);
  if (!(spin_timeout_s > 0 && spin_timeout_s < 1e6))
    fail("CudaCommunicator: spin_timeout_s is ", spin_timeout_s, " (a positive number of seconds below 1e6)");
  spin_timeout_ns_ = uint64_t(spin_timeout_s * 1e9);
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int r = 0; r < world; r++)
    if (devices_[size_t(r)] < 0 || devices_[size_t(r)] >= count)
      fail("CudaCommunicator: rank ", r, "'s device ", devices_[size_t(r)], " does not exist (", count, " CUDA devices)");
  std::vector<int> distinct = devices_;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());

  DeviceGuard guard;
  // Peer access, both ways between every two distinct devices: each rank reads its peers' x and writes
  // into their flags. It stays enabled (a property of the device contexts, harmless once on).
  for (int a : distinct)
    for (int b : distinct) {
      if (a == b) continue;
      int possible = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&possible, a, b));
      if (!possible)
        fail("CudaCommunicator: GPU ", a, " cannot access the memory of GPU ", b,
             " (no peer-to-peer path between them); the ranks on them cannot all-reduce");
      guard.set(a);
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();  // not an error: clear it
      else CUDA_CHECK(err);
    }

  try {
    for (int r = 0; r < world; r++) {
      guard.set(devices_[size_t(r)]);
      uint32_t* flags = nullptr;
      uint32_t* counters = nullptr;
      bf16* tmp = nullptr;
      CUDA_CHECK(cudaMalloc(&flags, kFlagSlots * sizeof(uint32_t)));
      flags_.push_back(flags);
      CUDA_CHECK(cudaMalloc(&counters, kMaxBlocks * sizeof(uint32_t)));
      counters_.push_back(counters);
      CUDA_CHECK(cudaMalloc(&tmp, size_t(std::max<int64_t>(max_elems_, 1)) * sizeof(bf16)));
      tmp_.push_back(tmp);
      // Epoch 0 is "never arrived": the first call is epoch 1.
      CUDA_CHECK(cudaMemset(flags, 0, kFlagSlots * sizeof(uint32_t)));
      CUDA_CHECK(cudaMemset(counters, 0, kMaxBlocks * sizeof(uint32_t)));
      if (collectives_ == Collectives::kEvents) {
        // On rank r's device: an event is recorded on a stream of its own device (and waited for anywhere).
        cudaEvent_t ready = nullptr, read = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        ready_.push_back(ready);
        CUDA_CHECK(cudaEventCreateWithFlags(&read, cudaEventDisableTiming));
        read_.push_back(read);
      }
    }
    for (int d : distinct) {
      guard.set(d);
      // Load the kernels now. Under lazy loading (CUDA's default) the first launch loads a kernel, and
      // loading may wait for the device: a rank's first collective would wait for its peer's spinning
      // one. cudaFuncGetAttributes loads the kernel on the current device.
      cudaFuncAttributes attributes;
      for (const void* kernel : {reinterpret_cast<const void*>(all_reduce_kernel), reinterpret_cast<const void*>(gather_kernel)}) {
        CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
        if (attributes.maxThreadsPerBlock < kThreads)
          fail("CudaCommunicator: a kernel runs at most ", attributes.maxThreadsPerBlock, " threads per block on GPU ",
               d, " (", kThreads, " needed)");
      }
      // Every rank's blocks must fit on the GPU at once, since they wait for each other: with r ranks on
      // this device, at most (blocks the GPU holds) / r per collective. An H200 holds 132 SMs x 2 blocks
      // of 512 threads, so 4 ranks keep all 32; a smaller GPU gets fewer blocks, each looping longer.
      const int ranks_here = int(std::count(devices_.begin(), devices_.end(), d));
      const int sms = multiprocessor_count(d);
      for (const void* kernel : {reinterpret_cast<const void*>(all_reduce_kernel), reinterpret_cast<const void*>(gather_kernel)}) {
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
        max_blocks_ = std::min(max_blocks_, per_sm * sms / ranks_here);
      }
      // The memsets ran on the legacy default stream, which the ranks' non-blocking streams do not wait for.
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    warm_up();
    if (max_blocks_ < 1) fail("CudaCommunicator: ", world, " ranks' collectives do not fit on their GPUs at once");
  } catch (...) {
    release();
    throw;
  }
}

// Runs each kernel once per device, alone, as a one-rank group over this rank's own flags (nothing to
// wait for), then clears the flags and counters again. Whatever the driver does lazily at a kernel's
// first launch happens now, on an idle device: loading it if cudaFuncGetAttributes did not, and
// reserving local memory for its frame (report_timeout's printf needs a stack), which may wait for the
// whole device. Left to the first collective, that wait would be for a peer's spinning kernel.
void CudaCommunicator::warm_up() {
  if (collectives_ != Collectives::kSpin) return;
  DeviceGuard guard;
  for (size_t r = 0; r < devices_.size(); r++) {
    guard.set(devices_[r]);
    Flags f{};
    f.slots[0] = flags_[r];
    f.counters = counters_[r];
    f.rank = 0, f.world = 1;
    f.timeout_ns = spin_timeout_ns_;
    AllReduceArgs reduce{};  // n = 0: nothing to add
    GatherArgs gather{};     // 0 rows: nothing to copy
    all_reduce_kernel<<<1, kThreads>>>(f, reduce);
    CUDA_CHECK_LAUNCH();
    gather_kernel<<<1, kThreads>>>(f, gather);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemset(flags_[r], 0, kFlagSlots * sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(counters_[r], 0, kMaxBlocks * sizeof(uint32_t)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
}

CudaCommunicator::~CudaCommunicator() { release(); }

void CudaCommunicator::release() noexcept {
  int saved = 0;
  if (cudaGetDevice(&saved) != cudaSuccess) return;
  for (size_t r = 0; r < flags_.size(); r++) {
    cudaSetDevice(devices_[r]);
    cudaFree(flags_[r]);
    if (r < counters_.size()) cudaFree(counters_[r]);
    if (r < tmp_.size()) cudaFree(tmp_[r]);
    if (r < ready_.size()) cudaEventDestroy(ready_[r]);
    if (r < read_.size()) cudaEventDestroy(read_[r]);
  }
  flags_.clear(), counters_.clear(), tmp_.clear(), ready_.clear(), read_.clear();
  cudaSetDevice(saved);
}

namespace {

Flags make_flags(const std::vector<uint32_t*>& slots, uint32_t* counters, int rank, uint64_t timeout_ns) {
  Flags f{};
  for (size_t r = 0; r < slots.size(); r++) f.slots[r] = slots[r];
  f.counters = counters;
  f.rank = rank;
  f.world = int(slots.size());
  f.timeout_ns = timeout_ns;
  return f;
}

}  // namespace

void CudaCommunicator::all_reduce(int rank, bf16* const* x, int64_t n, cudaStream_t stream) {
  const int world = world_size();
  if (rank < 0 || rank >= world) fail("CudaCommunicator::all_reduce: rank ", rank, " of ", world);
  if (n < 0 || n > max_elems_) fail("CudaCommunicator::all_reduce: n = ", n, " (max_elems is ", max_elems_, ")");
  if (n == 0 || world == 1) return;  // one rank: its x is already the sum (every rank returns here alike)
  for (int r = 0; r < world; r++)
    if (!x[r]) fail("CudaCommunicator::all_reduce: x[", r, "] is null");
  DeviceGuard guard(devices_[size_t(rank)]);
  if (collectives_ == Collectives::kEvents) {  // v1 (all_reduce_events.cu)
    all_reduce_events(rank, x, n, stream);
    return;
  }

  AllReduceArgs a{};
  bool aligned = true;
  for (int r = 0; r < world; r++) {
    a.x[r] = x[r];
    aligned = aligned && aligned16(x[r]);
  }
  a.out = x[rank];
  a.tmp = tmp_[size_t(rank)];
  a.n = n;
  a.n_vec = aligned ? n / 8 : 0;
  // From n alone, so that every rank launches the same grid: one thread per 8 elements, up to max_blocks_.
  const int blocks = int(std::clamp<int64_t>(ceil_div<int64_t>(ceil_div<int64_t>(n, 8), kThreads), 1, max_blocks_));
  all_reduce_kernel<<<blocks, kThreads, 0, stream>>>(make_flags(flags_, counters_[size_t(rank)], rank, spin_timeout_ns_), a);
  CUDA_CHECK_LAUNCH();
}

void CudaCommunicator::gather(int rank, const float* const* shards, int rows, int shard_cols, float* out,
                              int out_cols, cudaStream_t stream) {
  const int world = world_size();
  if (rank < 0 || rank >= world) fail("CudaCommunicator::gather: rank ", rank, " of ", world);
  if (rows < 0 || shard_cols < 0 || out_cols < 0 || int64_t(out_cols) > int64_t(world) * shard_cols)
    fail("CudaCommunicator::gather: ", rows, " rows of ", world, " shards of ", shard_cols, " columns cannot fill ",
         out_cols, " columns");
  if (rows == 0 || out_cols == 0) return;  // every rank returns here alike
  if (rank == 0 && !out) fail("CudaCommunicator::gather: rank 0's out is null");
  for (int r = 0; r < world; r++)
    if (!shards[r]) fail("CudaCommunicator::gather: shards[", r, "] is null");
  DeviceGuard guard(devices_[size_t(rank)]);
  if (collectives_ == Collectives::kEvents) {  // v1 (all_reduce_events.cu)
    gather_events(rank, shards, rows, shard_cols, out, out_cols, stream);
    return;
  }

  GatherArgs a{};
  bool aligned = aligned16(out) || rank != 0;
  for (int r = 0; r < world; r++) {
    a.shards[r] = shards[r];
    aligned = aligned && aligned16(shards[r]);
  }
  a.out = out;
  a.rows = rows, a.shard_cols = shard_cols, a.out_cols = out_cols;
  a.vec4 = aligned && shard_cols % 4 == 0 && out_cols % 4 == 0;
  a.segments = ceil_div(shard_cols, kUnroll * kThreads * (a.vec4 ? 4 : 1));
  // From the sizes alone (not from rank 0's alignment), so that every rank launches the same grid.
  const int64_t elems = int64_t(rows) * out_cols;
  const int blocks = int(std::clamp<int64_t>(ceil_div<int64_t>(elems, kUnroll * kThreads * 4), 1, max_blocks_));
  gather_kernel<<<blocks, kThreads, 0, stream>>>(make_flags(flags_, counters_[size_t(rank)], rank, spin_timeout_ns_), a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nanovllm
