// flags.cpp: the flag parser behind every subcommand (nano-vllm has no command line: its users write
// Python, as example.py and bench.py do).
#include "01_sequence/cli/flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "01_sequence/base/files.h"
#include "01_sequence/base/log.h"
#include "05_attention/attention.h"
#include "06_tensor_parallel/linear.h"

namespace nanovllm {

Flags::Flags(int argc, char** argv, const std::vector<std::string>& value_flags,
             const std::vector<std::string>& switches) {
  auto contains = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  for (int i = 0; i < argc; i++) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
    // --name value, or --name=value.
    std::string name = arg.substr(2), value;
    const size_t equals = name.find('=');
    const bool inline_value = equals != std::string::npos;
    if (inline_value) value = name.substr(equals + 1), name = name.substr(0, equals);
    if (contains(switches, name)) {
      if (inline_value) throw UsageError("flag --" + name + " takes no value");
      values_[name].push_back("");
    } else if (contains(value_flags, name)) {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("flag " + arg + " needs a value");
        value = argv[++i];
        // "--max-tokens --prompt-ids 1" left out the number: the next flag is not the value (except as
        // --prompt's text, which may be anything). Said so here, not as "unexpected argument '1'" later.
        const std::string next_name = value.rfind("--", 0) == 0 ? value.substr(2, value.find('=') - 2) : "";
        if (name != "prompt" && (contains(value_flags, next_name) || contains(switches, next_name)))
          throw UsageError("flag --" + name + " needs a value, got the flag '" + value + "'");
      }
      // An empty value is a mistake (a variable that expanded to nothing), never "the default": every flag
      // but --prompt, whose empty text is a prompt, refuses it.
      if (value.empty() && name != "prompt") throw UsageError("flag --" + name + " needs a value, got ''");
      // A flag of one value given twice is a mistake too (which one was meant?): only the lists repeat.
      if (values_.count(name) && !contains(kRepeatableFlags, name))
        throw UsageError("flag --" + name + " given twice ('" + values_[name].back() + "' and '" + value + "')");
      values_[name].push_back(value);
      in_order_.emplace_back(name, value);
    } else {
      throw UsageError("unknown flag '--" + name + "'");
    }
  }
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

const std::vector<std::string>& Flags::get_all(const std::string& name) const {
  static const std::vector<std::string> kNone;
  auto it = values_.find(name);
  return it == values_.end() ? kNone : it->second;
}

int64_t Flags::get_int(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  if (!has(name)) return fallback;
  std::string text = get(name);
  int64_t value;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError("--" + name + " expects an integer, got '" + text + "'");
  if (value < lo || value > hi)
    throw UsageError("--" + name + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got " + text);
  return value;
}

double Flags::get_double(const std::string& name, double fallback, double lo, double hi, bool open_low) const {
  if (!has(name)) return fallback;
  std::string text = get(name);
  char* end = nullptr;
  // A decimal number, as get_int takes an integer: strtod alone would also take leading white space, hex
  // (0x1p-1) and "inf". An underflow (1e-320) is still a number, the tiny value strtod gives.
  const bool decimal = !text.empty() && text.find_first_not_of("0123456789+-.eE") == std::string::npos;
  double value = std::strtod(text.c_str(), &end);
  if (!decimal || end != text.c_str() + text.size() || !std::isfinite(value))
    throw UsageError("--" + name + " expects a number, got '" + text + "'");
  if (value < lo || (open_low && value == lo) || value > hi) {
    std::ostringstream message;
    message << "--" << name << " must be in " << (open_low ? "(" : "[") << lo << ", " << hi << "], got " << text;
    throw UsageError(message.str());
  }
  return value;
}

void write_stdout(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size())
    fail("cannot write to stdout: ", std::strerror(errno));
}

void flush_stdout() {
  errno = 0;
  std::cout.flush();
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout;
  if (failed) fail("cannot write to stdout: ", std::strerror(errno ? errno : EIO));
}

LineReader::LineReader() : file_(stdin), name_("stdin") {
  struct stat st;
  if (fstat(STDIN_FILENO, &st) != 0) fail("stdin: cannot read: ", std::strerror(errno));  // closed (<&-)
  if (S_ISDIR(st.st_mode)) fail("stdin: cannot read: it is a directory");
}

LineReader::LineReader(const std::string& path) : file_(open_regular_file(path)), name_(path) {}

LineReader::~LineReader() {
  if (file_ && file_ != stdin) std::fclose(file_);
}

bool LineReader::next(std::string& line) {
  if (!read_line(line)) return false;
  if (line_number_ == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
  return true;
}

bool LineReader::read_line(std::string& line) {
  line.clear();
  // One byte at a time through stdio's buffer (getc_unlocked: no lock per byte), so that a NUL byte stays
  // in the line for the JSON parser to name, and the length is checked as the line grows.
  for (int c; (c = getc_unlocked(file_)) != EOF;) {
    if (c == '\n') {
      line_number_++;
      return true;
    }
    if (line.size() == kMaxLineBytes) fail(name_, " line ", line_number_ + 1, ": longer than ", kMaxLineBytes >> 20, " MiB");
    line.push_back(char(c));
  }
  if (std::ferror(file_)) fail(name_, ": read failed: ", std::strerror(errno));
  if (line.empty()) return false;  // the end, after a final newline (or of an empty input)
  line_number_++;  // a last line without its newline
  return true;
}

uint64_t Flags::get_uint64(const std::string& name, uint64_t fallback) const {
  if (!has(name)) return fallback;
  std::string text = get(name);
  uint64_t value;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError("--" + name + " expects a non-negative integer, got '" + text + "'");
  return value;
}

int attention_version_from(const Flags& flags) {
  // 0 to the last version, as the help says; left out, the default (kAttentionVersionDefault: the fastest).
  return int(flags.get_int("attention-version", kAttentionVersionDefault, 0, int(attention_versions().size()) - 1));
}

std::string engine_options_help() {
  const std::string last_attention = std::to_string(attention_versions().size() - 1);
  const std::string linear_range = std::to_string(kLinearVersionMin) + "-" + std::to_string(kLinearVersionMax);
  return "engine options: --device cpu|cuda --tokenizer DIR (default: the model's folder) --max-num-seqs N\n"
         "                --max-num-batched-tokens N --max-model-len N\n"
         "                --gpu-memory-utilization F --cpu-memory-mib N --block-size N (multiple of 16) --kv-cache-blocks N\n"
         "                --enforce-eager --tensor-parallel-size N --attention-version N (0-" + last_attention +
         ": chapter 05's kernels;\n"
         "                default: each phase's fastest) --linear-version N (" + linear_range +
         ": chapter 06's projections on the\n"
         "                GPU, 1 cuBLAS only, 2 + our GEMV for one row, 3 + timed cuBLASLt, 4 + our split-K GEMM,\n"
         "                5 + our tensor-core GEMV for 2-8 rows, 6 = 5 + on sm_90 our wgmma GEMM where it measured\n"
         "                faster, gate_up's SiLU and the LM head's sampler in its ending (the row limits are in\n"
         "                06_tensor_parallel/linear.h), 7 = 6 + at one row the norms, SiLU and residual adds\n"
         "                inside the projections, 8 = 6 + from 17 rows o_proj's and down_proj's split-K sums\n"
         "                added by the norm after them (the default))\n"
         "                --seed S --trace --no-overlap (the plain loop: each step waits for the tokens of the one\n"
         "                before; by default step n + 1 is launched before step n's tokens are read, where it can)\n"
         "                --collectives spin|events (how GPU tensor-parallel ranks meet: spin, the default, one-shot\n"
         "                kernels that wait on flags; events, CUDA events and a host barrier, eager only, for\n"
         "                compute-sanitizer)\n"
         "flags take their value as `--flag value` or `--flag=value`; `nanovllm COMMAND --help` (or `nanovllm help\n"
         "COMMAND`) shows one command\n";
}

int linear_version_from(const Flags& flags) {
  return int(flags.get_int("linear-version", kLinearVersionDefault, kLinearVersionMin, kLinearVersionMax));
}

std::string device_from(const Flags& flags) {
  const std::string device = flags.get("device");
  if (!device.empty() && device != "cpu" && device != "cuda")
    throw UsageError("--device must be cpu or cuda, got '" + device + "'");
  return device;
}

int block_size_from(const Flags& flags, int fallback) {
  const int block_size = int(flags.get_int("block-size", fallback, 16, 1 << 16));
  if (block_size % 16 != 0) throw UsageError("--block-size must be a multiple of 16");
  return block_size;
}

std::string collectives_from(const Flags& flags) {
  const std::string value = flags.get("collectives", "spin");
  if (value != "spin" && value != "events") throw UsageError("--collectives must be spin or events, got '" + value + "'");
  return value;
}

void note_a_cut_max_model_len(const Flags& flags, int engine_max_model_len) {
  if (!flags.has("max-model-len")) return;
  const long long asked = flags.get_int("max-model-len", 0, 1, 1 << 24);
  if (asked > engine_max_model_len)
    log("note: --max-model-len %lld is more than the model's %d positions (max_position_embeddings): using %d", asked,
        engine_max_model_len, engine_max_model_len);
}

}  // namespace nanovllm
