#include "emu_runtime.h"

#include <ucontext.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <random>

namespace emu {
namespace {

enum class State { Ready, WaitWarp, WaitBarrier, Done };
enum class Op { None, Shfl, Ldm, LdmT, Mma };

struct Copy { uint32_t dst; const void* src; bool valid; int group; };

struct Lane {
  ucontext_t ctx;
  std::vector<char> stack;
  uint3 tid;
  State state = State::Ready;
  Op op = Op::None;
  uint32_t in_u = 0;   // shfl value bits / ldmatrix address
  int in_off = 0;
  uint32_t a[4], b[2];
  float c[4];
  uint32_t out[4];
  float out_f[4];
  std::vector<Copy> pending;  // issued, not yet landed
  int committed = 0;          // groups committed so far
};

struct Block {
  std::vector<Lane> lanes;
  ucontext_t sched;
  int cur = 0;
  const std::function<void()>* body;
  uint3 block, grid, dim;
  std::vector<unsigned char> smem;
};

Block* g = nullptr;
Stats g_stats;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "EMU ERROR: %s (block %u,%u,%u thread %u)\n", m.c_str(), g->block.x, g->block.y, g->block.z,
               g->lanes[size_t(g->cur)].tid.x);
  std::abort();
}

Lane& me() { return g->lanes[size_t(g->cur)]; }
void yield() { swapcontext(&me().ctx, &g->sched); }

void trampoline() {
  (*g->body)();
  me().state = State::Done;
  swapcontext(&me().ctx, &g->sched);
}

void warp_op(Op op) {
  me().op = op;
  me().state = State::WaitWarp;
  yield();
}

unsigned char* smem_at(uint32_t addr, size_t bytes) {
  if (size_t(addr) + bytes > g->smem.size()) die("shared-memory access out of bounds: " + std::to_string(addr));
  return g->smem.data() + addr;
}

void land(Lane& l, const Copy& c) {
  unsigned char* dst = g->smem.data() + c.dst;
  if (c.valid) std::memcpy(dst, c.src, 16);
  else std::memset(dst, 0, 16);
}

void do_warp(int w) {
  Lane* L = &g->lanes[size_t(w) * 32];
  const Op op = L[0].op;
  for (int l = 0; l < 32; l++)
    if (L[l].op != op) die("lanes of one warp at different warp operations");
  switch (op) {
    case Op::Shfl:
      for (int l = 0; l < 32; l++) L[l].out[0] = L[l ^ L[l].in_off].in_u;
      break;
    case Op::Ldm:
    case Op::LdmT: {
      for (int l = 0; l < 32; l++)
        if (L[l].in_u % 16) die("ldmatrix row address not 16-byte aligned");
      // Bank conflicts: each matrix (8 row addresses, 16 bytes each) is one phase.
      for (int i = 0; i < 4; i++) {
        bool used[8] = {};
        bool conflict = false;
        for (int r = 0; r < 8; r++) {
          const int group = (L[8 * i + r].in_u / 16) % 8;  // 4-bank group of 16 bytes within 128 bytes
          if (used[group]) conflict = true;
          used[group] = true;
        }
        g_stats.ldmatrix_phases++;
        if (conflict) g_stats.ldmatrix_conflicted_phases++;
      }
      for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 4; i++) {
          if (op == Op::Ldm) {
            std::memcpy(&L[l].out[i], smem_at(L[8 * i + l / 4].in_u + 4 * (l % 4), 4), 4);
          } else {
            uint16_t lo, hi;
            std::memcpy(&lo, smem_at(L[8 * i + 2 * (l % 4)].in_u + 2 * (l / 4), 2), 2);
            std::memcpy(&hi, smem_at(L[8 * i + 2 * (l % 4) + 1].in_u + 2 * (l / 4), 2), 2);
            L[l].out[i] = uint32_t(lo) | (uint32_t(hi) << 16);
          }
        }
      }
      break;
    }
    case Op::Mma: {
      g_stats.mma++;
      auto bf = [](uint32_t reg, int half) {
        uint32_t bits = (half ? (reg >> 16) : (reg & 0xffff)) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      };
      float A[16][16], B[16][8], C[16][8];
      for (int l = 0; l < 32; l++) {
        const int gr = l / 4, t = l % 4;
        for (int e = 0; e < 2; e++) {
          A[gr][2 * t + e] = bf(L[l].a[0], e);
          A[gr + 8][2 * t + e] = bf(L[l].a[1], e);
          A[gr][2 * t + 8 + e] = bf(L[l].a[2], e);
          A[gr + 8][2 * t + 8 + e] = bf(L[l].a[3], e);
          B[2 * t + e][gr] = bf(L[l].b[0], e);
          B[2 * t + 8 + e][gr] = bf(L[l].b[1], e);
          C[gr][2 * t + e] = L[l].c[e];
          C[gr + 8][2 * t + e] = L[l].c[2 + e];
        }
      }
      float D[16][8];
      for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
          double acc = C[r][n];
          for (int k = 0; k < 16; k++) acc += double(A[r][k]) * double(B[k][n]);
          D[r][n] = float(acc);
        }
      for (int l = 0; l < 32; l++) {
        const int gr = l / 4, t = l % 4;
        L[l].out_f[0] = D[gr][2 * t], L[l].out_f[1] = D[gr][2 * t + 1];
        L[l].out_f[2] = D[gr + 8][2 * t], L[l].out_f[3] = D[gr + 8][2 * t + 1];
      }
      break;
    }
    default:
      die("unknown warp op");
  }
  for (int l = 0; l < 32; l++) L[l].state = State::Ready, L[l].op = Op::None;
}

}  // namespace

Stats& stats() { return g_stats; }
uint3 thread_idx() { return me().tid; }
uint3 block_idx() { return g->block; }
uint3 grid_dim() { return g->grid; }
uint3 block_dim() { return g->dim; }

void syncthreads() {
  me().state = State::WaitBarrier;
  yield();
}

float shfl_xor(unsigned mask, float v, int offset) {
  if (mask != 0xffffffffu) die("partial shuffle mask");
  std::memcpy(&me().in_u, &v, 4);
  me().in_off = offset;
  warp_op(Op::Shfl);
  float r;
  std::memcpy(&r, &me().out[0], 4);
  return r;
}
int shfl_xor(unsigned mask, int v, int offset) {
  if (mask != 0xffffffffu) die("partial shuffle mask");
  std::memcpy(&me().in_u, &v, 4);
  me().in_off = offset;
  warp_op(Op::Shfl);
  int r;
  std::memcpy(&r, &me().out[0], 4);
  return r;
}

unsigned char* dynamic_smem() { return g->smem.data(); }
uint32_t cvta_shared(const void* p) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c < g->smem.data() || c > g->smem.data() + g->smem.size()) die("cvta of a non-shared pointer");
  return uint32_t(c - g->smem.data());
}

void cp_async_16(uint32_t dst, const void* src, bool valid) {
  if (dst % 16) die("cp.async destination not 16-byte aligned");
  if (valid && reinterpret_cast<uintptr_t>(src) % 16) die("cp.async source not 16-byte aligned");
  smem_at(dst, 16);
  // A copy may land any time between issue and wait: at random, now (a missing barrier before reuse
  // of the buffer shows) or at the wait (a missing wait or barrier before use shows).
  static std::mt19937 copy_rng(777);
  if (copy_rng() % 2) land(me(), {dst, src, valid, -1});
  else me().pending.push_back({dst, src, valid, -1});
}
void cp_async_commit() {
  for (Copy& c : me().pending)
    if (c.group < 0) c.group = me().committed;
  me().committed++;
}
void cp_async_wait(int n) {
  Lane& l = me();
  std::vector<Copy> still;
  for (const Copy& c : l.pending) {
    if (c.group >= 0 && c.group < l.committed - n) land(l, c);
    else still.push_back(c);
  }
  l.pending = still;
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, bool trans) {
  me().in_u = address;
  warp_op(trans ? Op::LdmT : Op::Ldm);
  for (int i = 0; i < 4; i++) r[i] = me().out[i];
}

void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Lane& l = me();
  for (int i = 0; i < 4; i++) l.a[i] = a[i], l.c[i] = d[i];
  l.b[0] = b0, l.b[1] = b1;
  warp_op(Op::Mma);
  for (int i = 0; i < 4; i++) d[i] = me().out_f[i];
}

void run_block(const std::function<void()>& body, uint3 block, uint3 grid, int num_threads, size_t smem_bytes) {
  Block b;
  b.body = &body;
  b.block = block, b.grid = grid, b.dim = make_uint3(unsigned(num_threads), 1, 1);
  b.smem.assign(smem_bytes, 0xff);  // uninitialised shared memory reads as bf16 NaN
  b.lanes.resize(size_t(num_threads));
  g = &b;
  for (int i = 0; i < num_threads; i++) {
    Lane& l = b.lanes[size_t(i)];
    l.tid = make_uint3(unsigned(i), 0, 0);
    l.stack.resize(256 * 1024);
    getcontext(&l.ctx);
    l.ctx.uc_stack.ss_sp = l.stack.data();
    l.ctx.uc_stack.ss_size = l.stack.size();
    l.ctx.uc_link = nullptr;
    makecontext(&l.ctx, trampoline, 0);
  }
  for (;;) {
    bool ran = false;
    // Each ready lane runs this pass with probability 1/2 (the last ready one if none did): threads of
    // one block drift apart as much as the barriers allow.
    static std::mt19937 lane_rng(4242);
    int last_ready = -1;
    for (int i = 0; i < num_threads; i++) if (b.lanes[size_t(i)].state == State::Ready) last_ready = i;
    for (int i = 0; i < num_threads; i++) {
      if (b.lanes[size_t(i)].state != State::Ready) continue;
      if (!(lane_rng() % 2) && !(i == last_ready && !ran)) continue;
      b.cur = i;
      swapcontext(&b.sched, &b.lanes[size_t(i)].ctx);
      ran = true;
    }
    bool resolved = false;
    static std::mt19937 sched_rng(12345);
    std::vector<int> ready_warps;
    for (int w = 0; w * 32 < num_threads; w++) {
      int waiting = 0, done = 0;
      for (int l = 0; l < 32; l++) {
        State s = b.lanes[size_t(w * 32 + l)].state;
        waiting += s == State::WaitWarp;
        done += s == State::Done;
      }
      if (waiting == 32) ready_warps.push_back(w);
      else if (waiting > 0 && waiting + done == 32) { b.cur = w * 32; die("warp operation with exited lanes"); }
    }
    // Adversarial schedule: each ready warp proceeds with probability 1/2 (at least one does), so warps
    // drift apart and a missing barrier shows as a race.
    if (!ready_warps.empty()) {
      const int forced = ready_warps[sched_rng() % ready_warps.size()];
      for (int w : ready_warps)
        if (w == forced || sched_rng() % 2) do_warp(w), resolved = true;
    }
    int at_barrier = 0, done = 0;
    for (const Lane& l : b.lanes) at_barrier += l.state == State::WaitBarrier, done += l.state == State::Done;
    if (done == num_threads) break;
    if (at_barrier > 0 && at_barrier + done == num_threads) {
      if (done > 0) die("__syncthreads with exited threads");
      for (Lane& l : b.lanes) l.state = State::Ready;
      resolved = true;
    }
    bool any_ready = false;
    for (const Lane& l : b.lanes) any_ready |= l.state == State::Ready;
    if (!ran && !resolved && !any_ready) die("deadlock");
  }
  for (const Lane& l : b.lanes) g_stats.uncompleted_copies += long(l.pending.size());
  g = nullptr;
}

}  // namespace emu
