// A kernel-by-kernel timeline of the decode step's CUDA graph, taken without changing the engine.
//
// The device has no Nsight Systems, but the CUDA Toolkit ships CUPTI, the library profilers are built
// on, and the driver loads any library named by CUDA_INJECTION64_PATH into the program at its first CUDA
// call and runs its InitializeInjection(). This one asks CUPTI for an activity record of every kernel
// (start and end on the GPU's clock, its graph and node, its launch's correlation id: the kernels of one
// graph launch share it) and, when the program exits, prints where the last replays of the graph launched
// last spent their time. `tests/gpu_check.sh OUT timeline` builds it and runs it on bench-step:
//
//   nvcc -O2 -std=c++17 -shared -Xcompiler -fPIC tests/timeline.cpp -o libtimeline.so -lcupti
//   CUDA_INJECTION64_PATH=$PWD/libtimeline.so nanovllm bench-step --random qwen3-0.6b --batch 1
//
// Environment: TIMELINE_REPLAYS (10), how many of the last replays to average; TIMELINE_NODES (40), how
// many nodes of the first table to print (0: none); TIMELINE_ALL (0): 1 prints instead the tables over every
// replay of every graph, for a whole run such as `bench` (report_all_replays).
//
// What it prints, in microseconds, averaged over the replays:
//   per node, in order of start: its start from the replay's first kernel, its duration, and what it adds
//     to the chain: its end minus the latest end of every node that started before it (0 when it ends
//     inside another's time). The adds of a replay's nodes sum to its span, first start to last end.
//     A kernel launched overlapped (programmatic dependent launch) starts before the kernel ahead of it
//     ends, so its duration includes its wait; what it adds is what the step pays for it.
//   per kernel name: calls a replay, their durations summed, what they add summed.
//   The sums over names come out in this order, largest first: where a step goes.
//   With TIMELINE_ALL, instead, in milliseconds summed over the run: per kernel name; per graph (one a decode
//   batch size): its replays, their spans and what decode attention adds to them, the graphs named by their
//   attention kernel's grid (Qwen3-0.6B's 8 KV heads: 128 blocks for 1-8 sequences, 16 a sequence at 16 (two
//   splits, 05_attention/attention.cu's cluster_decode_splits), 8 a sequence from 32 sequences on); and the
//   kernels launched outside graphs after the first replay (report_eager_after).
// Tracing costs the host time at each launch (bench-step's own step time grows), not the GPU's: the
// replay's span stays within the untraced step time.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end;   // ns, the GPU's clock
  uint32_t graph_id;     // 0 outside a graph
  uint32_t correlation;  // shared by the kernels of one graph launch
  uint64_t node;         // the graph node: the same kernel in every replay
  std::string name;      // shortened (short_name)
  int grid, block;       // blocks and threads a block, all dimensions multiplied
};

std::mutex g_mutex;
std::vector<KernelRecord>* g_records = new std::vector<KernelRecord>;  // read at exit, so never freed

// A failed CUPTI call is reported on stderr and the program runs on: the timeline is a spectator, and a
// program that cannot be traced should still give its own answer.
void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "timeline: %s failed: %s\n", what, text ? text : "unknown error");
}

// "void nanovllm::(anonymous namespace)::rmsnorm_kernel<128>(nanovllm::bf16 const*, ...)" -> "rmsnorm_kernel<128>".
std::string short_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // Drop the parameter list: the last '(' at template depth 0.
  int depth = 0;
  size_t params = std::string::npos;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '<') depth++;
    if (s[i] == '>') depth--;
    if (s[i] == '(' && depth == 0 && s.compare(i, 21, "(anonymous namespace)") != 0) params = i;
  }
  if (params != std::string::npos && params > 0) s = s.substr(0, params);
  // Drop the return type and the namespaces: everything up to the last ' ' or "::" before the template.
  const size_t angle = s.find('<');
  const size_t head_end = angle == std::string::npos ? s.size() : angle;
  size_t from = 0;
  for (size_t i = 0; i < head_end; i++) {
    if (s[i] == ' ') from = i + 1;
    if (s.compare(i, 2, "::") == 0) from = i + 2;
  }
  s = s.substr(from);
  return s.size() > 56 ? s.substr(0, 53) + "..." : s;
}

// CUPTI asks for a buffer to fill with activity records; buffer_completed frees it.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(16) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;  // as many as fit
}

// CUPTI hands back a buffer it has filled (when full, or at cuptiActivityFlushAll), from its own thread:
// keep its kernel records, named short, under the lock.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::vector<KernelRecord> got;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    got.push_back({k->start, k->end, k->graphId, k->correlationId, k->graphNodeId, short_name(k->name),
                   int(k->gridX * k->gridY * k->gridZ), int(k->blockX * k->blockY * k->blockZ)});
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "timeline: %zu records dropped\n", dropped);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records->insert(g_records->end(), got.begin(), got.end());
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// The kernels launched outside any graph after the first replay began: in `bench`, the timed run's prefills
// (the start-up warm-ups and the warm-up request's prefill come before it). Per kernel name their durations
// summed, and the GPU's idle time between two of them with no graph replay in between (the host preparing
// and launching the next): what a prefill step costs beside its kernels.
void report_eager_after(const std::vector<const KernelRecord*>& outside, uint64_t after,
                        const std::vector<std::vector<const KernelRecord*>>& replays) {
  struct Total {
    long calls = 0;
    double duration = 0;
  };
  std::map<std::string, Total> by_name;
  double busy = 0, idle = 0;
  uint64_t latest_end = 0;
  size_t next_replay = 0;
  for (const KernelRecord* k : outside) {  // sorted by start
    if (k->start < after) continue;
    Total& t = by_name[k->name];
    t.calls++, t.duration += double(k->end - k->start) * 1e-6;
    // A replay that started since the last eager kernel ends the stretch: that gap is the decode's, not idle.
    bool replay_between = false;
    while (next_replay < replays.size() && replays[next_replay].front()->start < k->start) {
      if (replays[next_replay].front()->start > latest_end) replay_between = true;
      next_replay++;
    }
    if (latest_end != 0 && !replay_between && k->start > latest_end) idle += double(k->start - latest_end) * 1e-6;
    if (k->end > latest_end) busy += double(k->end - std::max(k->start, latest_end)) * 1e-6;  // overlaps counted once
    latest_end = std::max(latest_end, k->end);
  }
  long calls = 0;
  for (const auto& [name, t] : by_name) calls += t.calls;
  std::printf("\nkernels outside graphs after the first replay: %ld, busy %.1f ms, idle between them %.1f ms\n", calls,
              busy, idle);
  std::vector<std::pair<std::string, Total>> totals(by_name.begin(), by_name.end());
  std::sort(totals.begin(), totals.end(), [](auto& a, auto& b) { return a.second.duration > b.second.duration; });
  std::printf("%-56s %8s %12s\n", "by kernel, outside graphs", "calls", "duration ms");
  for (const auto& [name, t] : totals) std::printf("%-56s %8ld %12.1f\n", name.c_str(), t.calls, t.duration);
}

// TIMELINE_ALL=1: every replay of every graph (a whole `bench` run's decode steps), by kernel name: calls,
// durations and adds summed over the run, in milliseconds; the replays' spans summed; and the GPU's idle time
// between one replay's last kernel and the next one's first, where no kernel outside a graph ran between.
// Then per graph, and the kernels outside graphs (report_eager_after).
void report_all_replays(const std::vector<KernelRecord>& records) {
  std::map<uint32_t, std::vector<const KernelRecord*>> by_launch;
  std::vector<const KernelRecord*> outside;  // kernels launched outside any graph (prefill, warm-up)
  for (const KernelRecord& r : records) (r.graph_id != 0 ? by_launch[r.correlation] : outside).push_back(&r);
  std::vector<std::vector<const KernelRecord*>> replays;
  for (auto& [correlation, kernels] : by_launch) {
    std::sort(kernels.begin(), kernels.end(), [](auto* a, auto* b) { return a->start < b->start; });
    replays.push_back(kernels);
  }
  std::sort(replays.begin(), replays.end(), [](auto& a, auto& b) { return a[0]->start < b[0]->start; });
  std::sort(outside.begin(), outside.end(), [](auto* a, auto* b) { return a->start < b->start; });
  struct Total {
    long calls = 0;
    double duration = 0, adds = 0;
  };
  std::map<std::string, Total> by_name;
  // Per graph (one a batch size): its replays, their spans, and what decode attention adds to them; a graph
  // is named by its attention kernel's grid, which grows with the batch it was captured for.
  struct PerGraph {
    long replays = 0;
    double span = 0, attention = 0;
    int attention_grid = 0;
  };
  std::map<uint32_t, PerGraph> by_graph;
  double span = 0, idle = 0;
  size_t next_outside = 0;
  uint64_t previous_end = 0;
  for (const auto& kernels : replays) {
    const uint64_t t0 = kernels.front()->start;
    // Idle before this replay: from the previous replay's end, if no kernel outside a graph started between.
    while (next_outside < outside.size() && outside[next_outside]->start < t0) {
      if (outside[next_outside]->start > previous_end) previous_end = 0;
      next_outside++;
    }
    if (previous_end != 0 && t0 > previous_end) idle += double(t0 - previous_end) * 1e-6;
    uint64_t latest_end = t0;
    PerGraph& g = by_graph[kernels.front()->graph_id];
    for (const KernelRecord* k : kernels) {
      Total& t = by_name[k->name];
      const double adds = k->end > latest_end ? double(k->end - latest_end) * 1e-6 : 0.0;
      t.calls++, t.duration += double(k->end - k->start) * 1e-6;
      t.adds += adds;
      if (k->name.find("attention") != std::string::npos)
        g.attention += adds, g.attention_grid = std::max(g.attention_grid, k->grid);
      latest_end = std::max(latest_end, k->end);
    }
    span += double(latest_end - t0) * 1e-6;
    g.replays++, g.span += double(latest_end - t0) * 1e-6;
    previous_end = latest_end;
  }
  Total outside_total;
  for (const KernelRecord* k : outside) outside_total.calls++, outside_total.duration += double(k->end - k->start) * 1e-6;
  std::printf("timeline (all replays): %zu graph replays, spans summed %.1f ms, idle between consecutive replays %.1f ms; "
              "%ld kernels outside graphs, %.1f ms of durations\n",
              replays.size(), span, idle, outside_total.calls, outside_total.duration);
  std::vector<std::pair<std::string, Total>> totals(by_name.begin(), by_name.end());
  std::sort(totals.begin(), totals.end(), [](auto& a, auto& b) { return a.second.adds > b.second.adds; });
  std::printf("%-56s %8s %12s %12s\n", "by kernel, all replays", "calls", "duration ms", "adds ms");
  for (const auto& [name, t] : totals)
    std::printf("%-56s %8ld %12.1f %12.1f\n", name.c_str(), t.calls, t.duration, t.adds);
  std::vector<PerGraph> graphs;
  for (const auto& [id, g] : by_graph) graphs.push_back(g);
  std::sort(graphs.begin(), graphs.end(), [](auto& a, auto& b) { return a.attention_grid < b.attention_grid; });
  std::printf("%-40s %8s %12s %16s\n", "by graph, named by its attention grid", "replays", "spans ms",
              "attention adds ms");
  for (const PerGraph& g : graphs)
    std::printf("attention grid %-25d %8ld %12.1f %16.1f\n", g.attention_grid, g.replays, g.span, g.attention);
  if (!replays.empty()) report_eager_after(outside, replays.front().front()->start, replays);
}

// At exit: flush CUPTI's buffers, then print the tables described at the top of this file.
void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::vector<KernelRecord>& records = *g_records;
  if (env_int("TIMELINE_ALL", 0) != 0) return report_all_replays(records);
  // The graph launched last: the one whose kernel started last.
  uint32_t graph = 0;
  uint64_t latest = 0;
  for (const KernelRecord& r : records)
    if (r.graph_id != 0 && r.start >= latest) latest = r.start, graph = r.graph_id;
  if (graph == 0) {
    std::printf("timeline: no kernel ran inside a CUDA graph (%zu kernel records)\n", records.size());
    return;
  }
  // Its replays, oldest first, each in order of start; the last TIMELINE_REPLAYS kept.
  std::map<uint32_t, std::vector<const KernelRecord*>> by_launch;
  for (const KernelRecord& r : records)
    if (r.graph_id == graph) by_launch[r.correlation].push_back(&r);
  std::vector<std::vector<const KernelRecord*>> replays;
  for (auto& [correlation, kernels] : by_launch) {
    std::sort(kernels.begin(), kernels.end(), [](auto* a, auto* b) { return a->start < b->start; });
    replays.push_back(kernels);
  }
  std::sort(replays.begin(), replays.end(), [](auto& a, auto& b) { return a[0]->start < b[0]->start; });
  const size_t keep = size_t(std::max(1, env_int("TIMELINE_REPLAYS", 10)));
  if (replays.size() > keep) replays.erase(replays.begin(), replays.end() - long(keep));

  // Per node, summed over the replays: start offset, duration, what it adds to the chain.
  struct Node {
    std::string name;
    int grid = 0, block = 0, n = 0;
    double start = 0, duration = 0, adds = 0;
  };
  std::map<uint64_t, Node> nodes;
  double span = 0;
  for (const auto& kernels : replays) {
    const uint64_t t0 = kernels.front()->start;
    uint64_t latest_end = t0;
    for (const KernelRecord* k : kernels) {
      Node& node = nodes[k->node];
      node.name = k->name, node.grid = k->grid, node.block = k->block, node.n++;
      node.start += double(k->start - t0) * 1e-3;
      node.duration += double(k->end - k->start) * 1e-3;
      node.adds += k->end > latest_end ? double(k->end - latest_end) * 1e-3 : 0.0;
      latest_end = std::max(latest_end, k->end);
    }
    span += double(latest_end - t0) * 1e-3;
  }
  std::vector<Node> order;
  double busy = 0;
  for (auto& [id, node] : nodes) {
    node.start /= node.n, node.duration /= node.n, node.adds /= node.n;
    busy += node.duration;
    order.push_back(node);
  }
  std::sort(order.begin(), order.end(), [](const Node& a, const Node& b) { return a.start < b.start; });
  std::printf("timeline: %zu replays of graph %u, %zu kernels each: span %.1f us, kernel durations summed %.1f us\n",
              replays.size(), graph, order.size(), span / double(replays.size()), busy);
  const int shown = env_int("TIMELINE_NODES", 40);
  if (shown > 0)
    std::printf("%-4s %-56s %6s %5s %9s %8s %8s\n", "node", "kernel", "grid", "block", "start", "duration", "adds");
  for (size_t i = 0; i < order.size() && int(i) < shown; i++)
    std::printf("%-4zu %-56s %6d %5d %9.2f %8.2f %8.2f\n", i, order[i].name.c_str(), order[i].grid, order[i].block,
                order[i].start, order[i].duration, order[i].adds);
  struct Total {
    int calls = 0;
    double duration = 0, adds = 0;
  };
  std::map<std::string, Total> by_name;
  for (const Node& node : order) {
    Total& t = by_name[node.name];
    t.calls++, t.duration += node.duration, t.adds += node.adds;
  }
  std::vector<std::pair<std::string, Total>> totals(by_name.begin(), by_name.end());
  std::sort(totals.begin(), totals.end(), [](auto& a, auto& b) { return a.second.adds > b.second.adds; });
  std::printf("%-56s %6s %10s %10s\n", "by kernel", "calls", "duration", "adds");
  for (const auto& [name, t] : totals)
    std::printf("%-56s %6d %10.1f %10.1f\n", name.c_str(), t.calls, t.duration, t.adds);
}

}  // namespace

// Called by the driver, once, at the program's first CUDA call.
extern "C" int InitializeInjection(void) {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return 1;
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  std::atexit(report);
  return 1;
}
