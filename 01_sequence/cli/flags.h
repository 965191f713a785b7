// flags.h: the command line's flag parser, shared by every subcommand of build/nanovllm, and the
// subcommands main() dispatches to.
//
// The contract (README.md, "Command line"): errors go to stderr as one line "error: ...", exit code 2 for a usage error
// (unknown flag, missing or malformed value) and 1 for any other failure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "01_sequence/base/common.h"

namespace nanovllm {

// A mistake in the command line itself: main() exits with code 2 instead of 1.
struct UsageError : Error {
  using Error::Error;
};

// Flags of one subcommand: `--name value` or `--name=value` for value flags (once each, but kRepeatableFlags any
// number of times), `--name` alone for switches. Anything else is a UsageError naming the offending argument.
// The value flags that may be given more than once, each time adding to a list; any other value flag given
// twice is a UsageError.
const std::vector<std::string> kRepeatableFlags = {"prompt", "prompt-ids", "requests", "file"};

class Flags {
 public:
  Flags(int argc, char** argv, const std::vector<std::string>& value_flags,
        const std::vector<std::string>& switches);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  // The value given for a value flag (the last, for a repeatable one), or `fallback` when absent.
  std::string get(const std::string& name, const std::string& fallback = "") const;
  const std::vector<std::string>& get_all(const std::string& name) const;
  // Numeric values, checked against [lo, hi] (or (lo, hi] with open_low); a malformed or out-of-range value is a
  // UsageError naming the range.
  int64_t get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  double get_double(const std::string& name, double fallback, double lo, double hi, bool open_low = false) const;
  uint64_t get_uint64(const std::string& name, uint64_t fallback) const;
  // Every value flag in command-line order, as (name, value): keeps --prompt / --prompt-ids interleaved.
  const std::vector<std::pair<std::string, std::string>>& in_order() const { return in_order_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;  // switches map to {""}
  std::vector<std::pair<std::string, std::string>> in_order_;
};

// Output that never arrived is an error, not a success: both throw Error "cannot write to stdout:
// <reason>" when a write failed (a full disk, a closed stdout). write_stdout writes `text` to stdout;
// flush_stdout flushes std::cout and stdout (main() calls it after every command).
void write_stdout(const std::string& text);
void flush_stdout();
// Stdin, or a regular file, read line by line, for the JSON Lines commands and `generate --requests`. The
// constructors throw Error "stdin: cannot read: <reason>" for a stdin that cannot be read (closed, or a
// directory, which would read as empty), and "PATH: cannot read: <reason>" for a file that is missing or not a
// regular file (a FIFO would wait for a writer, a device such as /dev/zero never end: stdin is the way to pipe).
// next() gives the next line without its newline and returns false at the end; a read that failed rather than
// ended is Error "NAME: read failed: <reason>", and a line longer than kMaxLineBytes is Error "NAME line N:
// longer than 4 MiB", since a stream with no newline (a binary file, /dev/zero) would otherwise grow one
// string without bound. NAME is "stdin" or the path. A byte order mark at the start of line 1, which Windows
// editors write at the start of a UTF-8 file and which is not JSON, is left out of the line.
class LineReader {
 public:
  static constexpr size_t kMaxLineBytes = size_t(4) << 20;
  LineReader();                                  // stdin
  explicit LineReader(const std::string& path);  // a regular file
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  bool next(std::string& line);
  int line_number() const { return line_number_; }  // of the line next() gave last, from 1
  const std::string& name() const { return name_; }

 private:
  bool read_line(std::string& line);  // next() without the byte order mark's check
  FILE* file_;
  std::string name_;
  int line_number_ = 0;
};

// --attention-version N: a kernel of chapter 05's ladder (0 .. the last of attention_versions(),
// 05_attention/attention.h), or the default -1, each phase's fastest. A usage error names the range.
int attention_version_from(const Flags& flags);
// --linear-version N: which of chapter 06's projection versions the GPU may use (kLinearVersionMin to
// kLinearVersionMax, 06_tensor_parallel/linear.h), default kLinearVersionDefault. A usage error names the range.
int linear_version_from(const Flags& flags);
// The "engine options" paragraph of `nanovllm help`, its version ranges read from the code that checks them.
std::string engine_options_help();

// --device cpu|cuda, or "" where left out (the GPU where there is one: device_or_default,
// 04_model_runner/backend.h). Any other value is a usage error.
std::string device_from(const Flags& flags);
// --block-size N: a multiple of 16 from 16 to 65,536 tokens, `fallback` where left out. A usage error names
// the flag (EngineConfig::validate would catch it too, but only once the model is loaded, and as a data error).
int block_size_from(const Flags& flags, int fallback);

// --collectives spin|events: how GPU tensor-parallel ranks wait for each other (EngineConfig::collectives);
// default spin. Any other value is a usage error.
std::string collectives_from(const Flags& flags);

// After the engine is built: where the model runner cut --max-model-len to the model's positions (as nano-vllm's
// Config does), a note says so. `engine_max_model_len` is the runner's; a command may have set its own length
// (logits one more than the flag, bench 4096 where the flag is left out), so only the flag's value is compared.
void note_a_cut_max_model_len(const Flags& flags, int engine_max_model_len);

// The subcommands, one file each in 01_sequence/cli/; main() dispatches.
int cmd_generate(const Flags& flags);         // generate.cpp
int cmd_logits(const Flags& flags);           // generate.cpp
int cmd_bench(const Flags& flags);            // bench.cpp
int cmd_bench_step(const Flags& flags);       // bench.cpp
int cmd_tokenize(const Flags& flags);         // text.cpp
int cmd_detokenize(const Flags& flags);       // text.cpp
int cmd_chat_template(const Flags& flags);    // text.cpp
int cmd_bench_tokenizer(const Flags& flags);  // text.cpp
int cmd_hash_blocks(const Flags& flags);      // hash_blocks.cpp
int cmd_random_model(const Flags& flags);     // random_model.cpp

}  // namespace nanovllm
