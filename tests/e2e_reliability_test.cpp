// "A clear error and nothing lost" (issue 8): the reproductions found by probing build/nanovllm from
// outside, each run as a user would, checking the exit code, the one error line and the output.
#include <gtest/gtest.h>

#include <string>

#include "tests/test_util.h"

using namespace nanovllm;
using test::run_nanovllm;

namespace {

const std::string kModelA = test::data_path("golden/tiny-qwen3-a");
const std::string kCpuA = " --device cpu --model " + kModelA;

}  // namespace

TEST(E2E_Reliability, HugeMaxTokensIsRefusedUpFront) {
  // 1 + 2147483647 overflowed an int: with a small cache the scheduler aborted (exit 134), without one
  // the request ran for a minute and then failed.
  for (const char* kv : {" --block-size 16 --kv-cache-blocks 2", ""}) {
    auto r = run_nanovllm("generate" + kCpuA + " --prompt-ids 1 --max-tokens 2147483647 --ignore-eos" + kv);
    EXPECT_EQ(r.exit_code, 1) << kv;
    EXPECT_EQ(r.err, "error: request 0: prompt (1 tokens) + max_tokens (2147483647) exceeds max_model_len (4096)\n")
        << kv;
    EXPECT_EQ(r.out, "");
  }
}

TEST(E2E_Reliability, TinyTemperatureIsGreedy) {
  // --temperature 1e-40 made logits / T overflow to inf: "0 0 0" where greedy gives "492 496 496".
  const std::string args = "generate" + kCpuA + " --prompt-ids 5,6,7 --max-tokens 3 --ignore-eos --json --temperature ";
  auto greedy = run_nanovllm(args + "0");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  for (const char* t : {"1e-40", "1e-30", "1e-10"}) {
    auto r = run_nanovllm(args + t);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, greedy.out) << "--temperature " << t;
  }
}
