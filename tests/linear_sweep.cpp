// linear_sweep.cpp: v6's plans against cuBLAS on Qwen3-0.6B's four projections (04_model_runner/NOTES.md,
// section 2, "v6 for the narrow projections"). For each row count and projection, 28 calls on 28 distinct
// weight matrices (as a decode step's layers: every weight comes from memory, not L2) are captured in a
// CUDA graph and replayed; the time per call is printed for cuBLAS (v1), for v6 with linear_wgmma_plan's
// plan, and for the fastest of every plan v6 can run (1, 2 or 4 warpgroups, 64 or 128 outputs a block,
// 1-8 splits). What it cannot see: the kernels between the projections in a real step (attention before
// o_proj, the norms), which decide what v6's early weight loads can overlap; the step itself
// (bench-step) is the judge.
// Build and run on a GPU of compute capability 9.0 (tests/gpu_check.sh OUT sweep does both):
//   nvcc -O3 -std=c++17 -I. -DNANOVLLM_CUDA tests/linear_sweep.cpp <the engine's objects> -lcublasLt -lcublas
//   build/linear_sweep [N...]      (default: 64 80 96 112 128 160 192 224 256)
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "04_model_runner/tensor.h"
#include "06_tensor_parallel/linear.h"

using namespace nanovllm;

namespace {

constexpr int kLayers = 28, kReplays = 20;

struct Projection {
  const char* name;
  int in, out;
};

// Microseconds per call of `call(layer)` over kLayers layers, captured once in a graph and replayed.
float time_per_call(cudaStream_t stream, const std::function<void(int)>& call) {
  for (int l = 0; l < kLayers; l++) call(l);  // first calls outside the capture: plans, tensor maps
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < kLayers; l++) call(l);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; i++) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < kReplays; i++) CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return ms * 1000.0f / float(kReplays * kLayers);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<int> rows;
    for (int i = 1; i < argc; i++) rows.push_back(std::atoi(argv[i]));
    if (rows.empty()) rows = {64, 80, 96, 112, 128, 160, 192, 224, 256};
    if (!linear_wgmma_available()) fail("linear_sweep: v6 needs a GPU of compute capability 9.0 and sm_90a code");
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t cublas;
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) fail("linear_sweep: cannot create a cuBLAS handle");
    cublasSetStream(cublas, stream);
    Buffer workspace(Device::CUDA, 32 << 20);
    cublasSetWorkspace(cublas, workspace.data(), workspace.bytes());
    const Projection projections[] = {{"qkv", 1024, 4096}, {"o_proj", 2048, 1024}, {"gate_up", 1024, 6144}, {"down_proj", 3072, 1024}};
    std::vector<Buffer> weights;  // (layer, projection): (out, in) bf16, a constant (the time does not depend on it)
    for (int l = 0; l < kLayers; l++)
      for (const Projection& p : projections) {
        weights.emplace_back(Device::CUDA, size_t(p.in) * p.out * sizeof(bf16));
        CUDA_CHECK(cudaMemset(weights.back().data(), 0x3c, weights.back().bytes()));
      }
    Buffer x(Device::CUDA, size_t(512) * 6144 * sizeof(bf16)), y(Device::CUDA, size_t(512) * 6144 * sizeof(bf16));
    CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
    auto W = [&](int l, int k) { return static_cast<const bf16*>(weights[size_t(l) * 4 + k].data()); };
    auto describe = [](const LinearWgmmaPlan& p) {
      static char text[64];
      std::snprintf(text, sizeof(text), "%d wg, %3d out, %d splits", p.warpgroups, p.block_out, p.splits);
      return std::string(text);
    };
    std::printf("µs per call, 28 calls on distinct weights in a CUDA graph\n");
    for (int n : rows) {
      if (n < 1 || n > 512) fail("linear_sweep: rows must be 1-512, not ", n);
      for (int k = 0; k < 4; k++) {
        const Projection& p = projections[k];
        bf16* xs = static_cast<bf16*>(x.data());
        void* ys = y.data();
        const float cublas_us = time_per_call(stream, [&](int l) { linear_cuda(cublas, ys, false, xs, W(l, k), n, p.in, p.out); });
        const LinearWgmmaPlan chosen = linear_wgmma_plan(n, p.in, p.out, multiprocessor_count(), linear_wgmma_clusters_per_wave);
        const float chosen_us =
            time_per_call(stream, [&](int l) { linear_wgmma_cuda(ys, false, xs, W(l, k), n, p.in, p.out, chosen, stream); });
        LinearWgmmaPlan best = chosen;
        float best_us = chosen_us;
        const int k_tiles = p.in / 64;
        for (int warpgroups : {1, 2, 4})
          for (int block_out : {64, 128})
            for (int depth = 1; depth <= k_tiles; depth++) {
              LinearWgmmaPlan plan;
              plan.warpgroups = warpgroups, plan.block_out = block_out, plan.k_tiles_per_split = depth;
              plan.splits = (k_tiles + depth - 1) / depth;
              // Each split count once, at its shallowest depth; up to a cluster's 8.
              if (plan.splits > 8 || (depth > 1 && (k_tiles + depth - 2) / (depth - 1) == plan.splits)) continue;
              if (linear_wgmma_clusters_per_wave(plan) < 1) continue;
              const float us =
                  time_per_call(stream, [&](int l) { linear_wgmma_cuda(ys, false, xs, W(l, k), n, p.in, p.out, plan, stream); });
              if (us < best_us) best_us = us, best = plan;
            }
        std::printf("%3d rows %-9s cuBLAS %5.2f | v6, its plan (%s) %5.2f | fastest plan (%s) %5.2f\n", n, p.name,
                    cublas_us, describe(chosen).c_str(), chosen_us, describe(best).c_str(), best_us);
      }
    }
    cublasDestroy(cublas);
    CUDA_CHECK(cudaStreamDestroy(stream));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
