// ptx.cuh: the inline-PTX instructions of the tensor-core kernels (05_attention's v5 and v9,
// 06_tensor_parallel's linear_split_k.cu and linear_gemv_mma.cu) and of 05_attention's v6 and
// 04_model_runner/layers.cu's cp.async copies, one wrapper each (PTX ISA sections: cp.async, ldmatrix, mma.sync
// m16n8k16, and createpolicy for the L2 hints of v9 and linear_wgmma.cu), the copy engine's barriers and bulk
// copy of 06_tensor_parallel's sm_90 kernels, what the warpgroup MMA (wgmma) kernels of both chapters share
// (05_attention's v12, 06_tensor_parallel's linear_wgmma.cu), and the remote stores into a cluster peer's
// shared memory of 05_attention's v11.
// Chapter 05 introduces them; 05_attention/v5_tensor_core_prefill.cu's header comment gives the fragment
// layouts ldmatrix and mma use. Here, in base, because two chapters use them.
#pragma once

#include <cstdint>

#include "01_sequence/base/cuda_utils.h"

namespace nanovllm {

// The shared-memory address (what ldmatrix and cp.async take) of a pointer into shared memory.
__device__ inline uint32_t smem_address(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes from global `src` to shared `dst`, asynchronously (no register holds them). valid = false
// writes 16 zero bytes and reads nothing (src-size 0); src must still be a valid address.
__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// An L2 cache policy (PTX: createpolicy) that marks the lines an access brings in as the first to evict:
// for data read once and not again soon, so that it does not push out what will be.
__device__ inline uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async_16 under an L2 cache policy (l2_evict_first_policy), the same bytes.
__device__ inline void cp_async_16(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
// Closes the group of cp.async this thread issued since its last commit.
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight. Other threads' copies
// are visible only after a barrier over the threads that share the buffer (a __syncthreads, or a
// __syncwarp for a warp's own stages, as v9's) that follows their own wait.
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8 x 8 bf16 matrices from shared memory: lanes 8i .. 8i + 7 give the addresses of matrix i's 8
// rows (16 bytes each); register i of lane l receives matrix i's row l / 4, columns 2 (l % 4) + {0, 1}.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// The same, transposed: register i of lane l receives matrix i's column l / 4, rows 2 (l % 4) + {0, 1}.
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d (16 x 8, fp32) += a (16 x 16, bf16, row-major) b (16 x 8, bf16, column-major): one warp, each lane
// holding the fragments described in v5_tensor_core_prefill.cu.
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two bf16 (round to nearest even), `lo` in the lower 16 bits.
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo is the lower half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The copy engine's barriers (sm_90: 06_tensor_parallel's linear_wgmma.cu and linear_prefetch.cu, and the
// remote stores of 05_attention's v11 merge in v9_tensor_core_decode.cu). An
// mbarrier is 8 bytes of shared memory that counts arrivals and bytes: a copy issued "complete_tx" on it
// adds the bytes it delivered, and the barrier's phase completes when the expected arrivals and bytes are
// all in. Threads wait on the phase's parity. Initialised here with one arrival: the phase completes when
// one thread has arrived (mbarrier_arrive_expecting) and the `bytes` it announced have landed.
__device__ inline void mbarrier_init(uint32_t barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barrier) : "memory");
}
__device__ inline void mbarrier_arrive_expecting(uint32_t barrier, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}
// Returns once the barrier's phase with this parity (0, 1, 0, ... for its uses 0, 1, 2, ...) completed.
// CLUSTER_SCOPE: acquire at cluster scope, for a barrier whose bytes other blocks of the cluster deliver
// (store_to_cluster), so that their stores are visible once the phase is seen complete.
template <bool CLUSTER_SCOPE = false>
__device__ inline void mbarrier_wait(uint32_t barrier, int parity) {
  uint32_t done = 0;
  while (!done) {
    if (CLUSTER_SCOPE)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(barrier), "r"(parity)
          : "memory");
    else
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(barrier), "r"(parity)
          : "memory");
  }
}

// Distributed shared memory (sm_90 thread-block clusters). cluster_address: the address, in the cluster's
// shared window, of the variable at shared address `local` in block `rank` of the cluster (every block's
// shared variables lie at the same offsets). store_to_cluster: one remote store into that window, which
// counts its bytes on the receiving block's mbarrier (`remote_barrier`, also a cluster address) when it
// lands; the sender does not wait for it. The four-float form (st.async .v4): 16 bytes, to a 16-byte aligned
// address.
__device__ inline uint32_t cluster_address(uint32_t local, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ inline void store_to_cluster(uint32_t remote, float value, uint32_t remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
               ::"r"(remote), "r"(__float_as_uint(value)), "r"(remote_barrier)
               : "memory");
}
__device__ inline void store_to_cluster(uint32_t remote, const float (&value)[4], uint32_t remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(remote), "r"(__float_as_uint(value[0])), "r"(__float_as_uint(value[1])),
               "r"(__float_as_uint(value[2])), "r"(__float_as_uint(value[3])), "r"(remote_barrier)
               : "memory");
}

// `bytes` (a multiple of 16) from global `src` to shared `dst` (both 16-byte aligned) by the copy engine
// in one instruction, counted on `barrier` (the 1D bulk copy: no tensor map, a contiguous range).
__device__ inline void bulk_copy_to_shared(uint32_t dst, const void* src, int bytes, uint32_t barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(barrier)
               : "memory");
}

// wgmma (sm_90a) reads its B operand, and A when not from registers, straight from shared memory through
// a 64-bit descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start address / 16; 16-29 the
// leading byte offset / 16; 32-45 the stride byte offset / 16; 62-63 the swizzle mode (1 = 128 bytes).
// Every wgmma operand in this project is laid out in the 128-byte swizzle: rows of 128 bytes (64 bf16), in
// groups of 8 rows (1,024 bytes, 1,024-byte aligned) within which 16-byte chunk c of row r sits at chunk
// c ^ (r % 8). For such an operand the stride byte offset is the step from one 8-row group to the next,
// 1,024 bytes; the leading byte offset matters only for an operand whose rows hold its N (or M)
// dimension ("MN-major", read transposed), where it is the step from one 64-element block of N to the next;
// a K-major operand, whose 16-wide k slice lies inside one row, takes 1 by convention. The k-th 16-wide
// slice of a K-major operand starts 32 k bytes into its rows: the hardware applies the swizzle to the
// address it forms, so advancing the start address is all it takes.
__device__ inline uint64_t wgmma_descriptor(uint32_t address, uint32_t leading_bytes = 16,
                                            uint32_t stride_bytes = 1024) {
  return uint64_t((address & 0x3FFFF) >> 4) | (uint64_t((leading_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

// Keeps the compiler from moving reads or writes of wgmma's accumulators across the wgmma instructions,
// which write them asynchronously (it sees only the asm statements' operands).
template <int N>
__device__ inline void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace nanovllm
