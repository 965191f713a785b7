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
