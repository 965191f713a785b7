// Scheduler tests. A fake model stands in for the GPU: it keeps a "KV cache" that stores, in each slot,
// the token id whose K/V would be there. Every step it writes the scheduled tokens through the block
// table and then reads back the whole context, so any wrong prefix hit, shared block overwritten, or stale
// block table shows up as a mismatch. Its next token is a hash of the tokens so far, a deterministic
// "greedy model": outputs must not depend on batching, chunking or preemption.
#include "02_scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <numeric>
#include <tuple>
#include <random>

using namespace nanovllm;

namespace {

constexpr int kVocab = 1000;

class FakeModel {
 public:
  FakeModel(int num_blocks, int block_size) : kv_(size_t(num_blocks) * block_size, -1), block_size_(block_size) {}

  // The next token of a sequence whose tokens are `tokens`: a hash of all of them.
  static int32_t next_token(const std::vector<int32_t>& tokens, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ uint64_t(tokens[i])) * 1099511628211ull;
    return int32_t(h % kVocab);
  }

  // `sampled`: for a step scheduled ahead (Scheduler::schedule_ahead), the token each sequence's
  // kPendingToken stands for, as the device would read it from the step before's output.
  std::vector<int32_t> run(const std::vector<Sequence*>& seqs, bool is_prefill,
                           const std::map<const Sequence*, int32_t>& sampled = {}) {
    std::vector<int32_t> out;
    for (Sequence* s : seqs) {
      Sequence resolved = *s;  // what the device sees: the pending token known
      Sequence* seq = &resolved;
      if (seq->last_token == kPendingToken) seq->set_last_token(sampled.at(s));
      int start = seq->num_cached_tokens, end = start + seq->num_scheduled_tokens;
      EXPECT_GT(seq->num_scheduled_tokens, 0);
      if (!is_prefill) {
        EXPECT_EQ(seq->num_scheduled_tokens, 1);
      }
      EXPECT_EQ(end <= seq->num_tokens(), true);
      EXPECT_GE(int(seq->block_table.size()) * block_size_, end) << "block table too short";
      for (int pos = start; pos < end; pos++) kv_[slot(*seq, pos)] = seq->token_ids[pos];  // store
      for (int pos = 0; pos < end; pos++) {  // attention reads the whole context
        if (kv_[slot(*seq, pos)] != seq->token_ids[pos]) {
          ADD_FAILURE() << "seq " << seq->seq_id << " position " << pos << ": cache holds "
                        << kv_[slot(*seq, pos)] << ", expected " << seq->token_ids[pos];
          break;
        }
      }
      out.push_back(next_token(seq->token_ids, size_t(end)));
    }
    return out;
  }

 private:
  size_t slot(const Sequence& seq, int pos) const {
    return size_t(seq.block_table[pos / block_size_]) * block_size_ + pos % block_size_;
  }
  std::vector<int32_t> kv_;
  int block_size_;
};

struct RunResult {
  std::vector<std::vector<int32_t>> outputs;  // completion ids per request, in request order
  int64_t preemptions = 0, chunked = 0, hit_blocks = 0, steps = 0;
};

EngineConfig small_config(int num_blocks, int block_size = 16, int budget = 16384, int max_seqs = 512) {
  EngineConfig c;
  c.num_kvcache_blocks = num_blocks;
  c.kvcache_block_size = block_size;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = 1 << 20;
  c.eos = {7};
  return c;
}

// Drives requests to completion as LLMEngine::generate does, checking per-step invariants.
// overlap: drive steps as LLMEngine's overlapped loop does: step n + 1 scheduled ahead before step n's
// tokens are "read" (postprocessed), where schedule_ahead (decode) or schedule_prefill_ahead allows it;
// overlapped and overlapped_prefills count those steps.
RunResult run_all(const EngineConfig& config, const std::vector<std::vector<int32_t>>& prompts,
            const std::vector<SamplingParams>& params, bool overlap = false, int64_t* overlapped = nullptr,
            int64_t* overlapped_prefills = nullptr) {
  Scheduler scheduler(config);
  FakeModel model(config.num_kvcache_blocks, config.kvcache_block_size);
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < prompts.size(); i++) {
    seqs.push_back(std::make_unique<Sequence>(int64_t(i), prompts[i], params[i], 0, config.kvcache_block_size));
    scheduler.add(seqs.back().get());
  }
  RunResult run;
  if (overlap) {
    // A launched step: its batch and its tokens (the fake model runs at launch, as the device would).
    std::vector<Sequence*> batch;
    std::vector<int32_t> out;
    bool is_prefill = false;
    while (!scheduler.is_finished() || !batch.empty()) {
      if (batch.empty()) {
        std::tie(batch, is_prefill) = scheduler.schedule();
        out = model.run(batch, is_prefill);
      }
      std::vector<Sequence*> next = is_prefill ? scheduler.schedule_prefill_ahead(batch) : scheduler.schedule_ahead(batch);
      if (next.empty()) {
        scheduler.postprocess(batch, out, is_prefill);
        batch.clear();
      } else if (is_prefill) {
        for (const Sequence* s : next) EXPECT_NE(s->last_token, kPendingToken);
        std::vector<int32_t> next_out = model.run(next, true);
        scheduler.finish_ahead(batch, out, true);
        batch = next, out = next_out;
        if (overlapped_prefills) ++*overlapped_prefills;
      } else {
        std::map<const Sequence*, int32_t> sampled;
        for (size_t i = 0; i < batch.size(); i++) sampled[batch[i]] = out[i];
        for (const Sequence* s : next) EXPECT_EQ(s->last_token, kPendingToken);
        std::vector<int32_t> next_out = model.run(next, false, sampled);
        scheduler.finish_ahead(batch, out);
        batch = next, out = next_out;
        if (overlapped) ++*overlapped;
      }
      if (++run.steps > 1000000) {
        ADD_FAILURE() << "no progress";
        break;
      }
    }
  }
  while (!scheduler.is_finished()) {
    auto [batch, is_prefill] = scheduler.schedule();
    EXPECT_FALSE(batch.empty());
    EXPECT_LE(int(batch.size()), config.max_num_seqs);
    int tokens = 0;
    for (Sequence* s : batch) tokens += s->num_scheduled_tokens;
    if (is_prefill) {
      EXPECT_LE(tokens, config.max_num_batched_tokens);
    }
    scheduler.postprocess(batch, model.run(batch, is_prefill), is_prefill);
    if (++run.steps > 1000000) {
      ADD_FAILURE() << "no progress";
      break;
    }
  }
  EXPECT_EQ(scheduler.block_manager().num_free_blocks(), config.num_kvcache_blocks) << "blocks leaked";
  for (auto& s : seqs) {
    EXPECT_TRUE(s->is_finished());
    EXPECT_TRUE(s->block_table.empty());
    run.outputs.push_back(s->completion_token_ids());
  }
  run.preemptions = scheduler.num_preemptions();
  run.chunked = scheduler.num_chunked_prefills();
  run.hit_blocks = scheduler.block_manager().total_hit_blocks();
  return run;
}

std::vector<int32_t> tokens(int n, int32_t start) {
  std::vector<int32_t> v(size_t(n), 0);
  std::iota(v.begin(), v.end(), start);
  for (auto& t : v) t = 10 + t % 900;  // avoid the EOS id 7
  return v;
}

SamplingParams params(int max_tokens, bool ignore_eos = true) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  return p;
}

// The reference: what a deterministic model would generate, one token at a time, no engine at all.
std::vector<int32_t> reference_output(std::vector<int32_t> t, const SamplingParams& p, int32_t eos) {
  std::vector<int32_t> out;
  while (int(out.size()) < p.max_tokens) {
    int32_t next = FakeModel::next_token(t, t.size());
    t.push_back(next);
    out.push_back(next);
    if (!p.ignore_eos && next == eos) break;
  }
  return out;
}

}  // namespace

TEST(Ch02_Scheduler, PrefillFirstFcfsAndMaxNumSeqs) {
  EngineConfig c = small_config(100, 16, 16384, 2);
  Scheduler s(c);
  Sequence a(0, tokens(20, 0), params(3), 0, 16), b(1, tokens(20, 100), params(3), 0, 16),
      d(2, tokens(20, 200), params(3), 0, 16);
  s.add(&a), s.add(&b), s.add(&d);
  auto [batch, is_prefill] = s.schedule();
  EXPECT_TRUE(is_prefill);
  ASSERT_EQ(batch.size(), 2u);  // max_num_seqs caps prefill too
  EXPECT_EQ(batch[0], &a);
  EXPECT_EQ(batch[1], &b);
  s.postprocess(batch, {11, 12}, true);
  std::tie(batch, is_prefill) = s.schedule();  // d still waits: prefill again, before any decode
  EXPECT_TRUE(is_prefill);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0], &d);
  s.postprocess(batch, {13}, true);
  std::tie(batch, is_prefill) = s.schedule();  // nothing waits: decode, 2 at a time, in arrival order
  EXPECT_FALSE(is_prefill);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0], &a);
  EXPECT_EQ(batch[1], &b);
  EXPECT_EQ(a.num_scheduled_tokens, 1);
}

TEST(Ch02_Scheduler, OnlyTheFirstSequenceIsChunked) {
  EngineConfig c = small_config(100, 16, 50);
  Scheduler s(c);
  Sequence a(0, tokens(120, 0), params(2), 0, 16), b(1, tokens(30, 500), params(2), 0, 16);
  s.add(&a), s.add(&b);
  auto [batch, is_prefill] = s.schedule();
  ASSERT_EQ(batch.size(), 1u);  // a is cut to the budget, b waits even though 0 budget remains
  EXPECT_EQ(a.num_scheduled_tokens, 50);
  EXPECT_EQ(a.status, SequenceStatus::WAITING);
  EXPECT_EQ(a.block_table.size(), 8u);  // all its blocks at once, though only a chunk is computed
  s.postprocess(batch, {99}, true);
  EXPECT_EQ(a.num_cached_tokens, 50);
  EXPECT_EQ(a.num_tokens(), 120);  // the chunk's sample was discarded
  std::tie(batch, is_prefill) = s.schedule();
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(a.num_scheduled_tokens, 50);
  s.postprocess(batch, {99}, true);
  std::tie(batch, is_prefill) = s.schedule();  // a's last 20 tokens fit, and b (30) fits in the remaining 30
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(a.num_scheduled_tokens, 20);
  EXPECT_EQ(b.num_scheduled_tokens, 30);
  s.postprocess(batch, {21, 22}, true);
  EXPECT_EQ(a.completion_token_ids(), std::vector<int32_t>{21});
  EXPECT_EQ(s.num_chunked_prefills(), 2);
}

TEST(Ch02_Scheduler, SecondSequenceThatDoesNotFitWaits) {
  EngineConfig c = small_config(100, 16, 40);
  Scheduler s(c);
  Sequence a(0, tokens(30, 0), params(2), 0, 16), b(1, tokens(30, 500), params(2), 0, 16);
  s.add(&a), s.add(&b);
  auto [batch, is_prefill] = s.schedule();
  ASSERT_EQ(batch.size(), 1u);  // b would need chunking, and only the first may be chunked
  EXPECT_TRUE(b.block_table.empty());  // nothing allocated for it
}

TEST(Ch02_Scheduler, PreemptsTheNewestRunningSequenceAndRecomputes) {
  // 4 blocks of 16. a (32 tokens) and b (20) take 2 blocks each. After prefill a holds 33 tokens, so its
  // next decode needs a 3rd block: b, the newest running sequence, is preempted and goes to the front of
  // the waiting queue.
  EngineConfig c = small_config(4, 16);
  Scheduler s(c);
  Sequence a(0, tokens(32, 0), params(5), 0, 16), b(1, tokens(20, 300), params(5), 0, 16);
  s.add(&a), s.add(&b);
  FakeModel m(4, 16);
  auto [batch, is_prefill] = s.schedule();
  ASSERT_EQ(batch.size(), 2u);
  s.postprocess(batch, m.run(batch, true), true);
  std::tie(batch, is_prefill) = s.schedule();
  EXPECT_FALSE(is_prefill);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0], &a);
  EXPECT_EQ(b.status, SequenceStatus::WAITING);
  EXPECT_TRUE(b.block_table.empty());
  EXPECT_EQ(b.num_cached_tokens, 0);
  EXPECT_EQ(b.num_tokens(), 21);  // keeps its generated token
  EXPECT_EQ(s.waiting().front(), &b);
  EXPECT_EQ(s.num_preemptions(), 1);
  EXPECT_EQ(b.num_preemptions, 1);
  s.postprocess(batch, m.run(batch, false), false);
  // b's tail block went to a; its first block is free but still cached. b needs 2 blocks (1 of them the
  // cached one) and only 1 is free, so it waits until a finishes, then comes back through prefill with a
  // prefix hit and recomputes only its last 5 tokens.
  while (true) {
    std::tie(batch, is_prefill) = s.schedule();
    if (is_prefill) break;
    s.postprocess(batch, m.run(batch, false), false);
  }
  EXPECT_TRUE(a.is_finished());
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0], &b);
  EXPECT_EQ(b.num_prefix_hit_blocks, 1);
  EXPECT_EQ(b.num_cached_tokens, 16);
  EXPECT_EQ(b.num_scheduled_tokens, 5);
}

TEST(Ch02_Scheduler, PreemptsTheNewestOfThreeRunningNotTheNextInLine) {
  // With two running sequences the newest is also the next in line, so the test above cannot tell them
  // apart. 4 blocks of 16: a (32 tokens, 2 blocks), b (10, 1) and c (10, 1), all prefilled in one step in
  // arrival order. a's 33rd token needs a 3rd block and none is free: c, started last, is preempted, and
  // b, which needs no block, still decodes in this step.
  EngineConfig c = small_config(4, 16);
  Scheduler s(c);
  Sequence a(0, tokens(32, 0), params(5), 0, 16), b(1, tokens(10, 300), params(5), 0, 16),
      cc(2, tokens(10, 600), params(5), 0, 16);
  s.add(&a), s.add(&b), s.add(&cc);
  auto [batch, is_prefill] = s.schedule();
  ASSERT_EQ(batch.size(), 3u);
  ASSERT_EQ(s.block_manager().num_free_blocks(), 0);
  s.postprocess(batch, {11, 12, 13}, true);
  std::tie(batch, is_prefill) = s.schedule();
  ASSERT_FALSE(is_prefill);
  EXPECT_EQ(batch, (std::vector<Sequence*>{&a, &b}));
  EXPECT_EQ(cc.status, SequenceStatus::WAITING);
  EXPECT_EQ(cc.num_preemptions, 1);
  EXPECT_EQ(b.num_preemptions, 0);
  ASSERT_EQ(s.waiting().size(), 1u);
  EXPECT_EQ(s.waiting().front(), &cc);
  EXPECT_EQ(s.running(), (std::deque<Sequence*>{&a, &b}));
}

TEST(Ch02_Scheduler, DecodePreemptsItselfWhenAlone) {
  // The last running sequence needs a block, the cache is full, and nothing is left behind it to preempt
  // (the sequences ahead of it are already in this step's batch): it preempts itself, the step decodes the
  // others, and it is recomputed later with the tokens it had.
  EngineConfig c = small_config(3, 16);
  Scheduler s(c);
  const SamplingParams pa = params(3), pb = params(2);
  Sequence a(0, tokens(20, 0), pa, 0, 16), b(1, tokens(16, 300), pb, 0, 16);
  s.add(&a), s.add(&b);
  FakeModel m(3, 16);
  auto [batch, is_prefill] = s.schedule();  // a 2 blocks, b 1: all 3
  ASSERT_EQ(batch.size(), 2u);
  s.postprocess(batch, m.run(batch, true), true);  // a: 21 tokens, room in its 2nd block; b: 17, needs a 2nd
  std::tie(batch, is_prefill) = s.schedule();
  EXPECT_FALSE(is_prefill);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0], &a);
  EXPECT_EQ(s.num_preemptions(), 1);
  ASSERT_FALSE(s.waiting().empty());
  EXPECT_EQ(s.waiting().front(), &b);
  EXPECT_EQ(b.status, SequenceStatus::WAITING);
  EXPECT_TRUE(b.block_table.empty());
  EXPECT_EQ(b.num_cached_tokens, 0);
  EXPECT_EQ(b.num_tokens(), 17);  // its sampled token kept
  EXPECT_EQ(s.block_manager().num_free_blocks(), 1);
  s.postprocess(batch, m.run(batch, false), false);
  for (int steps = 0; !s.is_finished() && steps < 100; steps++) {
    std::tie(batch, is_prefill) = s.schedule();
    ASSERT_FALSE(batch.empty());
    s.postprocess(batch, m.run(batch, is_prefill), is_prefill);
  }
  ASSERT_TRUE(s.is_finished());
  EXPECT_EQ(a.completion_token_ids(), reference_output(tokens(20, 0), pa, 7));
  EXPECT_EQ(b.completion_token_ids(), reference_output(tokens(16, 300), pb, 7));
  EXPECT_EQ(s.block_manager().num_free_blocks(), 3) << "blocks leaked";
}

TEST(Ch02_Scheduler, FullPrefixHitStillComputesTheLastBlock) {
  // Regression (nano-vllm #144): an identical block-aligned prompt must not be a 100% hit.
  EngineConfig c = small_config(20, 16);
  std::vector<std::vector<int32_t>> prompts = {tokens(64, 0), tokens(64, 0)};
  std::vector<SamplingParams> ps = {params(3), params(3)};
  Scheduler s(c);
  Sequence a(0, prompts[0], ps[0], 0, 16), b(1, prompts[1], ps[1], 0, 16);
  FakeModel m(20, 16);
  s.add(&a);
  auto [batch, is_prefill] = s.schedule();
  s.postprocess(batch, m.run(batch, true), true);
  s.add(&b);
  std::tie(batch, is_prefill) = s.schedule();
  ASSERT_TRUE(is_prefill);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(b.num_prefix_hit_blocks, 3);
  EXPECT_EQ(b.num_scheduled_tokens, 16);
  s.postprocess(batch, m.run(batch, true), true);
  EXPECT_EQ(b.completion_token_ids(), a.completion_token_ids());
}

TEST(Ch02_Scheduler, RefusesRequestsThatCanNeverRun) {
  EngineConfig c = small_config(4, 16);
  c.max_model_len = 100;
  Scheduler s(c);
  Sequence too_long(0, tokens(90, 0), params(20), 0, 16);
  try {
    s.add(&too_long);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "request 0: prompt (90 tokens) + max_tokens (20) exceeds max_model_len (100)");
  }
  Sequence too_big(1, tokens(60, 0), params(10), 0, 16);  // 69 KV slots -> 5 blocks > 4
  try {
    s.add(&too_big);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "request 1: needs 5 KV blocks of 16 tokens but the cache has only 4");
  }
  // A sequence built with another block size would index the cache with the wrong block table: refused.
  Sequence other_block_size(3, tokens(10, 0), params(5), 0, 32);
  try {
    s.add(&other_block_size);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "request 3: block size 32 differs from the engine's 16");
  }
  Sequence just_fits(2, tokens(60, 0), params(5), 0, 16);  // 64 slots -> 4 blocks: accepted and runs
  s.add(&just_fits);
  EXPECT_EQ(s.waiting().size(), 1u);
}

TEST(Ch02_Scheduler, HugeMaxTokensIsRefusedNotOverflowed) {
  // 1 + INT32_MAX does not fit in an int: computed in int it wrapped negative, passed both checks, and
  // the request later aborted the scheduler (a decode step with nothing to run). The true length,
  // 2^31, exceeds any max_model_len and any cache.
  EngineConfig c = small_config(2, 16);
  Scheduler s(c);
  Sequence huge(0, tokens(1, 0), params(INT32_MAX), 0, 16);
  try {
    s.add(&huge);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "request 0: prompt (1 token) + max_tokens (2147483647) exceeds max_model_len (1048576)");
  }
  // Only the KV cache limits it now: 1 + (2^31 - 2) - 1 slots are ceil((2^31 - 2) / 16) = 134217728
  // blocks, and the rounding-up sum 2^31 - 2 + 15 overflows an int as well.
  c.max_model_len = INT32_MAX;
  Scheduler unlimited(c);
  Sequence almost(0, tokens(1, 0), params(INT32_MAX - 1), 0, 16);
  try {
    unlimited.add(&almost);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "request 0: needs 134217728 KV blocks of 16 tokens but the cache has only 2");
  }
  EXPECT_TRUE(s.is_finished());
  EXPECT_TRUE(unlimited.is_finished());
}

TEST(Ch02_Scheduler, RequestUsingTheWholeCacheRunsToCompletion) {
  // nano-vllm #274 crashed here (assert scheduled_seqs) once the cache filled; now it must finish.
  EngineConfig c = small_config(4, 16);
  // Each request needs all 4 blocks by its end; two prefill together and the decode must preempt.
  std::vector<std::vector<int32_t>> prompts = {tokens(20, 0), tokens(20, 100), tokens(30, 200)};
  std::vector<SamplingParams> ps = {params(40), params(40), params(30)};
  RunResult r = run_all(c, prompts, ps);
  for (size_t i = 0; i < prompts.size(); i++) EXPECT_EQ(r.outputs[i], reference_output(prompts[i], ps[i], 7));
  EXPECT_GT(r.preemptions, 0);
}

TEST(Ch02_Scheduler, EosFinishesUnlessIgnored) {
  // Find a prompt whose first generated token is the EOS id 7, by search over the fake model.
  std::vector<int32_t> prompt;
  for (int32_t x = 0;; x++) {
    prompt = {11, 12, 10 + x};
    if (FakeModel::next_token(prompt, prompt.size()) == 7) break;
  }
  EngineConfig c = small_config(10, 16);
  RunResult r = run_all(c, {prompt, prompt}, {params(5, false), params(5, true)});
  EXPECT_EQ(r.outputs[0], std::vector<int32_t>{7});  // EOS is kept and counted, as nano-vllm does
  EXPECT_EQ(r.outputs[1].size(), 5u);
  EXPECT_EQ(r.outputs[1][0], 7);
}

TEST(Ch02_Scheduler, ChunkingAndPreemptionTogetherKeepCountersRight) {
  // Nano-vllm #207-#213: chunked prefill mixed with prefix hits and preemption broke its counters. Long
  // prompts sharing a prefix, a tight budget and a tiny cache exercise all three; the fake model's KV
  // check fails on any counter that drifts.
  EngineConfig c = small_config(12, 16, 24);
  std::vector<int32_t> shared = tokens(40, 0);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 6; i++) {
    std::vector<int32_t> p = shared;
    std::vector<int32_t> tail = tokens(10 + 7 * i, 300 + 50 * i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
    ps.push_back(params(20 + 9 * i));
  }
  RunResult r = run_all(c, prompts, ps);
  for (size_t i = 0; i < prompts.size(); i++) EXPECT_EQ(r.outputs[i], reference_output(prompts[i], ps[i], 7));
  EXPECT_GT(r.preemptions, 0);
  EXPECT_GT(r.chunked, 0);
  EXPECT_GT(r.hit_blocks, 0);
}

TEST(Ch02_Scheduler, StepsScheduledAheadGiveTheSameOutputs) {
  // The overlapped loop (schedule_ahead, schedule_prefill_ahead, finish_ahead) against the model alone, with
  // the fake cache checking every slot: requests of random lengths, half of them stopping at EOS (a step late
  // for the overlapped loop, whose next step has already been given them), a third sharing a prefix (hits on
  // blocks a prefill launched ahead of its tokens computed), in pools small enough to chunk and to preempt,
  // where it must fall back.
  std::mt19937 rng(777);
  struct Shape { int blocks, block_size, budget, max_seqs; };
  const Shape shapes[] = {{40, 16, 64, 8}, {60, 32, 100, 16}, {400, 16, 1000, 64}};
  int64_t overlapped = 0, overlapped_prefills = 0, preemptions = 0, eos_stops = 0, chunks = 0, hits = 0;
  for (const Shape& shape : shapes) {
    EngineConfig c = small_config(shape.blocks, shape.block_size, shape.budget, shape.max_seqs);
    c.eos.clear();
    for (int32_t id = 40; id < 80; id++) c.eos.push_back(id);  // 4% of the fake model's tokens
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> ps;
    const std::vector<int32_t> common = tokens(2 * shape.block_size, 0);  // a shared system prompt
    for (int i = 0; i < 300; i++) {
      std::vector<int32_t> p;
      if (i % 3 == 1) p = common;
      int extra = 1 + int(rng() % (4 * shape.block_size));
      for (int k = 0; k < extra; k++) p.push_back(10 + int32_t(rng() % 900));
      int max_tokens = 1 + int(rng() % 60);
      while (ceil_div(int(p.size()) + max_tokens - 1, shape.block_size) > shape.blocks) p.pop_back();
      prompts.push_back(p);
      ps.push_back(params(max_tokens, /*ignore_eos=*/i % 2 == 0));
    }
    RunResult r = run_all(c, prompts, ps, /*overlap=*/true, &overlapped, &overlapped_prefills);
    for (size_t i = 0; i < prompts.size(); i++) {
      std::vector<int32_t> t = prompts[i], want;  // the model alone, stopping at any of the EOS ids
      while (int(want.size()) < ps[i].max_tokens) {
        want.push_back(FakeModel::next_token(t, t.size()));
        t.push_back(want.back());
        if (!ps[i].ignore_eos && want.back() >= 40 && want.back() < 80) break;
      }
      ASSERT_EQ(r.outputs[i], want) << "request " << i;
      eos_stops += int(want.size()) < ps[i].max_tokens;
    }
    preemptions += r.preemptions, chunks += r.chunked, hits += r.hit_blocks;
  }
  EXPECT_GT(overlapped, 100) << "schedule_ahead hardly ever scheduled";
  EXPECT_GT(overlapped_prefills, 10) << "schedule_prefill_ahead hardly ever scheduled";
  EXPECT_GT(preemptions, 10);
  EXPECT_GT(chunks, 10);
  EXPECT_GT(hits, 10);
  EXPECT_GT(eos_stops, 0) << "no request stopped at EOS";
}

TEST(Ch02_Scheduler, ScheduleAheadWaitsForWhatItCannotKnow) {
  // Nothing is scheduled ahead while a request waits for its prefill (prefill goes first, and whether it
  // fits depends on blocks that step n's finished requests free), or when a block for the next token is
  // missing (a preemption would depend on who finished); the state is left as it was.
  EngineConfig c = small_config(/*num_blocks=*/3, /*block_size=*/16);
  Scheduler scheduler(c);
  Sequence a(0, tokens(16, 0), params(10), 0, 16), b(1, tokens(15, 100), params(10), 0, 16);
  scheduler.add(&a);
  scheduler.add(&b);
  auto [prefill, is_prefill] = scheduler.schedule();
  ASSERT_TRUE(is_prefill);
  ASSERT_EQ(prefill.size(), 2u);  // a: 1 block, b: 1 block; 1 free
  scheduler.postprocess(prefill, {11, 12}, true);
  auto [decode, is_prefill2] = scheduler.schedule();  // a's 17th token needs a block: the last free one
  ASSERT_FALSE(is_prefill2);
  ASSERT_EQ(scheduler.block_manager().num_free_blocks(), 0);
  // b's token of this step is its 17th: it needs a block for the step after, and none is free.
  EXPECT_TRUE(scheduler.schedule_ahead(decode).empty());
  EXPECT_EQ(a.num_scheduled_tokens, 1);  // untouched
  EXPECT_EQ(b.num_tokens(), 16);
  scheduler.postprocess(decode, {21, 22}, false);
  Sequence c3(2, tokens(5, 300), params(3), 0, 16);
  scheduler.add(&c3);
  EXPECT_TRUE(scheduler.schedule_ahead(decode).empty()) << "a request waits";
}

// The tests below pin down decisions that change no output, only when work happens (the overlap, the
// queues' order): a mutation run found each of them unchecked, since the outputs were the same either way.

namespace {

// Schedules the prefill of every sequence added (their sampled tokens 11, 12, ... in batch order), then the
// decode step after it, and returns that step's batch: what schedule_ahead is asked about.
std::vector<Sequence*> prefill_then_decode(Scheduler& s) {
  auto [prefill, is_prefill] = s.schedule();
  EXPECT_TRUE(is_prefill);
  std::vector<int32_t> sampled(prefill.size());
  std::iota(sampled.begin(), sampled.end(), 11);
  s.postprocess(prefill, sampled, true);
  auto [decode, is_decode_prefill] = s.schedule();
  EXPECT_FALSE(is_decode_prefill);
  return decode;
}

}  // namespace

TEST(Ch02_Scheduler, DecodeKeepsTheRunningOrderUnderMaxNumSeqs) {
  // With max_num_seqs 2 and three sequences running, decode takes the first two of the running queue and
  // puts them back in front, so the next decode step takes the same two (nano-vllm: extendleft of the
  // reversed batch).
  EngineConfig c = small_config(100, 16, 16384, /*max_seqs=*/2);
  Scheduler s(c);
  Sequence a(0, tokens(20, 0), params(10), 0, 16), b(1, tokens(20, 100), params(10), 0, 16),
      cc(2, tokens(20, 200), params(10), 0, 16);
  s.add(&a), s.add(&b), s.add(&cc);
  auto [batch, is_prefill] = s.schedule();  // a and b
  s.postprocess(batch, {11, 12}, true);
  std::tie(batch, is_prefill) = s.schedule();  // c
  s.postprocess(batch, {13}, true);
  for (int step = 0; step < 2; step++) {
    std::tie(batch, is_prefill) = s.schedule();
    ASSERT_FALSE(is_prefill);
    EXPECT_EQ(batch, (std::vector<Sequence*>{&a, &b})) << "decode step " << step;
    s.postprocess(batch, {21, 22}, false);
  }
}

TEST(Ch02_Scheduler, PreemptedSequenceGoesAheadOfWaitingRequests) {
  // a (32 tokens) and b (20) fill 4 blocks of 16; w arrives and cannot be allocated. a's 34th token needs
  // a block: b is preempted, and goes to the front of the waiting queue, ahead of w, which came later but
  // never ran.
  EngineConfig c = small_config(4, 16);
  Scheduler s(c);
  Sequence a(0, tokens(32, 0), params(5), 0, 16), b(1, tokens(20, 300), params(5), 0, 16),
      w(2, tokens(20, 600), params(5), 0, 16);
  s.add(&a), s.add(&b);
  auto [batch, is_prefill] = s.schedule();
  ASSERT_EQ(batch.size(), 2u);
  s.postprocess(batch, {11, 12}, true);
  s.add(&w);
  std::tie(batch, is_prefill) = s.schedule();
  ASSERT_FALSE(is_prefill);
  ASSERT_EQ(batch, std::vector<Sequence*>{&a});
  ASSERT_EQ(s.waiting().size(), 2u);
  EXPECT_EQ(s.waiting().front(), &b);
  EXPECT_EQ(s.waiting().back(), &w);
}

TEST(Ch02_Scheduler, ScheduleAheadTakesExactlyMaxNumSeqs) {
  // max_num_seqs sequences running is the whole queue, not more than a step takes: both go ahead.
  EngineConfig c = small_config(10, 16, 16384, /*max_seqs=*/2);
  Scheduler s(c);
  Sequence a(0, tokens(20, 0), params(10), 0, 16), b(1, tokens(20, 100), params(10), 0, 16);
  s.add(&a), s.add(&b);
  const std::vector<Sequence*> batch = prefill_then_decode(s);
  EXPECT_EQ(s.schedule_ahead(batch), (std::vector<Sequence*>{&a, &b}));
}

TEST(Ch02_Scheduler, ScheduleAheadLeavesASequenceAtItsLastToken) {
  // max_tokens 2: after the prefill's token, the decode step's token is the last, so nothing goes ahead.
  EngineConfig c = small_config(10, 16);
  Scheduler s(c);
  Sequence a(0, tokens(20, 0), params(2), 0, 16);
  s.add(&a);
  const std::vector<Sequence*> batch = prefill_then_decode(s);
  EXPECT_TRUE(s.schedule_ahead(batch).empty());
  // Untouched (scheduler.h: "Otherwise it changes nothing"): 20 prompt tokens computed, the prefill's token
  // appended, the decode step's one token still scheduled and not yet marked computed.
  EXPECT_EQ(a.num_tokens(), 21);
  EXPECT_EQ(a.num_cached_tokens, 20);
  EXPECT_EQ(a.num_scheduled_tokens, 1);
}

TEST(Ch02_Scheduler, ScheduleAheadOnAFullCacheWhenNoBlockIsNeeded) {
  // Two blocks, both a's (20 tokens, then 21 and 22): its next token still fits its second block.
  EngineConfig c = small_config(2, 16);
  Scheduler s(c);
  Sequence a(0, tokens(20, 0), params(10), 0, 16);
  s.add(&a);
  const std::vector<Sequence*> batch = prefill_then_decode(s);
  ASSERT_EQ(s.block_manager().num_free_blocks(), 0);
  EXPECT_EQ(s.schedule_ahead(batch), std::vector<Sequence*>{&a});
}

TEST(Ch02_Scheduler, ScheduleAheadCountsNoBlockForAFinishingSequence) {
  // Three blocks, all used: a (15 tokens, max_tokens 2) would need a block for its 17th token, but its
  // token of this step is its last, so it never will; b (20 tokens) needs none. b goes ahead alone.
  EngineConfig c = small_config(3, 16);
  Scheduler s(c);
  Sequence a(0, tokens(15, 0), params(2), 0, 16), b(1, tokens(20, 100), params(10), 0, 16);
  s.add(&a), s.add(&b);
  const std::vector<Sequence*> batch = prefill_then_decode(s);
  ASSERT_EQ(batch.size(), 2u);  // both prefilled, both decoding
  ASSERT_EQ(s.block_manager().num_free_blocks(), 0);
  EXPECT_EQ(s.schedule_ahead(batch), std::vector<Sequence*>{&b});
  // a does not go on, but its step was computed all the same, as postprocess would record it: position 15
  // completes its first block, which is hashed (and so stays in the prefix cache once a retires).
  EXPECT_EQ(a.num_cached_tokens, 16);
  const int a_block = a.block_table[0];
  std::vector<int32_t> a_first_block = tokens(15, 0);
  a_first_block.push_back(11);  // the prefill's token
  const uint64_t h = BlockManager::compute_hash(a_first_block.data(), 16, false, 0);
  EXPECT_EQ(s.block_manager().cached_block(h), a_block);
  s.finish_ahead(batch, {21, 22});
  ASSERT_TRUE(a.is_finished());
  EXPECT_EQ(s.block_manager().cached_block(h), a_block) << "a's full block left the prefix cache";
}

TEST(Ch02_Scheduler, ASequenceRetiredAheadLeavesTheOthersGoingOn) {
  // a stops at EOS (7) in finish_ahead, while step n + 1, launched, still holds its placeholder row. Then:
  // schedule_ahead(step n + 1) still takes b (the one sequence left running); and when b's token of that
  // step is its last, postprocess drops a's row instead of appending to a finished sequence.
  for (int b_max_tokens : {10, 3}) {
    SCOPED_TRACE("b's max_tokens " + std::to_string(b_max_tokens));
    EngineConfig c = small_config(10, 16);
    Scheduler s(c);
    Sequence a(0, tokens(20, 0), params(10, /*ignore_eos=*/false), 0, 16),
        b(1, tokens(20, 100), params(b_max_tokens), 0, 16);
    s.add(&a), s.add(&b);
    const std::vector<Sequence*> batch = prefill_then_decode(s);
    const std::vector<Sequence*> next = s.schedule_ahead(batch);
    ASSERT_EQ(next.size(), 2u);
    s.finish_ahead(batch, {7, 13});
    ASSERT_TRUE(a.is_finished());
    if (b_max_tokens == 10) {
      EXPECT_EQ(s.schedule_ahead(next), std::vector<Sequence*>{&b});
      continue;
    }
    ASSERT_TRUE(s.schedule_ahead(next).empty());  // b's token of step n + 1 is its last
    s.postprocess(next, {14, 15}, false);
    EXPECT_EQ(a.completion_token_ids(), (std::vector<int32_t>{11, 7}));
    EXPECT_EQ(b.completion_token_ids(), (std::vector<int32_t>{12, 13, 15}));
    EXPECT_TRUE(s.is_finished());
  }
}

TEST(Ch02_Scheduler, PrefillScheduledAheadOnlyWhereNoFinishCanFreeBlocks) {
  // A prefill is launched ahead only when schedule() would choose it the same without step n's tokens: a
  // request waits whose blocks are free, and no sequence whose prompt step n completes can finish at that
  // token (EOS possible, or its last token), which would free blocks first. Otherwise nothing changes.
  auto prefill_of = [](Scheduler& s) {
    auto [batch, is_prefill] = s.schedule();
    EXPECT_TRUE(is_prefill);
    return batch;
  };
  {  // a's prompt completes in step n and a goes on without EOS: b's prefill is step n + 1
    Scheduler s(small_config(/*num_blocks=*/10, 16, /*budget=*/32));
    Sequence a(0, tokens(20, 0), params(10), 0, 16), b(1, tokens(20, 100), params(10), 0, 16);
    s.add(&a), s.add(&b);
    std::vector<Sequence*> n = prefill_of(s);
    ASSERT_EQ(n, std::vector<Sequence*>{&a});  // b's 20 tokens do not fit the 12 left of the budget
    EXPECT_EQ(s.schedule_prefill_ahead(n), std::vector<Sequence*>{&b});
    EXPECT_EQ(a.num_cached_tokens, 20);
    EXPECT_EQ(b.num_scheduled_tokens, 20);
    s.finish_ahead(n, {11}, /*is_prefill=*/true);
    EXPECT_EQ(a.num_tokens(), 21);
    EXPECT_EQ(a.last_token, 11);
  }
  for (const SamplingParams& pa : {params(10, /*ignore_eos=*/false), params(1)}) {  // a may finish at its token
    Scheduler s(small_config(10, 16, 32));
    Sequence a(0, tokens(20, 0), pa, 0, 16), b(1, tokens(20, 100), params(10), 0, 16);
    s.add(&a), s.add(&b);
    std::vector<Sequence*> n = prefill_of(s);
    EXPECT_TRUE(s.schedule_prefill_ahead(n).empty());
    EXPECT_EQ(a.num_cached_tokens, 0);  // untouched: postprocess does it all
    EXPECT_EQ(a.num_scheduled_tokens, 20);
    EXPECT_EQ(b.num_scheduled_tokens, 0);
  }
  {  // a chunk gets no token, so EOS does not matter: a's next chunk (and b) is step n + 1
    Scheduler s(small_config(10, 16, 32));
    Sequence a(0, tokens(40, 0), params(10, false), 0, 16), b(1, tokens(10, 100), params(10), 0, 16);
    s.add(&a), s.add(&b);
    std::vector<Sequence*> n = prefill_of(s);
    ASSERT_EQ(n, std::vector<Sequence*>{&a});
    EXPECT_EQ(s.schedule_prefill_ahead(n), (std::vector<Sequence*>{&a, &b}));
    EXPECT_EQ(a.num_cached_tokens, 32);
    EXPECT_EQ(a.num_scheduled_tokens, 8);
    s.finish_ahead(n, {11}, true);
    EXPECT_EQ(a.num_tokens(), 40) << "a chunk's sample is dropped";
  }
  {  // the waiting request's blocks are not free: nothing ahead
    Scheduler s(small_config(3, 16, 32));
    Sequence a(0, tokens(20, 0), params(10), 0, 16), b(1, tokens(20, 100), params(10), 0, 16);
    s.add(&a), s.add(&b);
    std::vector<Sequence*> n = prefill_of(s);  // a holds 2 of the 3 blocks; b needs 2
    EXPECT_TRUE(s.schedule_prefill_ahead(n).empty());
    EXPECT_EQ(a.num_cached_tokens, 0);
  }
}

TEST(Ch02_Scheduler, RandomizedSoak) {
  // Thousands of requests of random lengths against a small pool, in several engine shapes. Every
  // request must finish with exactly max_tokens, produce what the model alone would, and leave every
  // block free.
  std::mt19937 rng(12345);
  struct Shape { int blocks, block_size, budget, max_seqs; };
  const Shape shapes[] = {{40, 16, 64, 8}, {24, 16, 200, 32}, {60, 32, 100, 16}, {200, 16, 1000, 64}};
  int total_requests = 0;
  int64_t total_preemptions = 0, total_chunks = 0, total_hits = 0;
  for (const Shape& shape : shapes) {
    EngineConfig c = small_config(shape.blocks, shape.block_size, shape.budget, shape.max_seqs);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> ps;
    std::vector<int32_t> common = tokens(3 * shape.block_size, 0);  // a shared system prompt
    for (int i = 0; i < 600; i++) {
      std::vector<int32_t> p;
      if (rng() % 3 == 0) p = common;
      int extra = 1 + int(rng() % (6 * shape.block_size));
      for (int k = 0; k < extra; k++) p.push_back(10 + int32_t(rng() % 900));
      int max_tokens = 1 + int(rng() % 40);
      // Keep within what add() accepts for this pool.
      while (ceil_div(int(p.size()) + max_tokens - 1, shape.block_size) > shape.blocks) p.pop_back();
      prompts.push_back(p);
      ps.push_back(params(max_tokens));
    }
    RunResult r = run_all(c, prompts, ps);
    for (size_t i = 0; i < prompts.size(); i++) {
      ASSERT_EQ(int(r.outputs[i].size()), ps[i].max_tokens) << "request " << i;
      ASSERT_EQ(r.outputs[i], reference_output(prompts[i], ps[i], 7)) << "request " << i;
    }
    total_requests += int(prompts.size());
    total_preemptions += r.preemptions, total_chunks += r.chunked, total_hits += r.hit_blocks;
  }
  EXPECT_EQ(total_requests, 2400);
  // The soak is only worth something if it reached the hard paths.
  EXPECT_GT(total_preemptions, 100);
  EXPECT_GT(total_chunks, 100);
  EXPECT_GT(total_hits, 100);
}
