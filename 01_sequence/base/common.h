// common.h: the few helpers every chapter shares.
//
//   Error           the one exception type for anything a user can get wrong (a file, a flag, a request)
//   fail(...)       throw an Error whose message is the arguments streamed together
//   ceil_div(a, b)  rounded-up integer division (blocks needed for n tokens)
//   counted(n, w)   "1 token", "2 tokens": a count and its word, in messages
//   data_dir()      build/data, where `make` unpacks the shipped tokenizer
//
// Beside it in base/: json.h, files.h, log.h, utf8.h, bf16.h, cuda_utils.h, ptx.cuh. They live in chapter 01
// because every chapter builds on them; they hold no engine logic.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace nanovllm {

// Thrown for bad input. The command line prints "error: " + what() as one line and exits 1, so a message
// names the file, field or value at fault and needs no "error:" prefix of its own.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream message;
  (message << ... << args);
  // what() is a C string: a NUL quoted from a file (JSON's "\u0000") would end the message there.
  std::string text = message.str();
  for (size_t at = text.find('\0'); at != std::string::npos; at = text.find('\0', at)) text.replace(at, 1, "\\x00");
  throw Error(text);
}

// The folder of data files that `make` prepares beside the binaries: <folder of this executable>/data, so
// build/data for build/nanovllm and for the test binaries, or $NANOVLLM_DATA_DIR when set. The tokenizer
// is at data_dir() + "/qwen3-tokenizer"; the command line writes its random checkpoints there too.
std::string data_dir();

template <class T>
constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// n and `word`, plural unless n is 1: counted(1, "token") is "1 token", counted(0, "seq") "0 seqs".
inline std::string counted(long long n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

}  // namespace nanovllm
