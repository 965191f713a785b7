// XXH64 against the reference xxhash library's answers (tests/data/golden/xxh64_public.json), computed
// three ways: one shot, streamed in random pieces, streamed one byte at a time. The lengths in the file
// (0, 3, 4, 7, 8, 15, 31, 33, 63, 64, 100, 255, 1024) reach every tail branch: bytes, the 4-byte step,
// the 8-byte steps, and whole 32-byte stripes; ExactlyOneStripe adds 32, one stripe and no tail.
#include "03_block_manager/xxh64.h"

#include <gtest/gtest.h>

#include <random>

#include "03_block_manager/block_manager.h"
#include "tests/test_util.h"

using namespace nanovllm;

namespace {

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes.push_back(uint8_t(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

uint64_t json_u64(const Json& v) { return v.as_uint64(); }

}  // namespace

TEST(Ch03_Xxh64, SpecVectors) {
  // The two values the xxHash documentation itself quotes.
  EXPECT_EQ(xxh64("", 0, 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(xxh64("a", 1, 0), 0xd24ec4f1a98c6e5bull);
}

TEST(Ch03_Xxh64, ExactlyOneStripe) {
  // 32 bytes, one whole stripe and no tail: the first length that takes the four accumulators, which the
  // golden file's 31 and 33 straddle. Bytes 0..31, seed 0, as `xxhsum -H1` (the reference xxHash) gives it.
  uint8_t bytes[32];
  for (int i = 0; i < 32; i++) bytes[i] = uint8_t(i);
  EXPECT_EQ(xxh64(bytes, 32, 0), 0xcbf59c5116ff32b4ull);
  Xxh64 streamed(0);
  streamed.update(bytes, 20);
  streamed.update(bytes + 20, 12);
  EXPECT_EQ(streamed.digest(), 0xcbf59c5116ff32b4ull);
  // The stripe given whole in one update, not topped up: consumed there, not left as a 32-byte tail.
  Xxh64 whole(0);
  whole.update(bytes, 32);
  EXPECT_EQ(whole.digest(), 0xcbf59c5116ff32b4ull);
}

TEST(Ch03_Xxh64, GoldenVectorsOneShotAndStreaming) {
  Json golden = test::read_json(test::data_path("golden/xxh64_public.json"));
  std::mt19937 rng(7);
  int count = 0;
  for (const Json& v : golden.at("xxh64").as_array()) {
    std::vector<uint8_t> bytes = from_hex(v.at("hex").as_string());
    uint64_t seed = json_u64(v.at("seed"));
    uint64_t expected = json_u64(v.at("xxh64"));
    SCOPED_TRACE("length " + std::to_string(bytes.size()) + " seed " + std::to_string(seed));

    EXPECT_EQ(xxh64(bytes.data(), bytes.size(), seed), expected);

    Xxh64 pieces(seed);
    for (size_t i = 0; i < bytes.size();) {
      size_t n = std::min(bytes.size() - i, size_t(rng() % 40));
      pieces.update(bytes.data() + i, n);
      i += n;
    }
    EXPECT_EQ(pieces.digest(), expected);

    Xxh64 one_by_one(seed);
    for (uint8_t b : bytes) one_by_one.update(&b, 1);
    EXPECT_EQ(one_by_one.digest(), expected);
    count++;
  }
  EXPECT_EQ(count, 40);
}

TEST(Ch03_Xxh64, ChainedBlockHashesMatchNanoVllm) {
  Json golden = test::read_json(test::data_path("golden/xxh64_public.json"));
  for (const Json& c : golden.at("chained_blocks_int64_le").as_array()) {
    std::vector<int32_t> ids;
    for (const Json& id : c.at("token_ids").as_array()) ids.push_back(int32_t(id.as_int64()));
    const auto& expected = c.at("block_hashes").as_array();
    ASSERT_EQ(ids.size() / 256, expected.size());
    uint64_t h = 0;
    for (size_t b = 0; b < expected.size(); b++) {
      h = BlockManager::compute_hash(&ids[b * 256], 256, b > 0, h);
      EXPECT_EQ(h, json_u64(expected[b])) << "block " << b;
    }
  }
}

TEST(Ch03_Xxh64, NotesVectorsForBlocksOfConsecutiveIds) {
  // Known answers from an independent XXH64 (checked on the standard vectors for "" and "a"), over
  // nano-vllm's byte layout: tokens 0..255 -> 5218229187174952702; 256..511 chained -> 1422405182635600221.
  std::vector<int32_t> ids(512);
  for (int i = 0; i < 512; i++) ids[i] = i;
  uint64_t h0 = BlockManager::compute_hash(ids.data(), 256, false, 0);
  EXPECT_EQ(h0, 5218229187174952702ull);
  EXPECT_EQ(BlockManager::compute_hash(ids.data() + 256, 256, true, h0), 1422405182635600221ull);
}

TEST(Ch03_Xxh64, BlockHashBytesAreThePrefixThenEachIdAsInt64) {
  // compute_hash against the bytes spelled out by hand: the previous hash as 8 little-endian bytes, then
  // each id as a little-endian int64. A negative id is sign-extended (-1 is eight 0xff bytes), as numpy's
  // int64 array nano-vllm hashes; read as uint32 it would be ff ff ff ff 00 00 00 00.
  const int32_t ids[2] = {-1, 5};
  const uint8_t bytes[24] = {0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01,   // prefix 0x0123456789abcdef
                             0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,   // -1
                             0x05, 0, 0, 0, 0, 0, 0, 0};                     // 5
  EXPECT_EQ(BlockManager::compute_hash(ids, 2, true, 0x0123456789abcdefull), xxh64(bytes, 24, 0));
  EXPECT_EQ(BlockManager::compute_hash(ids, 2, false, 0x0123456789abcdefull), xxh64(bytes + 8, 16, 0));
}
