// The command line's flag parser and the subcommands that need no model run (01_sequence/cli/).
#include <gtest/gtest.h>

#include "01_sequence/cli/flags.h"
#include "04_model_runner/checkpoint/config.h"
#include "04_model_runner/checkpoint/random_model.h"
#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

TEST(Ch01_Cli, RandomModelCommand) {
  TempDir dir;
  auto run = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    Flags flags(int(argv.size()), argv.data(), {"preset", "out", "seed", "tokenizer"}, {"force"});
    return cmd_random_model(flags);
  };
  EXPECT_THROW(run({"--preset", "tiny"}), UsageError);         // no --out
  EXPECT_THROW(run({"--out", dir / "m"}), UsageError);          // no --preset
  try {
    run({"--preset", "big", "--out", dir / "m"});
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--preset: unknown preset 'big' (known: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b)");
  }
  EXPECT_THROW(run({"--preset", "tiny", "--out", dir / "m", "--seed", "-1"}), UsageError);
  EXPECT_EQ(run({"--preset", "tiny", "--out", dir / "m", "--seed", "5"}), 0);
  EXPECT_EQ(ModelConfig::load(dir / "m").vocab_size, 151936);
  // --seed 5 through the command line gives the library's bytes for seed 5.
  TempDir again;
  write_random_model("tiny", again.path(), 5);
  EXPECT_EQ(read_bytes(dir / "m/model.safetensors"), read_bytes(again / "model.safetensors"));
  // A folder that is not empty is refused, so a checkpoint is not overwritten by mistake; --force does.
  const std::vector<uint8_t> seed5 = read_bytes(dir / "m/model.safetensors");
  EXPECT_EQ(error_of([&] { run({"--preset", "tiny", "--out", dir / "m", "--seed", "6"}); }),
            dir / "m" + ": the folder is not empty (give a new or empty folder, or --force to overwrite)");
  EXPECT_EQ(read_bytes(dir / "m/model.safetensors"), seed5);
  write_string(dir / "notes.txt", "mine");
  EXPECT_NE(error_of([&] { run({"--preset", "tiny", "--out", dir.path()}); }), "");  // any file counts
  EXPECT_EQ(run({"--preset", "tiny", "--out", dir / "m", "--seed", "6", "--force"}), 0);
  EXPECT_NE(read_bytes(dir / "m/model.safetensors"), seed5);
  TempDir empty;
  EXPECT_EQ(run({"--preset", "tiny", "--out", empty.path()}), 0);  // an empty folder is fine
}

TEST(Ch01_Cli, FlagValuesAreReadAsWrittenOrRefused) {
  auto parse = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return Flags(int(argv.size()), argv.data(), {"temperature", "max-tokens", "prompt", "prompt-ids"}, {"chat"});
  };
  auto temperature = [&](const std::string& text) { return parse({"--temperature", text}).get_double("temperature", 1, 0, 100); };
  // Decimal numbers, as get_int takes integers; strtod alone took leading space, hex and "inf".
  EXPECT_EQ(temperature("0.5"), 0.5);
  EXPECT_EQ(temperature("+.5"), 0.5);
  EXPECT_EQ(temperature("5."), 5.0);
  EXPECT_EQ(temperature("5e-1"), 0.5);
  EXPECT_GT(temperature("1e-320"), 0.0);  // an underflow is still a number (it was "expects a number")
  for (const char* bad : {" 0.5", "0.5 ", "0x1p-1", "inf", "nan", "1e400", "0.5x", "-", "e5"})
    EXPECT_EQ(error_of([&] { temperature(bad); }), std::string("--temperature expects a number, got '") + bad + "'")
        << bad;
  EXPECT_EQ(error_of([&] { temperature("200"); }), "--temperature must be in [0, 100], got 200");
  // A flag of one value given twice is refused; the lists repeat; a switch twice is still one switch.
  EXPECT_EQ(error_of([&] { parse({"--max-tokens", "2", "--max-tokens=4"}); }),
            "flag --max-tokens given twice ('2' and '4')");
  const Flags lists = parse({"--prompt", "a", "--prompt-ids", "1", "--prompt", "b", "--chat", "--chat"});
  EXPECT_EQ(lists.get_all("prompt"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(lists.in_order().size(), 3u);
  EXPECT_TRUE(lists.has("chat"));
  // A value left out: the next flag is named, not the argument after it ("unexpected argument '1'").
  EXPECT_EQ(error_of([&] { parse({"--max-tokens", "--prompt-ids", "1"}); }),
            "flag --max-tokens needs a value, got the flag '--prompt-ids'");
  EXPECT_EQ(error_of([&] { parse({"--temperature", "--chat"}); }), "flag --temperature needs a value, got the flag '--chat'");
  EXPECT_EQ(error_of([&] { parse({"--prompt-ids", "--max-tokens=2"}); }),
            "flag --prompt-ids needs a value, got the flag '--max-tokens=2'");
  // --prompt's text may be anything, a flag's name included; a value that only looks like a flag is a value.
  EXPECT_EQ(parse({"--prompt", "--chat"}).get("prompt"), "--chat");
  EXPECT_EQ(parse({"--prompt-ids", "--5"}).get("prompt-ids"), "--5");
}
