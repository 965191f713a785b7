// The command line's contract (README.md, "Command line"): outputs, exit codes, and one-line errors. These tests run
// build/nanovllm as a user would.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <sstream>

#include "01_sequence/engine_config.h"
#include "01_sequence/sampling_params.h"
#include "03_block_manager/xxh64.h"
#include "05_attention/attention.h"
#include "06_tensor_parallel/linear.h"
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

TEST(E2E_Cli, HashBlocksTakesTokenIdsUpTo2To31Minus1) {
  // Token ids are in [0, 2^31): 2147483647 (0x7fffffff) is the largest accepted, hashed as any other, as the 8
  // bytes of an int64 LE; 2147483648 is the first refused.
  auto top = run_nanovllm("hash-blocks --block-size 1", "[2147483647]\n");
  EXPECT_EQ(top.exit_code, 0) << top.err;
  const uint8_t block[8] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
  EXPECT_EQ(top.out, "[" + std::to_string(xxh64(block, 8, 0)) + "]\n");
  auto past = run_nanovllm("hash-blocks --block-size 1", "[2147483648]\n");
  EXPECT_EQ(past.exit_code, 1);
  EXPECT_EQ(past.err, "error: stdin line 1: token ids must be integers in [0, 2^31), got 2147483648\n");
}

TEST(E2E_Cli, HashBlocksReadsCrlfLinesAsTheirLfTwins) {
  // A file saved with Windows line endings: "\r" is JSON whitespace (RFC 8259), so "[1,2]\r" is the array [1,2],
  // and a line of only "\r" is a blank line, answered with a blank line like "" (output stays aligned with input).
  auto lf = run_nanovllm("hash-blocks --block-size 1", "[1,2]\n\n[3]\n");
  auto crlf = run_nanovllm("hash-blocks --block-size 1", "[1,2]\r\n\r\n[3]\r\n");
  ASSERT_EQ(lf.exit_code, 0) << lf.err;
  EXPECT_EQ(crlf.exit_code, 0) << crlf.err;
  EXPECT_EQ(crlf.out, lf.out);
  EXPECT_EQ(std::count(lf.out.begin(), lf.out.end(), '\n'), 3) << lf.out;
}

TEST(E2E_Cli, HashBlocksAnswersEachLineBeforeTheNextArrives) {
  // A program driving hash-blocks through a pipe sends a line and waits for its answer: each answer (a blank
  // line's blank answer too) must reach stdout while stdin is still open, not when it closes. The shell below
  // keeps stdin open (a FIFO on fd 3), sends a line, and waits up to 10 s for the output file to hold one more
  // line, printing the count it saw each time.
  test::TempDir dir;
  test::write_string(dir / "drive.sh",
                     "cd '" + dir.path() + "' && mkfifo in || exit 1\n"
                     "'" + test::nanovllm_binary() + "' hash-blocks --block-size 1 <in >out &\n"
                     "exec 3>in\n"
                     "n=0\n"
                     "for line in '[1]' '' '[2,3]'; do\n"
                     "  printf '%s\\n' \"$line\" >&3; n=$((n + 1))\n"
                     "  for i in $(seq 100); do [ \"$(wc -l <out)\" -ge $n ] && break; sleep 0.1; done\n"
                     "  wc -l <out\n"
                     "done\n"
                     "exec 3>&-\n"
                     "wait\n");
  FILE* p = popen(("bash '" + (dir / "drive.sh") + "'").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string seen;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, p)) seen += buffer;
  EXPECT_EQ(pclose(p), 0);
  EXPECT_EQ(seen, "1\n2\n3\n");
  uint8_t one[8] = {1}, two[8] = {2}, three[16] = {};
  const uint64_t h1 = xxh64(one, 8, 0), h2 = xxh64(two, 8, 0);
  for (int i = 0; i < 8; i++) three[i] = uint8_t(h2 >> (8 * i));
  three[8] = 3;
  EXPECT_EQ(read_file(dir / "out"), "[" + std::to_string(h1) + "]\n\n[" + std::to_string(h2) + "," +
                                                 std::to_string(xxh64(three, 16, 0)) + "]\n");
}

TEST(E2E_Cli, UsageErrorsExitTwoWithOneLine) {
  for (const char* args : {"hash-blocks --block-size", "hash-blocks --block-size 0", "hash-blocks --bogus",
                           "hash-blocks --block-size x", "no-such-command", "", "help generate bench"}) {
    auto r = run_nanovllm(args, "");
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_TRUE(test::is_one_error_line(r.err)) << args << ": " << r.err;
  }
}

// Two usage errors a mutation run found unchecked: --chat with --prompt-ids (the template applies to text,
// so running on with --chat ignored would be a silent wrong answer), and a DEL byte, a control character
// like those below 0x20, written as an escape (the README's contract for quoted values; 'a', DEL, 'b' by hand).
TEST(E2E_Cli, ChatWithPromptIdsAndADelByteAreUsageErrors) {
  auto chat = run_nanovllm("generate --device cpu --model " + test::golden_dir("tiny-qwen3-a") +
                               " --chat --prompt-ids 1,2 --max-tokens 1 --temperature 0",
                           "");
  EXPECT_EQ(chat.exit_code, 2) << chat.err;
  EXPECT_TRUE(test::is_one_error_line(chat.err)) << chat.err;
  EXPECT_NE(chat.err.find("--chat applies to --prompt TEXT, not to --prompt-ids"), std::string::npos) << chat.err;
  EXPECT_EQ(chat.out, "");
  auto del = run_nanovllm("\"$(printf 'a\\177b')\"", "");
  EXPECT_EQ(del.exit_code, 2);
  EXPECT_EQ(del.err, "error: unknown command 'a\\x7fb' (try: nanovllm help)\n");
}

// The version ranges `nanovllm help` states are the ones the flags take: the last of chapter 05's kernels and
// of chapter 06's projection versions is accepted (the command then fails on the missing model, exit 1), the
// next one is a usage error (exit 2) that names the range.
TEST(E2E_Cli, HelpStatesTheVersionRangesTheFlagsTake) {
  const int last_attention = int(attention_versions().size()) - 1;
  auto help = run_nanovllm("help", "");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--attention-version N (0-" + std::to_string(last_attention) + ":"), std::string::npos)
      << help.out;
  EXPECT_NE(help.out.find("--linear-version N (" + std::to_string(kLinearVersionMin) + "-" +
                          std::to_string(kLinearVersionMax) + ":"),
            std::string::npos)
      << help.out;
  const std::string generate = "generate --model /nonexistent/model --prompt-ids 1 ";
  struct Case { std::string flag; int last; };
  for (const Case& c : {Case{"--attention-version ", last_attention}, Case{"--linear-version ", kLinearVersionMax}}) {
    auto last = run_nanovllm(generate + c.flag + std::to_string(c.last), "");
    EXPECT_EQ(last.exit_code, 1) << c.flag << c.last << ": " << last.err;
    auto next = run_nanovllm(generate + c.flag + std::to_string(c.last + 1), "");
    EXPECT_EQ(next.exit_code, 2) << c.flag << c.last + 1;
    EXPECT_TRUE(test::is_one_error_line(next.err)) << next.err;
    EXPECT_NE(next.err.find(", " + std::to_string(c.last) + "]"), std::string::npos) << next.err;
  }
}

TEST(E2E_Cli, BadInputExitsOneWithOneLine) {
  struct Case { const char* input; const char* message; };
  const Case cases[] = {
      {"[1,2\n", "error: stdin line 1, column 5: expected ',' or ']' after an array element\n"},
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

// ---------------------------------------------------------------------------------------------------
// generate, logits, bench

namespace {

std::string golden_model(const std::string& name) { return test::data_path("golden/" + name); }

std::string ids_arg(const Json& ids) {
  std::string s;
  for (const Json& id : ids.as_array()) s += (s.empty() ? "" : ",") + std::to_string(id.as_int64());
  return s;
}

}  // namespace

TEST(E2E_Cli, LogitsCommandMatchesTransformers) {
  Json golden = test::read_json(test::data_path("golden/tiny-qwen3-b.golden.json"));
  const Json& c = golden.at("cases").as_array()[3];  // a 64-token prompt
  auto r = run_nanovllm("logits --device cpu --model " + golden_model("tiny-qwen3-b") + " --prompt-ids " +
                        ids_arg(c.at("prompt_ids")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json got = Json::parse(r.out, "stdout");
  const auto& want = c.at("last_logits").as_array();
  ASSERT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); i++) {
    double d = got.as_array()[i].as_double() - want[i].as_double();
    num += d * d, den += want[i].as_double() * want[i].as_double();
  }
  EXPECT_LE(std::sqrt(num / den), 1e-4);
}

TEST(E2E_Cli, GenerateJsonLinesInPromptOrder) {
  Json golden = test::read_json(test::data_path("golden/tiny-qwen3-a.golden.json"));
  const auto& cases = golden.at("cases").as_array();
  auto r = run_nanovllm("generate --device cpu --model " + golden_model("tiny-qwen3-a") +
                        " --temperature 0 --ignore-eos --max-tokens 5 --json --prompt-ids " +
                        ids_arg(cases[4].at("prompt_ids")) + " --prompt-ids " + ids_arg(cases[1].at("prompt_ids")));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int index = 0;
  for (int k : {4, 1}) {
    ASSERT_TRUE(std::getline(lines, line));
    Json out = Json::parse(line, "line");
    EXPECT_EQ(out.at("index").as_int64(), index++);
    EXPECT_EQ(out.at("prompt_token_ids").dump(), cases[k].at("prompt_ids").dump());
    ASSERT_EQ(out.at("token_ids").size(), 5u);
    for (size_t s = 0; s < 5; s++)
      EXPECT_EQ(out.at("token_ids").as_array()[s].as_int64(), cases[k].at("greedy").as_array()[s].at("token").as_int64());
    EXPECT_EQ(out.find("text"), nullptr);  // no tokenizer in this checkpoint
  }
  EXPECT_FALSE(std::getline(lines, line));
}

TEST(E2E_Cli, GenerateTextOnTheEmbeddedDefault) {
  // No --model: the tiny random-weight Qwen3 with the real tokenizer. Its text is gibberish, so check
  // what must hold: the prompt went through the chat template and the tokenizer, and "text" is what the
  // detokenize command makes of "token_ids".
  auto r = run_nanovllm("generate --device cpu --prompt 'Hello there' --chat --max-tokens 6 --seed 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Json out = Json::parse(r.out, "stdout");
  auto tok = run_nanovllm("tokenize", "\"<|im_start|>user\\nHello there<|im_end|>\\n<|im_start|>assistant\\n\"\n");
  EXPECT_EQ(out.at("prompt_token_ids").dump() + "\n", tok.out);
  auto detok = run_nanovllm("detokenize", out.at("token_ids").dump() + "\n");
  EXPECT_EQ(Json::parse(detok.out, "d").as_string(), out.at("text").as_string());
}

// Without --json each prompt is printed as nano-vllm's example.py prints it (`Prompt: {prompt!r}`): the text the
// engine was given, here Qwen3's chat template around the user's turn; not a decoding of its ids, which differs
// where the tokenizer's normalizer (NFC, tokenizer.json) changed the text: "e" + U+0301 (combining acute) would
// come back as the one character U+00E9.
TEST(E2E_Cli, GenerateTextPrintsThePromptAsGivenNotItsIdsDecoded) {
  auto r = run_nanovllm("generate --device cpu --prompt \"$(printf 'Cafe\\314\\201')\" --chat --max-tokens 1 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Prompt: \"<|im_start|>user\\nCafe\xCC\x81<|im_end|>\\n<|im_start|>assistant\\n\"\nCompletion: \"", 0),
            0u)
      << r.out;
}

// The text commands' mistakes, each one line (text.cpp: "error: stdin line N: ..." and exit 1 for a bad line; exit 2
// for a usage error). Qwen3's tokenizer has 151,669 ids (tokenizer.json: 0..151668), so 151669 is one past the last;
// a JSON value of the wrong type is named with the line; bench-tokenizer without --file is a usage error.
TEST(E2E_Cli, TextCommandsNameTheLineOfABadValue) {
  auto past = run_nanovllm("detokenize", "[151668]\n[151669]\n");
  EXPECT_EQ(past.exit_code, 1);
  EXPECT_EQ(past.err, "error: stdin line 2: unknown token id 151669 (the vocabulary has ids 0..151668)\n");
  EXPECT_EQ(std::count(past.out.begin(), past.out.end(), '\n'), 1) << past.out;  // line 1's answer, then the error
  auto number = run_nanovllm("tokenize", "\"a\"\n5\n");
  EXPECT_EQ(number.exit_code, 1);
  EXPECT_EQ(number.err, "error: stdin line 2: expected a JSON string, got a number\n");
  auto string = run_nanovllm("detokenize", "\"a\"\n");
  EXPECT_EQ(string.exit_code, 1);
  EXPECT_EQ(string.err, "error: stdin line 1: expected a JSON array of token ids, got a string\n");
  auto no_file = run_nanovllm("bench-tokenizer");
  EXPECT_EQ(no_file.exit_code, 2) << no_file.err;
  EXPECT_EQ(no_file.err.rfind("error: give at least one --file FILE to encode (usage: ", 0), 0u) << no_file.err;
  EXPECT_TRUE(test::is_one_error_line(no_file.err)) << no_file.err;
}

// detokenize checks each id as written, a 64-bit JSON integer, before it becomes a 32-bit id: -4294967295 is
// -(2^32 - 1), which a cast to int32 would wrap to 1 (a valid id); it is refused as the unknown id it is.
TEST(E2E_Cli, DetokenizeRefusesANegativeIdThatWouldWrapToAValidOne) {
  auto r = run_nanovllm("detokenize", "[-4294967295]\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: stdin line 1: unknown token id -4294967295 (the vocabulary has ids 0..151668)\n");
  EXPECT_EQ(r.out, "");
}

// A token id that is not a JSON integer is named as such, with the value as written (text.cpp's detokenize), not
// with the JSON reader's generic "expected an integer".
TEST(E2E_Cli, DetokenizeNamesAnIdThatIsNoInteger) {
  for (const std::string id : {"1.5", "true", "\"7\""}) {
    auto r = run_nanovllm("detokenize", "[" + id + "]\n");
    EXPECT_EQ(r.exit_code, 1) << id;
    EXPECT_EQ(r.err, "error: stdin line 1: token ids must be integers, got " + id + "\n");
  }
}

// bench-tokenizer repeats the text "until at least 20 MB have been encoded" (text.cpp): ceil(20 / MB) passes. A
// 3,000,000-byte file takes 7 passes (6 would be 18 MB), a 4,000,000-byte one exactly 5 (20 MB, no sixth), and a
// 3,999,500-byte one 6 (5 would be 19.9975 MB: a round-up by adding 0.999 gave 5).
TEST(E2E_Cli, BenchTokenizerEncodesAtLeast20MegabytesInWholePasses) {
  test::TempDir dir;
  for (const auto& [bytes, line] : {std::pair<size_t, std::string>{3000000, "encoded 3.00 MB (1 file) x 7 passes = 21.0 MB, "},
                                    {4000000, "encoded 4.00 MB (1 file) x 5 passes = 20.0 MB, "},
                                    {3999500, "encoded 4.00 MB (1 file) x 6 passes = 24.0 MB, "}}) {
    std::string text;
    while (text.size() < bytes) text += "hello world ";
    text.resize(bytes);
    write_file(dir / "text", text);
    auto r = run_nanovllm("bench-tokenizer --file " + dir / "text");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.rfind(line, 0), 0u) << r.out;
  }
}

// A workload longer than max_model_len is named by bench's flags before the model loads, not as the scheduler's
// "request 0" (bench's own warm-up). The workload's 4 requests are 149 + 111, 193 + 100, 113 + 119 and 148 + 107 tokens
// (Python's random, as there): the longest needs 293.
TEST(E2E_Cli, BenchRefusesAWorkloadLongerThanMaxModelLen) {
  const std::string workload = "bench --random tiny --device cpu --num-seqs 4 --max-input-len 200 --max-output-len 120";
  auto r = run_nanovllm(workload + " --max-model-len 292");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // The error ends stderr (a first run of --random tiny writes the checkpoint, and says so on a line before it).
  const std::string error = "error: bench: the workload's longest request needs 293 tokens (prompt + max_tokens, from "
                            "--max-input-len 200 and --max-output-len 120) but max_model_len is 292\n";
  ASSERT_GE(r.err.size(), error.size()) << r.err;
  EXPECT_EQ(r.err.substr(r.err.size() - error.size()), error) << r.err;
  EXPECT_EQ(r.out, "");
  auto fits = run_nanovllm(workload + " --max-model-len 293");
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  EXPECT_NE(fits.out.find("Total: 437tok"), std::string::npos) << fits.out;
}

TEST(E2E_Cli, BenchReproducesBenchPyWorkload) {
  // bench.py's RNG stream, cut short: Python gives 603 prompt and 437 output tokens for 4 requests with
  // max_input_len 200 and max_output_len 120 (random.seed(0); randint as bench.py draws them).
  auto r = run_nanovllm("bench --random tiny --device cpu --num-seqs 4 --max-input-len 200 --max-output-len 120");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Total: 437tok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prompt tokens 603,"), std::string::npos) << r.out;
  // The decode steps' host time in three parts, each >= 0, adding up to the decode time printed above.
  double decode = -1, bookkeeping = -1, queuing = -1, waiting = -1;
  const size_t at = r.out.find(" decode steps (");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, " decode steps (%lf s", &decode), 1) << r.out;
  const size_t host = r.out.find("decode steps on the host: ");
  ASSERT_NE(host, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + host,
                        "decode steps on the host: %lf s scheduling and bookkeeping, %lf s preparing and queuing the "
                        "step, %lf s waiting for its tokens",
                        &bookkeeping, &queuing, &waiting),
            3)
      << r.out;
  EXPECT_GE(bookkeeping, 0.0);
  EXPECT_GE(queuing, 0.0);
  EXPECT_GE(waiting, 0.0);
  EXPECT_NEAR(bookkeeping + queuing + waiting, decode, 0.01) << r.out;
  // bench prints the first part as the decode time less the other two, so the sum holds whatever they are. What
  // tells them apart: on the CPU a step's work runs while it is queued (Backend::wait_for_download_async does
  // nothing there), so preparing and queuing holds the steps' arithmetic, most of the decode time, and waiting
  // for the tokens next to none.
  EXPECT_GT(queuing, decode / 2) << r.out;
  EXPECT_LT(waiting, queuing) << r.out;
  // The decode bandwidth is the bytes over the decode time, with enough digits to be nonzero on the CPU (a whole
  // number printed 0 GB/s there).
  double gb = -1, gbps = -1;
  const size_t reads = r.out.find("decode reads >= ");
  ASSERT_NE(reads, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + reads, "decode reads >= %lf GB (weights + KV): %lf GB/s", &gb, &gbps), 2) << r.out;
  EXPECT_GT(gbps, 0.0) << r.out;
  EXPECT_NEAR(gbps, gb / decode, 0.02 * gb / decode + 0.005) << r.out;  // gb is printed to 0.1 GB
  // The overlapped loop launched most decode steps ahead; --no-overlap none.
  long long ahead = -1, steps = -1;
  const size_t overlap = r.out.find("decode steps launched before");
  ASSERT_NE(overlap, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + overlap, "decode steps launched before the tokens of the step ahead were read: %lld of %lld",
                        &ahead, &steps), 2) << r.out;
  EXPECT_GT(ahead, steps / 2) << r.out;
  EXPECT_LT(ahead, steps) << r.out;  // the first decode step follows a prefill
  auto plain = run_nanovllm("bench --random tiny --device cpu --num-seqs 4 --max-input-len 200 --max-output-len 120 --no-overlap");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("Total: 437tok"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("were read: 0 of"), std::string::npos) << plain.out;
}

TEST(E2E_Cli, TheEngineAndTheCommandLineDefaultToTheSameKernels) {
  // EngineConfig (chapter 01) cannot include the kernels' headers; its defaults must still be theirs, or a
  // library user would run other kernels than `nanovllm` does.
  const EngineConfig config;
  EXPECT_EQ(config.linear_version, kLinearVersionDefault);
  EXPECT_EQ(config.attention_version, kAttentionVersionDefault);
}

TEST(E2E_Cli, LinearVersionIsAnEngineOptionOfEveryEngineCommand) {
  // --linear-version picks chapter 06's projections on the GPU (1 to 8); out of range it is a usage
  // error in every command that builds an engine, bench and bench-step included.
  const std::string a = " --device cpu --model " + golden_model("tiny-qwen3-a");
  for (const std::string& command : {"generate" + a + " --prompt-ids 1,2", "logits" + a + " --prompt-ids 1,2",
                                    "bench" + a + " --num-seqs 1", "bench-step" + a + " --batch 1 --context 16"}) {
    for (const char* bad : {"0", "9", "x"}) {
      auto r = run_nanovllm(command + " --linear-version " + bad);
      EXPECT_EQ(r.exit_code, 2) << command << " --linear-version " << bad;
      EXPECT_TRUE(test::is_one_error_line(r.err)) << r.err;
      EXPECT_EQ(r.err.rfind("error: --linear-version ", 0), 0u) << r.err;
    }
  }
  auto r = run_nanovllm("generate" + a + " --prompt-ids 1,2 --linear-version 9");
  EXPECT_EQ(r.err.rfind("error: --linear-version must be in [1, 8], got 9 (usage: nanovllm generate", 0), 0u) << r.err;
  // The CPU has one projection: every version gives the same tokens.
  const std::string greedy = "generate" + a + " --prompt-ids 1,2,3 --max-tokens 4 --temperature 0";
  auto plain = run_nanovllm(greedy);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::string note = "note: --attention-version and --linear-version choose CUDA kernels; the CPU runs its reference code\n";
  EXPECT_EQ(plain.err.find(note), std::string::npos) << plain.err;
  for (const char* version : {"1", "2", "3", "4", "5", "6", "7", "8"}) {
    auto v = run_nanovllm(greedy + " --linear-version=" + version);
    EXPECT_EQ(v.exit_code, 0) << v.err;
    EXPECT_EQ(v.out, plain.out) << "--linear-version " << version;
    // A version other than the default is a request the CPU cannot honour: said, not silently ignored.
    EXPECT_EQ(v.err.find(note) != std::string::npos, std::string(version) != "8") << version << ": " << v.err;
  }
  auto attention = run_nanovllm(greedy + " --attention-version 3");
  EXPECT_EQ(attention.out, plain.out);
  EXPECT_NE(attention.err.find(note), std::string::npos) << attention.err;
  auto step = run_nanovllm("bench-step" + a + " --batch 1 --context 16 --iters 1 --linear-version 1");
  EXPECT_EQ(step.exit_code, 0) << step.err;
  // bench-step takes some of the engine options: its help lists them, and the general help says what they do.
  auto help = run_nanovllm("bench-step --help");
  EXPECT_NE(help.out.find(" --linear-version "), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("--max-num-seqs"), std::string::npos) << help.out;
  EXPECT_NE(run_nanovllm("help").out.find("--linear-version N (1-8"), std::string::npos);
}

TEST(E2E_Cli, BenchStepPrintsTheStepFloor) {
  // tiny-qwen3-b on the CPU (fp32): 557,856 weights read per step (its untied embedding only by rows;
  // Ch04_Config.Qwen3LayoutShapesAndParameterCounts counts them), 2,231,424 bytes; K/V: 3 sequences x 40
  // tokens x 3 layers x (K, V) x 2 KV heads x 64 dims x 4 bytes = 368,640 bytes.
  auto r = run_nanovllm("bench-step --device cpu --model " + golden_model("tiny-qwen3-b") +
                        " --batch 3 --context 40 --iters 200");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("floor: 2.6 MB per step (weights 2.2 MB + K/V 0.4 MB)\n"), std::string::npos) << r.out;
  // The host's share of the step: its two parts are inside the step time they make up.
  double step_ms = 0, queue_us = -1, wait_us = -1;
  const size_t at_step = r.out.find("step time: "), at_host = r.out.find("host per step: ");
  ASSERT_NE(at_step, std::string::npos) << r.out;
  ASSERT_NE(at_host, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at_step, "step time: %lf ms", &step_ms), 1) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at_host, "host per step: %lf us preparing and queuing, %lf us waiting", &queue_us,
                        &wait_us), 2) << r.out;
  EXPECT_GT(queue_us, 0.0);
  EXPECT_GE(wait_us, 0.0);
  EXPECT_LE((queue_us + wait_us) / 1000, step_ms * 1.01 + 0.01) << r.out;
  // The engine's loop over the same steps: on the CPU a step's work runs while it is queued, so nothing
  // overlaps and it takes about the synchronous step's time (a second timing of the same work). A step is
  // ~0.3 ms here, so each timing is the mean of 200 steps: the tens of milliseconds a busy machine (a build
  // beside the tests) may take from one step then move a mean by a fraction of a step, within the bounds.
  double overlapped_ms = 0;
  const size_t at_overlapped = r.out.find("overlapped step: ");
  ASSERT_NE(at_overlapped, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at_overlapped, "overlapped step: %lf ms", &overlapped_ms), 1) << r.out;
  EXPECT_GT(overlapped_ms, step_ms / 4) << r.out;
  EXPECT_LT(overlapped_ms, step_ms * 4 + 0.1) << r.out;
}

TEST(E2E_Cli, BadRequestsAndCheckpointsGiveOneErrorLine) {
  const std::string a = " --device cpu --model " + golden_model("tiny-qwen3-a");
  struct Case { std::string args; int exit_code; std::string message; };
  const Case cases[] = {
      // An option's bad value is a usage error (exit 2), whichever option it is.
      {"generate" + a + " --prompt-ids 1,2 --temperature -1", 2, "error: --temperature must be in [0, 1e+30], got -1 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --max-tokens 0", 2, "error: --max-tokens must be in [1, 2147483647], got 0 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --max-tokens 2147483648", 2,
       "error: --max-tokens must be in [1, 2147483647], got 2147483648 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --top-k -1", 2, "error: --top-k must be in [0, 2147483647], got -1 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --top-p 1e31", 2, "error: --top-p must be in (0, 1], got 1e31 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --top-p 0", 2, "error: --top-p must be in (0, 1], got 0 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --top-p -0.5", 2, "error: --top-p must be in (0, 1], got -0.5 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --top-p 1e-50", 2,
       "error: --top-p 1e-50 is 0 as a 32-bit float, outside (0, 1] (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --attention-version -1", 2,
       "error: --attention-version must be in [0, 12], got -1 (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --kv-cache-blocks 0", 2, "error: --kv-cache-blocks must be in [1, "},
      {"generate" + a + " --prompt-ids 1,2 --collectives nccl", 2, "error: --collectives must be spin or events, got 'nccl' (usage: "},
      {"bench-step --device cpu --model " + golden_model("tiny-qwen3-a") + " --collectives flags", 2,
       "error: --collectives must be spin or events, got 'flags' (usage: "},
      // The devices there are, and nano-vllm's range of ranks (Config: assert 1 <= tensor_parallel_size <= 8).
      {"generate --device gpu --model " + golden_model("tiny-qwen3-a") + " --prompt-ids 1,2", 2,
       "error: --device must be cpu or cuda, got 'gpu' (usage: "},
      {"generate" + a + " --prompt-ids 1,2 --tensor-parallel-size 9", 2,
       "error: --tensor-parallel-size must be in [1, 8], got 9 (usage: "},
      // A request the engine cannot run is a failure (exit 1).
      {"generate" + a + " --prompt-ids 1,512", 1, "error: request 0: token id 512 is outside the vocabulary [0, 512)\n"},
      {"generate" + a + " --prompt-ids 1,2 --max-model-len 4 --max-tokens 3", 1,
       "error: request 0: prompt (2 tokens) + max_tokens (3) exceeds max_model_len (4)\n"},
      {"generate" + a + " --prompt-ids 1,x", 2, ""},
      {"generate" + a, 2, ""},
      {"generate" + a + " --prompt hello", 1, ""},  // no tokenizer in this checkpoint
      {"generate" + a + " --prompt-ids 1 --block-size 20", 2, ""},
      {"generate --device cpu --model /nonexistent --prompt-ids 1", 1,
       "error: /nonexistent: no such model folder (No such file or directory)\n"},
      // The config.json itself given as the model: the folder is named, not "config.json/config.json".
      {"generate --device cpu --model " + golden_model("tiny-qwen3-a") + "/config.json --prompt-ids 1", 1,
       "error: " + golden_model("tiny-qwen3-a") + "/config.json: not a folder; a model is the folder that holds "
       "config.json and *.safetensors\n"},
      {"logits --device cpu --prompt-ids 1", 2, ""},
  };
  for (const Case& c : cases) {
    auto r = run_nanovllm(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << "\n" << r.err;
    EXPECT_TRUE(test::is_one_error_line(r.err)) << c.args << ": " << r.err;
    if (!c.message.empty()) {
      EXPECT_EQ(r.err.substr(0, c.message.size()), c.message) << c.args;
    }
  }
}

TEST(E2E_Cli, TruncatedCheckpointIsAnErrorNamingTheFile) {
  char dir_template[] = "/tmp/nanovllm-ckpt-XXXXXX";
  std::string dir = mkdtemp(dir_template);
  std::string src = golden_model("tiny-qwen3-a");
  std::string weights = read_file(src + "/model.safetensors");
  for (const char* f : {"config.json", "generation_config.json"}) {
    std::ofstream(dir + "/" + f) << read_file(src + "/" + f);
  }
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << weights.substr(0, weights.size() / 2);
  auto r = run_nanovllm("generate --device cpu --model " + dir + " --prompt-ids 1,2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(test::is_one_error_line(r.err)) << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  std::system(("rm -rf " + dir).c_str());
}

TEST(E2E_Cli, AMaxModelLenPastTheModelsPositionsIsClampedAndSaid) {
  // As nano-vllm's Config, the length is clamped to max_position_embeddings; a length the user gave is told so.
  const std::string model = golden_model("tiny-qwen3-a");
  const int positions = int(test::read_json(model + "/config.json").at("max_position_embeddings").as_int64());
  const std::string a = "generate --device cpu --model " + model + " --prompt-ids 1,2 --max-tokens 2 --temperature 0";
  const std::string note = "note: --max-model-len " + std::to_string(positions + 1) + " is more than the model's " +
                           std::to_string(positions) + " positions (max_position_embeddings): using " +
                           std::to_string(positions) + "\n";
  auto over = run_nanovllm(a + " --max-model-len " + std::to_string(positions + 1));
  ASSERT_EQ(over.exit_code, 0) << over.err;
  EXPECT_NE(over.err.find(note), std::string::npos) << over.err;
  auto at = run_nanovllm(a + " --max-model-len " + std::to_string(positions));
  ASSERT_EQ(at.exit_code, 0) << at.err;
  EXPECT_EQ(at.err.find("note: --max-model-len"), std::string::npos) << at.err;
  EXPECT_EQ(over.out, at.out);
  // logits runs one position more than its flag (the token after the prompt), bench 4096 where the flag is left
  // out: a length the command set itself is not the user's, and only the flag's value is compared.
  const std::string logits = "logits --device cpu --model " + model + " --prompt-ids 1,2 --max-model-len ";
  auto logits_over = run_nanovllm(logits + std::to_string(positions + 1));
  ASSERT_EQ(logits_over.exit_code, 0) << logits_over.err;
  EXPECT_NE(logits_over.err.find(note), std::string::npos) << logits_over.err;
  auto logits_at = run_nanovllm(logits + std::to_string(positions));
  ASSERT_EQ(logits_at.exit_code, 0) << logits_at.err;
  EXPECT_EQ(logits_at.err.find("note: --max-model-len"), std::string::npos) << logits_at.err;
}

TEST(E2E_Cli, GenerateHelpStatesTheSamplingDefaults) {
  // The defaults `generate --help` states are SamplingParams' own.
  const SamplingParams defaults;
  char temperature[16], top_p[16];
  std::snprintf(temperature, sizeof temperature, "%.1f", double(defaults.temperature));
  std::snprintf(top_p, sizeof top_p, "%.1f", double(defaults.top_p));
  const std::string help = run_nanovllm("generate --help").out;
  for (const std::string& stated : {"--max-tokens " + std::to_string(defaults.max_tokens),
                                    "--temperature " + std::string(temperature), "--top-k " + std::to_string(defaults.top_k),
                                    "--top-p " + std::string(top_p)})
    EXPECT_NE(help.find(stated), std::string::npos) << stated << "\n" << help;
}

TEST(E2E_Cli, EveryFlagAHelpNamesIsTaken) {
  // A command's --help names only flags the command takes: bench and bench-step take some of the engine
  // options, and their help listed them all (`bench-step --enforce-eager` was an unknown flag). Each flag
  // named is given alone, with no value: the error may be anything but "unknown flag".
  for (const char* command : {"generate", "logits", "bench", "bench-step", "tokenize", "detokenize", "chat-template",
                              "hash-blocks", "random-model", "bench-tokenizer"}) {
    const std::string help = run_nanovllm(std::string(command) + " --help").out;
    std::set<std::string> named;
    for (size_t at = help.find("--"); at != std::string::npos; at = help.find("--", at + 2)) {
      size_t end = at + 2;
      while (end < help.size() && (std::islower(static_cast<unsigned char>(help[end])) || help[end] == '-')) end++;
      if (end > at + 2 && help[at + 2] != '-') named.insert(help.substr(at, end - at));
    }
    EXPECT_GT(named.size(), 0u) << command;
    for (const std::string& flag : named) {
      if (flag == "--help" || flag == "--flag") continue;  // "--flag value or --flag=value"
      auto r = run_nanovllm(std::string(command) + " " + flag);
      EXPECT_EQ(r.err.find("unknown flag"), std::string::npos) << command << " " << flag << ": " << r.err;
    }
  }
}

TEST(E2E_Cli, EveryCommandTakesHelpAndFlagEqualsValue) {
  for (const char* command : {"generate", "logits", "bench", "bench-step", "tokenize", "detokenize", "chat-template",
                              "hash-blocks", "random-model", "bench-tokenizer"}) {
    auto r = run_nanovllm(std::string(command) + " --help");
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.err;
    EXPECT_EQ(r.out.rfind(std::string("usage: nanovllm ") + command, 0), 0u) << command << ": " << r.out;
    // `help COMMAND` says the same.
    auto h = run_nanovllm(std::string("help ") + command);
    EXPECT_EQ(h.exit_code, 0) << command << ": " << h.err;
    EXPECT_EQ(h.out, r.out) << command;
  }
  auto dash_h = run_nanovllm("-h");
  EXPECT_EQ(dash_h.exit_code, 0) << dash_h.err;
  EXPECT_EQ(dash_h.out, run_nanovllm("help").out);
  // `help help` was "unknown command 'help'" (found by hostile input, 2026-12-07): help is about itself.
  for (const char* about_help : {"help help", "help --help", "help -h", "--help help"}) {
    auto h = run_nanovllm(about_help);
    EXPECT_EQ(h.exit_code, 0) << about_help << ": " << h.err;
    EXPECT_EQ(h.out, dash_h.out) << about_help;
  }
  // `help nosuch` printed the general help, exit 0.
  auto unknown = run_nanovllm("help nosuch");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.err, "error: unknown command 'nosuch' (try: nanovllm help)\n");
  EXPECT_EQ(unknown.out, "");
  // --flag=value means --flag value; a switch takes no value.
  const std::string a = " --device cpu --model " + golden_model("tiny-qwen3-a") + " --temperature 0 ";
  auto spaced = run_nanovllm("generate" + a + "--prompt-ids 1,2,3 --max-tokens 3");
  auto equals = run_nanovllm("generate" + a + "--prompt-ids=1,2,3 --max-tokens=3");
  ASSERT_EQ(spaced.exit_code, 0) << spaced.err;
  ASSERT_EQ(equals.exit_code, 0) << equals.err;
  EXPECT_EQ(spaced.out, equals.out);
  auto bad = run_nanovllm("generate" + a + "--prompt-ids 1 --trace=yes");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err.rfind("error: flag --trace takes no value", 0), 0u) << bad.err;
}

TEST(E2E_Cli, SummaryLinesSayWhereItRanAndCountInEnglish) {
  auto r = run_nanovllm("generate --device cpu --model " + golden_model("tiny-qwen3-a") +
                        " --prompt-ids 1,2,3 --max-tokens 2 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.rfind("device cpu: ", 0), 0u) << r.err;  // the first line: device and KV blocks
  EXPECT_NE(r.err.find(" KV blocks of 256 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\n1 request: 3 tokens computed in 1 prefill step ("), std::string::npos) << r.err;
  // One of each is singular ("1 tokens" and "1 decode tokens" were printed).
  auto one = run_nanovllm("generate --device cpu --model " + golden_model("tiny-qwen3-a") +
                          " --prompt-ids 1 --max-tokens 2 --temperature 0 --ignore-eos");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.err.find("\n1 request: 1 token computed in 1 prefill step ("), std::string::npos) << one.err;
  EXPECT_NE(one.err.find(", 1 decode token in 1 step ("), std::string::npos) << one.err;
}

// The summary counts in English, zero in the plural ("0 steps"; only 1 is singular), and over two tensor-parallel
// ranks a line says that each rank ran every step: --max-tokens 1 is one prefill step and no decode step.
TEST(E2E_Cli, SummaryOfOnePrefillStepOnTwoRanks) {
  auto r = run_nanovllm("generate --device cpu --model " + golden_model("tiny-qwen3-a") +
                        " --prompt-ids 1,2,3 --max-tokens 1 --temperature 0 --tensor-parallel-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("\n1 request: 3 tokens computed in 1 prefill step ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", 0 decode tokens in 0 steps ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\ntensor parallel: 2 ranks, steps run by each: 1 1\n"), std::string::npos) << r.err;
}

TEST(E2E_Cli, BenchStepCountsEachOperationPerStep) {
  // tiny-qwen3-b (3 layers, 2 KV heads of 64 dims, vocabulary 1000) on the CPU, batch 10 at context 100. Per
  // step, attention runs once a layer (3 calls) and reads every context token's K and V once per layer: 10 x 100
  // tokens x 3 layers x (K, V) x 2 heads x 64 dims x 4 bytes = 3,072,000 bytes, 3.1 MB, also the floor's K/V;
  // the projection to the vocabulary (96 -> 1000) and the embedding run once a step. A linear layer moves its
  // weight, its input and its output, fp32 on the CPU (4 bytes), its logits fp32 too: qkv (96 -> 640) three
  // times, (96 x 640 + 10 x 96 + 10 x 640) x 4 x 3 = 825,600 bytes, 0.8 MB; the LM head once,
  // (96 x 1000 + 10 x 96 + 10 x 1000) x 4 = 427,840 bytes, 0.4 MB.
  auto r = run_nanovllm("bench-step --device cpu --model " + golden_model("tiny-qwen3-b") +
                        " --batch 10 --context 100 --iters 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("floor: 5.3 MB per step (weights 2.2 MB + K/V 3.1 MB)\n"), std::string::npos) << r.out;
  auto row = [&](const std::string& label, int* calls, double* mb) {
    const size_t at = r.out.find("\n" + label + " ");
    if (at == std::string::npos) return 0;
    return std::sscanf(r.out.c_str() + at + 1 + label.size(), " %d %*f %lf", calls, mb);
  };
  int calls = -1;
  double mb = -1;
  ASSERT_EQ(row("attention decode", &calls, &mb), 2) << r.out;
  EXPECT_EQ(calls, 3) << r.out;
  EXPECT_DOUBLE_EQ(mb, 3.1) << r.out;
  ASSERT_EQ(row("linear 10x96->1000", &calls, &mb), 2) << r.out;
  EXPECT_EQ(calls, 1) << r.out;
  EXPECT_DOUBLE_EQ(mb, 0.4) << r.out;
  ASSERT_EQ(row("linear 10x96->640", &calls, &mb), 2) << r.out;  // q, k and v: (6 + 2 + 2) heads x 64 dims
  EXPECT_EQ(calls, 3) << r.out;
  EXPECT_DOUBLE_EQ(mb, 0.8) << r.out;
  ASSERT_GE(row("embedding", &calls, &mb), 1) << r.out;
  EXPECT_EQ(calls, 1) << r.out;
}

TEST(E2E_Cli, BenchPrintsTheMeanDecodeStepInMilliseconds) {
  // "N decode steps (S s, M ms/step)": M is the decode time over the steps, in milliseconds: 1000 x S / N (S is
  // printed to 1 ms, so M agrees with it to within 1 ms over N steps, plus M's own rounding).
  auto r = run_nanovllm("bench --random tiny --device cpu --num-seqs 2 --max-input-len 100 --max-output-len 100");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  long long steps = 0;
  double seconds = -1, ms_per_step = -1;
  const size_t at = r.out.find(" decode steps (");
  ASSERT_NE(at, std::string::npos) << r.out;
  const size_t line = r.out.rfind(';', at);
  ASSERT_NE(line, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + line, "; %lld decode steps (%lf s, %lf ms/step)", &steps, &seconds, &ms_per_step), 3)
      << r.out;
  ASSERT_GT(steps, 0) << r.out;
  EXPECT_NEAR(ms_per_step, 1e3 * seconds / double(steps), 1.0 / double(steps) + 0.001) << r.out;
  EXPECT_GT(ms_per_step, 0.0) << r.out;
}

// The escapes of one_line (01_sequence/cli/main.cpp, and README's contract for quoted values): \t, \r and \n
// by name, every other byte below 0x20 as \xHH; here 'a' TAB 'b' CR 'c' 0x01 'd' ESC 'e', by hand.
TEST(E2E_Cli, EachControlCharacterInAQuotedNameHasItsOwnEscape) {
  auto r = run_nanovllm("\"$(printf 'a\\tb\\rc\\001d\\033e')\"", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: unknown command 'a\\tb\\rc\\x01d\\x1be' (try: nanovllm help)\n");
}

// Past ASCII, one_line keeps UTF-8 as it is but escapes what would still break the line or the encoding: the C1
// control NEL (U+0085, a line break to Unicode) and the line separator (U+2028) as \uHHHH, a byte outside
// valid UTF-8 (0xFF, the overlong pair C0 AF) as \xHH; 'e' with its acute accent stays. By hand:
// 'a' NEL 'b' LS 'c' FF 'd' e-acute 'e' C0 AF.
TEST(E2E_Cli, QuotedNamesStayOneLineOfUtf8) {
  auto r = run_nanovllm("\"$(printf 'a\\302\\205b\\342\\200\\250c\\377d\\303\\251e\\300\\257')\"", "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: unknown command 'a\\u0085b\\u2028c\\xffd\xc3\xa9" "e\\xc0\\xaf' (try: nanovllm help)\n");
}

// random-model prints one line saying what it wrote. The tiny preset's parameters, by hand from its shape
// (vocab 151936, hidden 64, intermediate 192, 2 layers, 4 heads and 2 KV heads of 32, tied): the embedding
// 151936 * 64 = 9723904; a layer q 128*64 + k 64*64 + v 64*64 + o 64*128 + 3 * 192*64 + norms 64+64+32+32
// = 61632, two of them 123264; the final norm 64: 9847232 in all, 19694464 bytes of bf16 (19.7 MB). Without
// --seed the seed is 0 (the usage's example), the bytes of --seed 0.
TEST(E2E_Cli, RandomModelSaysWhatItWroteWithSeedZeroByDefault) {
  test::TempDir dir;
  auto r = run_nanovllm("random-model --preset tiny --out " + dir / "m");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("wrote " + dir / "m" +
                                                 ": tiny, 9847232 parameters \\(19\\.7 MB of bf16\\), seed 0, "
                                                 "in [0-9]+\\.[0-9] s\n")))
      << r.out;
  auto zero = run_nanovllm("random-model --preset tiny --seed 0 --out " + dir / "zero");
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_EQ(read_file(dir / "m/model.safetensors"), read_file(dir / "zero/model.safetensors"));
}

// A quoted value past 2,000 bytes is cut there, and the line says how many bytes it left out (one_line in
// 01_sequence/cli/main.cpp). A name of 3,000 'a's: 2,000 shown, 1,000 left out. A cut never splits a UTF-8
// character: 1,999 'a's, then "é" (2 bytes, 0xC3 0xA9, bytes 2,000 and 2,001), then 1,000 'b's (3,001
// bytes) is cut before the "é", after 1,999 bytes, leaving out 1,002.
TEST(E2E_Cli, ALongQuotedNameIsCutAtTwoThousandBytesOnACharacterBoundary) {
  auto r = run_nanovllm(std::string(3000, 'a'), "");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: unknown command '" + std::string(2000, 'a') +
                       " ... (1000 more bytes)' (try: nanovllm help)\n");
  auto utf8 = run_nanovllm(std::string(1999, 'a') + "\xc3\xa9" + std::string(1000, 'b'), "");
  EXPECT_EQ(utf8.exit_code, 2);
  EXPECT_EQ(utf8.err, "error: unknown command '" + std::string(1999, 'a') +
                          " ... (1002 more bytes)' (try: nanovllm help)\n");
}
