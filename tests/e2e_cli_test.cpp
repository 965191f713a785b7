// The command line's contract (DESIGN.md): outputs, exit codes, and one-line errors. These tests run
// build/nanovllm as a user would.
#include <gtest/gtest.h>

#include "03_block_manager/xxh64.h"
#include "tests/test_util.h"

using namespace nanovllm;
using test::run_nanovllm;

TEST(E2E_Cli, HashBlocksPrintsNanoVllmsChainedHashes) {
  Json golden = test::read_json(test::data_path("golden/xxh64_public.json"));
  std::string input, expected;
  for (const Json& c : golden.at("chained_blocks_int64_le").as_array()) {
    input += c.at("token_ids").dump() + "\n";
    expected += c.at("block_hashes").dump() + "\n";
  }
  auto r = run_nanovllm("hash-blocks", input);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected);
}

TEST(E2E_Cli, HashBlocksSkipsThePartialLastBlock) {
  auto whole = run_nanovllm("hash-blocks --block-size 2", "[1,2,3,4]\n");
  auto partial = run_nanovllm("hash-blocks --block-size 2", "[1,2,3,4,5]\n[1]\n[]\n");
  EXPECT_EQ(whole.exit_code, 0);
  EXPECT_EQ(partial.out, whole.out + "[]\n[]\n");
  Json hashes = Json::parse(whole.out, "out");
  ASSERT_EQ(hashes.size(), 2u);
  // Block [1,2] is the 16 bytes of two int64 LE; block [3,4] is prefixed by the first hash.
  uint8_t first[16] = {1, 0, 0, 0, 0, 0, 0, 0, 2};
  uint64_t h0 = xxh64(first, 16, 0);
  EXPECT_EQ(hashes.as_array()[0].as_uint64(), h0);
  uint8_t second[24] = {};
  for (int i = 0; i < 8; i++) second[i] = uint8_t(h0 >> (8 * i));
  second[8] = 3, second[16] = 4;
  EXPECT_EQ(hashes.as_array()[1].as_uint64(), xxh64(second, 24, 0));
}

TEST(E2E_Cli, UsageErrorsExitTwoWithOneLine) {
  for (const char* args : {"hash-blocks --block-size", "hash-blocks --block-size 0", "hash-blocks --bogus",
                           "hash-blocks --block-size x", "no-such-command", ""}) {
    auto r = run_nanovllm(args, "");
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_TRUE(test::is_one_error_line(r.err)) << args << ": " << r.err;
  }
}

TEST(E2E_Cli, BadInputExitsOneWithOneLine) {
  struct Case { const char* input; const char* message; };
  const Case cases[] = {
      {"[1,2\n", "error: stdin line 1:1:5: expected ',' or ']' after an array element\n"},
      {"[1]\n{\"a\":1}\n", "error: stdin line 2: expected an array of token ids\n"},
      {"[1,-2]\n", "error: stdin line 1: token ids must be integers in [0, 2^31), got -2\n"},
      {"[1.5]\n", "error: stdin line 1: token ids must be integers in [0, 2^31), got 1.5\n"},
      {"[4294967296]\n", "error: stdin line 1: token ids must be integers in [0, 2^31), got 4294967296\n"},
  };
  for (const Case& c : cases) {
    auto r = run_nanovllm("hash-blocks", c.input);
    EXPECT_EQ(r.exit_code, 1) << c.input;
    EXPECT_EQ(r.err, c.message);
  }
}
