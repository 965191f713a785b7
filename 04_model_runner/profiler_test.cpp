// ProfiledBackend must run what the engine runs: every fused path the backend it wraps takes, as that backend's
// one operation, under one label. A fused path the wrapper does not forward runs Backend's unfused default
// instead, so that `bench-step` and `bench --profile` would time another sequence of kernels than the engine's.
#include "04_model_runner/profiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace nanovllm;

namespace {

// A backend that fuses everything it can (or, with fuses = false, nothing) and records which of its operations
// ran; no operation computes. rmsnorm sleeps for rmsnorm_sleep, a known lower bound on its time.
class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::vector<std::string>* calls, bool fuses = true,
                            std::chrono::milliseconds rmsnorm_sleep = std::chrono::milliseconds(0))
      : calls_(calls), fuses_(fuses), rmsnorm_sleep_(rmsnorm_sleep) {}

  Device device() const override { return Device::CPU; }
  DType act_dtype() const override { return DType::F32; }
  void upload(const Tensor&, const void*) override { record("upload"); }
  void download(void*, const Tensor&) override { record("download"); }
  void all_reduce(const Tensor&) override { record("all_reduce"); }
  void gather(const Tensor&, const Tensor&) override { record("gather"); }
  void embedding(const Tensor&, const Tensor&, const Tensor&, int) override { record("embedding"); }
  void rmsnorm(const Tensor&, const Tensor&, const Tensor&, float) override {
    std::this_thread::sleep_for(rmsnorm_sleep_);
    record("rmsnorm");
  }
  void add_rmsnorm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) override { record("add_rmsnorm"); }
  void linear(const Tensor&, const Tensor&, const Tensor&) override { record("linear"); }
  void qk_norm_rope_store(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, const HeadLayout&, float) override {
    record("qk_norm_rope_store");
  }
  void attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionMetadata&,
                 const AttentionShape&) override {
    record("attention");
  }
  void silu_and_mul(const Tensor&, const Tensor&) override { record("silu_and_mul"); }
  void gather_rows(const Tensor&, const Tensor&, const Tensor&) override { record("gather_rows"); }
  void take_sampled_tokens(const Tensor&, const Tensor&, const Tensor&) override { record("take_sampled_tokens"); }
  void sample(const Tensor&, const Tensor&, const Tensor&) override { record("sample"); }

  // The fused paths, each taken (when fuses).
  bool fuses_qk_norm_rope_store_attention(const AttentionMetadata&, const AttentionShape&) const override { return fuses_; }
  void qk_norm_rope_store_attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const HeadLayout&,
                                    float, const AttentionMetadata&, const AttentionShape&) override {
    record("qk_norm_rope_store_attention");
  }
  bool fuses_attention_o_proj(const AttentionMetadata&, const AttentionShape&) const override { return fuses_; }
  void attention_o_proj_add_rmsnorm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, const HeadLayout&, float, const AttentionMetadata&,
                                    const AttentionShape&, const Tensor&, const Tensor&) override {
    record("attention_o_proj_add_rmsnorm");
  }
  void linear_before_attention(const Tensor&, const Tensor&, const Tensor&) override {
    record("linear_before_attention");
  }
  void linear_add_rmsnorm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          float) override {
    record("linear_add_rmsnorm");
  }
  bool fuses_linear_silu(int64_t) const override { return fuses_; }
  void linear_silu_and_mul(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {
    record("linear_silu_and_mul");
  }
  bool fuses_around_linear(int64_t) const override { return fuses_; }
  void rmsnorm_linear(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&) override {
    record("rmsnorm_linear");
  }
  void linear_add(const Tensor&, const Tensor&, const Tensor&) override { record("linear_add"); }
  void silu_linear_add(const Tensor&, const Tensor&, const Tensor&) override { record("silu_linear_add"); }
  bool fuses_linear_sample(int64_t num_rows) const override { return fuses_ && num_rows <= 4; }
  void linear_sample(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool) override {
    record("linear_sample");
  }

 private:
  void record(const char* name) { calls_->push_back(name); }
  std::vector<std::string>* calls_;
  bool fuses_;
  std::chrono::milliseconds rmsnorm_sleep_;
};

Tensor shaped(std::initializer_list<int64_t> dims) { return Tensor(nullptr, DType::F32, Device::CPU, dims); }

}  // namespace

TEST(Ch04_Profiler, RunsEveryFusedPathOfTheBackendItWraps) {
  std::vector<std::string> calls;
  ProfiledBackend profiled(std::make_unique<RecordingBackend>(&calls));
  const Tensor x = shaped({2, 8}), w = shaped({4, 8}), out = shaped({2, 4}), none;
  const AttentionMetadata meta;
  const AttentionShape shape{};
  const HeadLayout heads{};

  profiled.qk_norm_rope_store_attention(out, x, none, none, none, none, none, none, none, heads, 1e-6f, meta, shape);
  profiled.linear_before_attention(out, x, w);
  profiled.linear_add_rmsnorm(out, out, out, x, w, none, 1e-6f);
  profiled.linear_silu_and_mul(out, none, x, w);
  profiled.rmsnorm_linear(out, x, none, 1e-6f, w);
  profiled.linear_add(out, x, w);
  profiled.silu_linear_add(out, x, w);
  ASSERT_TRUE(profiled.fuses_linear_sample(2));
  EXPECT_FALSE(profiled.fuses_linear_sample(5));  // the inner backend's answer, row count by row count
  profiled.linear_sample(none, none, x, w, none, false);
  const Tensor o_proj = shaped({4, 8}), attn_out = shaped({1, 8}), row = shaped({1, 4});
  profiled.attention_o_proj_add_rmsnorm(row, row, row, attn_out, x, none, none, none, none, none, none, none, heads,
                                        1e-6f, meta, shape, o_proj, none);
  EXPECT_TRUE(profiled.fuses_linear_silu(2));
  EXPECT_TRUE(profiled.fuses_around_linear(2));
  EXPECT_TRUE(profiled.fuses_qk_norm_rope_store_attention(meta, shape));
  EXPECT_TRUE(profiled.fuses_attention_o_proj(meta, shape));

  // Each call reached the inner backend's fused operation, and nothing else ran.
  EXPECT_EQ(calls, (std::vector<std::string>{"qk_norm_rope_store_attention", "linear_before_attention",
                                             "linear_add_rmsnorm", "linear_silu_and_mul", "rmsnorm_linear",
                                             "linear_add", "silu_linear_add", "linear_sample",
                                             "attention_o_proj_add_rmsnorm"}));
  // One timed operation each, labelled with what it fused and its shape.
  std::vector<std::string> labels;
  for (const OpTime& op : profiled.report()) {
    EXPECT_EQ(op.calls, 1) << op.label;
    labels.push_back(op.label);
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"linear 2x8->4", "linear+add 2x8->4", "linear+add_rmsnorm 2x8->4",
                                              "linear+sample 2x8->4", "linear+silu 2x8->4",
                                              "qk_norm_rope_store + attention decode",
                                              "qk_norm_rope_store + attention decode + linear+add_rmsnorm 1x8->4",
                                              "rmsnorm+linear 2x8->4", "silu+linear+add 2x8->4"}));
}

TEST(Ch04_Profiler, RunsBackendsUnfusedPathsAsTwoTimedOperations) {
  // An inner backend that fuses nothing: qk_norm_rope_store_attention and linear_silu_and_mul must run as
  // Backend's defaults do, two operations each, through the wrapper so that each is timed under its own label;
  // handing them to the inner backend whole would time two operations as one.
  std::vector<std::string> calls;
  ProfiledBackend profiled(std::make_unique<RecordingBackend>(&calls, /*fuses=*/false));
  const Tensor x = shaped({2, 8}), w = shaped({4, 8}), out = shaped({2, 4}), none;
  const AttentionMetadata meta;  // a decode step (is_prefill false)
  const AttentionShape shape{};
  const HeadLayout heads{};
  EXPECT_FALSE(profiled.fuses_qk_norm_rope_store_attention(meta, shape));
  EXPECT_FALSE(profiled.fuses_linear_silu(2));
  EXPECT_FALSE(profiled.fuses_attention_o_proj(meta, shape));
  profiled.qk_norm_rope_store_attention(out, x, none, none, none, none, none, none, none, heads, 1e-6f, meta, shape);
  profiled.linear_silu_and_mul(out, none, x, w);
  // Attention with o_proj: attention as the two operations above, then the projection with its norm.
  const Tensor o_proj = shaped({4, 8}), attn_out = shaped({1, 8}), row = shaped({1, 4});
  profiled.attention_o_proj_add_rmsnorm(row, row, row, attn_out, x, none, none, none, none, none, none, none, heads,
                                        1e-6f, meta, shape, o_proj, none);
  EXPECT_EQ(calls, (std::vector<std::string>{"qk_norm_rope_store", "attention", "linear", "silu_and_mul",
                                             "qk_norm_rope_store", "attention", "linear_add_rmsnorm"}));
  std::vector<std::string> labels;
  for (const OpTime& op : profiled.report()) labels.push_back(op.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"attention decode", "linear 2x8->4", "linear+add_rmsnorm 1x8->4",
                                              "qk_norm_rope_store", "silu_and_mul"}));
}

TEST(Ch04_Profiler, AttentionIsLabelledWithItsPhase) {
  // bench-step counts the K/V bytes of the rows labelled "attention decode"; a prefill must not be among them.
  std::vector<std::string> calls;
  ProfiledBackend profiled(std::make_unique<RecordingBackend>(&calls));
  const Tensor none;
  AttentionMetadata prefill, decode;
  prefill.is_prefill = true;
  decode.is_prefill = false;
  profiled.attention(none, none, none, none, prefill, AttentionShape{});
  profiled.attention(none, none, none, none, decode, AttentionShape{});
  profiled.attention(none, none, none, none, decode, AttentionShape{});
  std::vector<OpTime> ops = profiled.report();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].label, "attention decode");
  EXPECT_EQ(ops[0].calls, 2);
  EXPECT_EQ(ops[1].label, "attention prefill");
  EXPECT_EQ(ops[1].calls, 1);
}

TEST(Ch04_Profiler, ReportSumsTheTimeOfEveryCallAndThenStartsOver) {
  // rmsnorm sleeps 20 ms a call, so two calls take at least 40 ms (sleep_for never returns early): the report
  // must add up both calls' times, each measured around the operation, and a second report must hold only
  // what ran after the first.
  std::vector<std::string> calls;
  ProfiledBackend profiled(std::make_unique<RecordingBackend>(&calls, true, std::chrono::milliseconds(20)));
  const Tensor none;
  profiled.rmsnorm(none, none, none, 1e-6f);
  profiled.rmsnorm(none, none, none, 1e-6f);
  std::vector<OpTime> ops = profiled.report();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].label, "rmsnorm");
  EXPECT_EQ(ops[0].calls, 2);
  EXPECT_GE(ops[0].milliseconds, 40.0);
  EXPECT_TRUE(profiled.report().empty());
  profiled.rmsnorm(none, none, none, 1e-6f);
  ops = profiled.report();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].calls, 1);
  EXPECT_GE(ops[0].milliseconds, 20.0);
}
