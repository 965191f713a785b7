// The command line's flag parser and the subcommands that need no model run (01_sequence/cli/), and the file
// helpers under them (01_sequence/base/files.h).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "01_sequence/cli/flags.h"
#include "04_model_runner/checkpoint/config.h"
#include "04_model_runner/checkpoint/random_model.h"
#include "tests/test_util.h"

using namespace nanovllm;
using namespace nanovllm::test;

namespace {

// Flags parsed from `args` as a command's argv after its name, with the command's value and boolean flags.
Flags parse_flags(std::vector<std::string> args, const std::vector<std::string>& value_flags,
                  const std::vector<std::string>& bool_flags) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return Flags(int(argv.size()), argv.data(), value_flags, bool_flags);
}

}  // namespace

TEST(Ch01_Cli, RandomModelCommand) {
  TempDir dir;
  auto run = [](std::vector<std::string> args) {
    return cmd_random_model(parse_flags(std::move(args), {"preset", "out", "seed", "tokenizer"}, {"force"}));
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
    return parse_flags(std::move(args), {"temperature", "max-tokens", "prompt", "prompt-ids"}, {"chat"});
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
  EXPECT_EQ(lists.get("prompt"), "b");  // get() of a list is its last value (flags.h)
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

// Ranges are closed at both ends unless open_low (flags.h: "[lo, hi] (or (lo, hi] with open_low)"): each end is a
// value the flag takes, and only an open low end refuses itself, named "(lo, hi]". An empty value is refused for
// every flag but --prompt, whose empty text is a prompt (flags.cpp), given as "--prompt ''" or "--prompt=".
TEST(Ch01_Cli, RangesTakeTheirEndsAndOnlyThePromptMayBeEmpty) {
  auto parse = [](std::vector<std::string> args) {
    return parse_flags(std::move(args), {"temperature", "top-p", "max-tokens", "prompt"}, {});
  };
  EXPECT_EQ(parse({"--temperature", "0"}).get_double("temperature", 1, 0, 100), 0.0);
  EXPECT_EQ(parse({"--temperature", "100"}).get_double("temperature", 1, 0, 100), 100.0);
  EXPECT_EQ(parse({"--top-p", "1"}).get_double("top-p", 1, 0, 1, /*open_low=*/true), 1.0);
  EXPECT_EQ(error_of([&] { parse({"--top-p", "0"}).get_double("top-p", 1, 0, 1, /*open_low=*/true); }),
            "--top-p must be in (0, 1], got 0");
  EXPECT_EQ(parse({"--max-tokens", "1"}).get_int("max-tokens", 5, 1, 8), 1);
  EXPECT_EQ(parse({"--max-tokens", "8"}).get_int("max-tokens", 5, 1, 8), 8);
  for (const std::vector<std::string>& empty : {std::vector<std::string>{"--prompt", ""}, {"--prompt="}}) {
    const Flags flags = parse(empty);
    EXPECT_TRUE(flags.has("prompt"));
    EXPECT_EQ(flags.get("prompt", "fallback"), "");
  }
  EXPECT_EQ(error_of([&] { parse({"--max-tokens="}); }), "flag --max-tokens needs a value, got ''");
  // One past each end is refused, the low ends too (--max-tokens 0, a negative temperature).
  EXPECT_EQ(error_of([&] { parse({"--max-tokens", "0"}).get_int("max-tokens", 5, 1, 8); }),
            "--max-tokens must be in [1, 8], got 0");
  EXPECT_EQ(error_of([&] { parse({"--max-tokens", "9"}).get_int("max-tokens", 5, 1, 8); }),
            "--max-tokens must be in [1, 8], got 9");
  EXPECT_EQ(error_of([&] { parse({"--temperature", "-0.5"}).get_double("temperature", 1, 0, 100); }),
            "--temperature must be in [0, 100], got -0.5");
}

// --block-size and --device are checked as flags (flags.h), before any model is read: a block size from 16 to 65,536
// that is a multiple of 16, and cpu or cuda.
TEST(Ch01_Cli, BlockSizeAndDeviceAreCheckedAsFlags) {
  auto flags = [](std::vector<std::string> args) { return parse_flags(std::move(args), {"block-size", "device"}, {}); };
  EXPECT_EQ(block_size_from(flags({}), 256), 256);
  EXPECT_EQ(block_size_from(flags({"--block-size", "16"}), 256), 16);
  EXPECT_EQ(block_size_from(flags({"--block-size", "65536"}), 256), 65536);
  EXPECT_EQ(error_of([&] { block_size_from(flags({"--block-size", "24"}), 256); }), "--block-size must be a multiple of 16");
  EXPECT_EQ(error_of([&] { block_size_from(flags({"--block-size", "0"}), 256); }), "--block-size must be in [16, 65536], got 0");
  EXPECT_EQ(error_of([&] { block_size_from(flags({"--block-size", "65552"}), 256); }),
            "--block-size must be in [16, 65536], got 65552");
  EXPECT_EQ(device_from(flags({})), "");
  EXPECT_EQ(device_from(flags({"--device", "cpu"})), "cpu");
  EXPECT_EQ(device_from(flags({"--device", "cuda"})), "cuda");
  EXPECT_EQ(error_of([&] { device_from(flags({"--device", "gpu"})); }), "--device must be cpu or cuda, got 'gpu'");
}

// --collectives takes exactly spin (the default) and events (flags.h); anything else is a usage error naming it.
TEST(Ch01_Cli, CollectivesAreSpinOrEvents) {
  auto collectives = [](std::vector<std::string> args) {
    return collectives_from(parse_flags(std::move(args), {"collectives"}, {}));
  };
  EXPECT_EQ(collectives({}), "spin");
  EXPECT_EQ(collectives({"--collectives", "spin"}), "spin");
  EXPECT_EQ(collectives({"--collectives", "events"}), "events");
  EXPECT_EQ(error_of([&] { collectives({"--collectives", "nccl"}); }), "--collectives must be spin or events, got 'nccl'");
}

// Every argument is a flag or a flag's value: a stray word (a value given twice, a quoted prompt split by the shell)
// is a usage error naming it, never ignored.
TEST(Ch01_Cli, AnArgumentThatIsNoFlagIsRefused) {
  auto parse = [](std::vector<std::string> args) {
    return parse_flags(std::move(args), {"max-tokens"}, {"json"});
  };
  EXPECT_EQ(error_of([&] { parse({"stray"}); }), "unexpected argument 'stray'");
  EXPECT_EQ(error_of([&] { parse({"--max-tokens", "2", "3"}); }), "unexpected argument '3'");
  EXPECT_EQ(error_of([&] { parse({"--json", "-x"}); }), "unexpected argument '-x'");
  // A misspelt flag is named, never skipped; a switch takes no value, even a "yes" that reads as one.
  EXPECT_EQ(error_of([&] { parse({"--max-token", "2"}); }), "unknown flag '--max-token'");
  EXPECT_EQ(error_of([&] { parse({"--json=yes"}); }), "flag --json takes no value");
  EXPECT_TRUE(parse({"--json"}).has("json"));
}

// Integers are read whole, as get_double reads numbers: "5x" is not 5. get_uint64 (--seed) takes all of [0, 2^64) and
// nothing else: no sign, no hex, no white space, nothing past 2^64 - 1.
TEST(Ch01_Cli, IntegerValuesAreReadWholeOrRefused) {
  auto parse = [](std::vector<std::string> args) {
    return parse_flags(std::move(args), {"seed", "max-tokens"}, {});
  };
  auto seed = [&](const std::string& text) { return parse({"--seed", text}).get_uint64("seed", 7); };
  EXPECT_EQ(parse({}).get_uint64("seed", 7), 7u);
  EXPECT_EQ(seed("0"), 0u);
  EXPECT_EQ(seed("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"5x", "-1", "+1", "0x10", " 5", "5 ", "18446744073709551616"})
    EXPECT_EQ(error_of([&] { seed(bad); }), std::string("--seed expects a non-negative integer, got '") + bad + "'")
        << bad;
  EXPECT_EQ(error_of([&] { parse({"--max-tokens", "2x"}).get_int("max-tokens", 1, 1, 8); }),
            "--max-tokens expects an integer, got '2x'");
}

// LineReader (flags.h), on which the JSON Lines commands and --requests name their lines: lines come without their
// newline, numbered from 1, and a last line without a newline is still a line with its own number. A line of
// kMaxLineBytes (4 MiB) is read whole; one byte more is refused, naming the file and the line.
TEST(Ch01_Cli, LineReaderNumbersEveryLineAndRefusesOneByteOverTheLimit) {
  TempDir dir;
  write_string(dir / "three", "a\n\nc");
  LineReader three(dir / "three");
  std::string line;
  for (const std::string want : {"a", "", "c"}) {
    ASSERT_TRUE(three.next(line)) << want;
    EXPECT_EQ(line, want);
  }
  EXPECT_EQ(three.line_number(), 3);
  EXPECT_FALSE(three.next(line));
  const size_t limit = LineReader::kMaxLineBytes;
  ASSERT_EQ(limit, size_t(4) << 20);
  write_string(dir / "long", std::string(limit, 'x') + "\n" + std::string(limit + 1, 'y') + "\n");
  LineReader lines(dir / "long");
  ASSERT_TRUE(lines.next(line));
  EXPECT_EQ(line, std::string(limit, 'x'));
  EXPECT_EQ(error_of([&] { lines.next(line); }), dir / "long" + " line 2: longer than 4 MiB");
  // A byte order mark is left out of line 1 only: anywhere else it is the line's own bytes.
  const std::string bom = "\xEF\xBB\xBF";
  write_string(dir / "bom", bom + "[1]\n" + bom + "[2]\n");
  LineReader marked(dir / "bom");
  ASSERT_TRUE(marked.next(line));
  EXPECT_EQ(line, "[1]");
  ASSERT_TRUE(marked.next(line));
  EXPECT_EQ(line, bom + "[2]");
}

// optional_file_exists (files.h): false when nothing is at the path, and nothing is at a path below a regular file
// (the system's ENOTDIR), as nothing is at a missing one; a folder there is a mistake named.
TEST(Ch01_Files, NothingIsBelowARegularFile) {
  TempDir dir;
  write_string(dir / "file", "x");
  EXPECT_FALSE(optional_file_exists(dir / "missing"));
  EXPECT_FALSE(optional_file_exists(dir / "file/tokenizer.json"));
  EXPECT_TRUE(optional_file_exists(dir / "file"));
  EXPECT_EQ(error_of([&] { optional_file_exists(dir.path()); }), dir.path() + ": cannot read: it is a directory");
}

// make_directories (files.h) is mkdir -p: folders that exist are fine, a regular file where a folder should be is
// named ("File exists"), never taken for the folder.
TEST(Ch01_Files, MakeDirectoriesRefusesAFileInTheWay) {
  TempDir dir;
  make_directories(dir / "a/b/c");
  make_directories(dir / "a/b");
  EXPECT_TRUE(is_directory(dir / "a/b/c"));
  write_string(dir / "file", "x");
  EXPECT_EQ(error_of([&] { make_directories(dir / "file"); }), dir / "file" + ": cannot create the directory: File exists");
  EXPECT_FALSE(is_directory(dir / "file"));
}

// AtomicFileWriter (files.h): nothing is left behind by a writer destroyed uncommitted, and a commit that cannot
// rename into place (a folder is there) is an error, not a file silently lost; either way no temporary file stays.
TEST(Ch01_Files, AnAtomicWriteLeavesTheFileOrNothing) {
  TempDir dir;
  {
    AtomicFileWriter out(dir / "abandoned");
    out.write("half", 4);
  }
  EXPECT_EQ(test::folder_entries(dir.path()), std::set<std::string>{});
  make_directories(dir / "folder/inside");
  EXPECT_EQ(error_of([&] { write_file(dir / "folder", "text"); }),
            dir / "folder" + ": cannot rename the temporary file: Is a directory");
  EXPECT_EQ(test::folder_entries(dir.path()), std::set<std::string>{"folder"});
  write_file(dir / "done", "text");
  EXPECT_EQ(read_file(dir / "done"), "text");
  EXPECT_EQ(test::folder_entries(dir.path()), (std::set<std::string>{"done", "folder"}));
}

// read_file (files.h): a folder is refused with the documented reason "it is a directory", not the "not a regular
// file" of a FIFO or a device (open() of a folder for reading succeeds on Linux; the check is on the descriptor).
TEST(Ch01_Files, ReadingAFolderSaysItIsADirectory) {
  TempDir dir;
  EXPECT_EQ(error_of([&] { read_file(dir.path()); }), dir.path() + ": cannot read: it is a directory");
}

// read_file's FileLimit (files.h) is the most a file may hold: a file of exactly the limit is read whole, one byte
// more is refused, naming its size and the limit (here 1 MiB).
TEST(Ch01_Files, AFileOfExactlyItsLimitIsReadAndOneByteMoreIsNot) {
  TempDir dir;
  const FileLimit mib{1LL << 20, "a test file"};
  write_file(dir / "exact", std::string(size_t(1) << 20, 'x'));
  write_file(dir / "over", std::string((size_t(1) << 20) + 1, 'x'));
  EXPECT_EQ(error_of([&] { EXPECT_EQ(read_file(dir / "exact", mib).size(), size_t(1) << 20); }), "");
  EXPECT_EQ(error_of([&] { read_file(dir / "over", mib); }),
            dir / "over" + ": cannot read: 1048577 bytes, more than the 1 MiB a test file may hold");
}

// A read that fails rather than ends is an error, never a short or empty file (files.h, flags.h): /proc/self/mem is a
// regular file of size 0 whose read at offset 0 (an unmapped address) fails with EIO.
TEST(Ch01_Files, AReadThatFailsIsAnErrorNotAnEmptyFile) {
  if (!is_regular_file("/proc/self/mem")) GTEST_SKIP() << "no /proc/self/mem here (not Linux's procfs)";
  EXPECT_EQ(error_of([] { read_file("/proc/self/mem"); }), "/proc/self/mem: read failed");
}

// is_regular_file (files.h) answers for a regular file only: a folder, or nothing, at the path is not one.
TEST(Ch01_Files, AFolderIsNoRegularFile) {
  TempDir dir;
  write_string(dir / "file", "x");
  EXPECT_TRUE(is_regular_file(dir / "file"));
  EXPECT_FALSE(is_regular_file(dir.path()));
  EXPECT_FALSE(is_regular_file(dir / "missing"));
}

TEST(Ch01_Cli, RandomModelNamesTheFlagThatIsMissing) {
  // Without --preset or --out the usage error says which flag is required, not that the empty preset is
  // unknown (an unknown preset is a different mistake, with its own message above).
  auto run = [](std::vector<std::string> args) {
    return cmd_random_model(parse_flags(std::move(args), {"preset", "out", "seed", "tokenizer"}, {"force"}));
  };
  TempDir dir;
  EXPECT_EQ(error_of([&] { run({"--out", dir / "m"}); }), "--preset PRESET is required");
  EXPECT_EQ(error_of([&] { run({"--preset", "tiny"}); }), "--out DIR is required");
  EXPECT_FALSE(is_directory(dir / "m"));
}
