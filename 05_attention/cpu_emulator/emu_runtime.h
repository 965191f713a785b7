// A tiny SIMT emulator: every CUDA thread of one block is a ucontext "lane"; warp collectives and
// __syncthreads yield to a scheduler that performs them with the PTX ISA's semantics.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>
#include <vector_types.h>
#include <vector_functions.h>

namespace emu {
uint3 thread_idx();
uint3 block_idx();
uint3 grid_dim();
uint3 block_dim();
void syncthreads();
float shfl_xor(unsigned mask, float v, int offset);
int shfl_xor(unsigned mask, int v, int offset);
unsigned char* dynamic_smem();
uint32_t cvta_shared(const void* p);
void cp_async_16(uint32_t dst, const void* src, bool valid);
void cp_async_commit();
void cp_async_wait(int n);
void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, bool trans);
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// Runs one thread block: body() on each of num_threads lanes.
void run_block(const std::function<void()>& body, uint3 block, uint3 grid, int num_threads, size_t smem_bytes);
struct Stats { long ldmatrix_phases = 0, ldmatrix_conflicted_phases = 0, mma = 0, uncompleted_copies = 0; };
Stats& stats();
}  // namespace emu
