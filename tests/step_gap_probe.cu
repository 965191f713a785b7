// step_gap_probe.cu: what the device waits between two replays of a CUDA graph for the transfers queued
// between them (04_model_runner/NOTES.md section 3, "The step's inputs read by the graph"). Not a test:
// a measurement, built and run by `tests/gpu_check.sh OUT gap`.
//
// The graph is one spin kernel of 2 ms (132 blocks); its first block stamps the GPU's clock (%globaltimer)
// when it starts and when it ends. The host queues 300 replays, far ahead of the device, each with the
// transfers of one way between them, and the probe prints the gap from one replay's end to the next one's
// start (the first 20 left out), in µs. The ways: nothing; a 2 KB copy to the host (the step's tokens) on
// the stream; a 254 KB or 15 KB copy from pinned host memory (the step's inputs at bench's settings, all of
// them or the part a step of ~130 sequences uses); those copies on a second stream (joined by events);
// a device-to-device copy; and the graph doing its own transfers, a kernel reading 15 or 30 KB of pinned
// host memory at its start and one writing 2 KB to it at its end (Backend::pull_async, push_tokens_async).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));              \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__device__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// stamps (2 * replays,): the start and end of replay i at 2i and 2i + 1; *replay counts the replays.
__global__ void spin_kernel(unsigned long long* stamps, int* replay, long long ns) {
  const unsigned long long t0 = globaltimer();
  const int i = *replay;
  while (globaltimer() - t0 < (unsigned long long)ns) {
  }
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    stamps[2 * i] = t0;
    stamps[2 * i + 1] = globaltimer();
    *replay = i + 1;
  }
}

__global__ void copy_words_kernel(int* dst, const int* src, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

// One block reads `words` of pinned host memory, all of a thread's loads before its stores.
__global__ void pull_kernel(int* dst, const int* host, int words) {
  int v[8];
#pragma unroll
  for (int k = 0; k < 8; k++)
    if (threadIdx.x + k * blockDim.x < words) v[k] = host[threadIdx.x + k * blockDim.x];
#pragma unroll
  for (int k = 0; k < 8; k++)
    if (threadIdx.x + k * blockDim.x < words) dst[threadIdx.x + k * blockDim.x] = v[k];
}

__global__ void push_kernel(int* host, const int* src, int words) {
  for (int i = threadIdx.x; i < words; i += blockDim.x) host[i] = src[i];
}

int main() {
  const int kReplays = 300, kSkip = 20;
  const int kAll = 254 << 10, kUsed = 15 << 10, kTokens = 2 << 10;
  unsigned long long* stamps;
  int *replay, *device_in, *landing, *device_tokens;
  char *host_in, *host_tokens;
  CK(cudaMalloc(&stamps, 2 * kReplays * sizeof(unsigned long long)));
  CK(cudaMalloc(&replay, sizeof(int)));
  CK(cudaMalloc(&device_in, kAll));
  CK(cudaMalloc(&landing, kAll));
  CK(cudaMalloc(&device_tokens, kTokens));
  CK(cudaHostAlloc(&host_in, kAll, cudaHostAllocMapped));
  CK(cudaHostAlloc(&host_tokens, kTokens, cudaHostAllocMapped));
  cudaStream_t stream, side;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t done[2], uploaded[2];
  for (int i = 0; i < 2; i++) {
    CK(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&uploaded[i], cudaEventDisableTiming));
  }
  // A graph: [copy of `landing_bytes` from landing to device_in] [spin] [push of the tokens], the first and
  // last when asked for; pull_bytes > 0 replaces the first by a read of host memory.
  auto graph = [&](int landing_bytes, int pull_bytes, bool push) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    if (landing_bytes) copy_words_kernel<<<8, 256, 0, stream>>>(device_in, landing, landing_bytes / 4);
    if (pull_bytes) pull_kernel<<<1, 1024, 0, stream>>>(device_in, reinterpret_cast<int*>(host_in), pull_bytes / 4);
    spin_kernel<<<132, 128, 0, stream>>>(stamps, replay, 2000000);
    if (push) push_kernel<<<1, 512, 0, stream>>>(reinterpret_cast<int*>(host_tokens), device_tokens, kTokens / 4);
    CK(cudaStreamEndCapture(stream, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    return exec;
  };
  struct Way {
    const char* name;
    cudaGraphExec_t exec;
    int upload_bytes;     // copied from host_in before the replay
    bool upload_on_side;  // ... on the second stream, into landing, joined by an event
    bool download;        // the tokens copied to the host after the replay
    bool download_on_side;
    bool device_copy;  // 254 KB copied device to device before the replay
  };
  const std::vector<Way> ways = {
      {"graphs back to back", graph(0, 0, false), 0, false, false, false, false},
      {"tokens' 2 KB to the host", graph(0, 0, false), 0, false, true, false, false},
      {"tokens to the host, 254 KB from it", graph(0, 0, false), kAll, false, true, false, false},
      {"tokens to the host, 15 KB from it", graph(0, 0, false), kUsed, false, true, false, false},
      {"254 KB from the host", graph(0, 0, false), kAll, false, false, false, false},
      {"tokens on a second stream", graph(0, 0, false), 0, false, true, true, false},
      {"tokens on a second stream, 254 KB from the host", graph(0, 0, false), kAll, false, true, true, false},
      {"tokens on a second stream, 15 KB from the host", graph(0, 0, false), kUsed, false, true, true, false},
      {"both on a second stream, 254 KB copied on in the graph", graph(kAll, 0, false), kAll, true, true, true, false},
      {"both on a second stream, 15 KB copied on in the graph", graph(kUsed, 0, false), kUsed, true, true, true, false},
      {"254 KB device to device", graph(0, 0, false), 0, false, false, false, true},
      {"the graph reads 15 KB of the host, writes 2 KB to it", graph(0, kUsed, true), 0, false, false, false, false},
      {"the graph reads 30 KB of the host, writes 2 KB to it", graph(0, 2 * kUsed, true), 0, false, false, false, false},
      {"the graph writes 2 KB to the host", graph(0, 0, true), 0, false, false, false, false},
  };
  std::printf("%-58s  gap between replays, µs: median  mean   p10   p90\n", "transfers between two replays");
  for (const Way& w : ways) {
    CK(cudaMemset(replay, 0, sizeof(int)));
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < kReplays; i++) {
      if (w.upload_bytes && w.upload_on_side) {
        CK(cudaMemcpyAsync(landing, host_in, w.upload_bytes, cudaMemcpyHostToDevice, side));
        CK(cudaEventRecord(uploaded[i % 2], side));
        CK(cudaStreamWaitEvent(stream, uploaded[i % 2], 0));
      } else if (w.upload_bytes) {
        CK(cudaMemcpyAsync(device_in, host_in, w.upload_bytes, cudaMemcpyHostToDevice, stream));
      }
      if (w.device_copy) CK(cudaMemcpyAsync(device_in, landing, kAll, cudaMemcpyDeviceToDevice, stream));
      CK(cudaGraphLaunch(w.exec, stream));
      if (w.download && w.download_on_side) {
        CK(cudaEventRecord(done[i % 2], stream));
        CK(cudaStreamWaitEvent(side, done[i % 2], 0));
        CK(cudaMemcpyAsync(host_tokens, device_tokens, kTokens, cudaMemcpyDeviceToHost, side));
      } else if (w.download) {
        CK(cudaMemcpyAsync(host_tokens, device_tokens, kTokens, cudaMemcpyDeviceToHost, stream));
      }
    }
    CK(cudaDeviceSynchronize());
    std::vector<unsigned long long> h(2 * kReplays);
    CK(cudaMemcpy(h.data(), stamps, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    std::vector<double> gaps;
    for (int i = kSkip; i < kReplays; i++) gaps.push_back(double(h[2 * i] - h[2 * i - 1]) * 1e-3);
    std::sort(gaps.begin(), gaps.end());
    double sum = 0;
    for (double g : gaps) sum += g;
    std::printf("%-58s  %36.2f %5.2f %5.2f %5.2f\n", w.name, gaps[gaps.size() / 2], sum / double(gaps.size()),
                gaps[gaps.size() / 10], gaps[gaps.size() * 9 / 10]);
  }
  return 0;
}
