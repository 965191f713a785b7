// text.cpp: the text subcommands: tokenize, detokenize, chat-template, bench-tokenizer (what nano-vllm
// gets from Hugging Face's AutoTokenizer).
//
//   nanovllm tokenize      [--tokenizer DIR]  stdin: JSON Lines of strings  -> one JSON array of ids per line
//   nanovllm detokenize    [--tokenizer DIR]  stdin: JSON Lines of id arrays -> one JSON string per line
//   nanovllm chat-template [--tokenizer DIR]  stdin: JSON Lines of {"messages": [...], ...}
//                                             -> one JSON string (the rendered prompt) per line
//   nanovllm bench-tokenizer [--tokenizer DIR] --file FILE...   encode throughput in MB/s
//
//   $ echo '"Hello, world!"' | nanovllm tokenize
//   [9707,11,1879,0]
//
// DIR defaults to build/data/qwen3-tokenizer. A blank line gives a blank line, so that output lines stay
// aligned with input lines; any bad line stops the command with "error: stdin line N: ..." and exit code 1. Each output line is flushed at once, so another
// program can talk to these commands line by line through a pipe.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "01_sequence/tokenizer/chat_template.h"
#include "01_sequence/cli/flags.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"
#include "01_sequence/tokenizer/tokenizer.h"
#include "01_sequence/base/utf8.h"

namespace nanovllm {

namespace {

Tokenizer load_tokenizer(const Flags& flags) {
  return Tokenizer::load(flags.get("tokenizer", data_dir() + "/qwen3-tokenizer"));
}

// Runs `handle` on every non-blank line of `lines`, as a parsed JSON value, and prints what it returns (a
// blank line for a blank line). Errors from the handler are prefixed with "stdin line N: ". The commands
// open stdin first, before anything else takes a file descriptor: with stdin closed, the next file opened
// would become descriptor 0 and be read as the input.
template <class Handler>
int for_each_json_line(LineReader& lines, Handler handle) {
  std::string line;
  while (lines.next(line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      write_stdout("\n");
      flush_stdout();
      continue;
    }
    std::string source = "stdin line " + std::to_string(lines.line_number());
    Json value = Json::parse_line(line, source);  // its errors already start with the source
    std::string out;
    try {
      out = handle(value);
    } catch (const Error& e) {
      fail(source, ": ", e.what());
    }
    out += '\n';
    write_stdout(out);
    flush_stdout();  // at once: a failed write stops the command
  }
  return 0;
}

}  // namespace

int cmd_tokenize(const Flags& flags) {
  LineReader lines;
  Tokenizer tokenizer = load_tokenizer(flags);
  return for_each_json_line(lines, [&](const Json& value) {
    if (!value.is_string()) fail("expected a JSON string, got ", Json::type_name(value.type()));
    std::string out = "[";
    for (int32_t id : tokenizer.encode(value.as_string())) {
      if (out.size() > 1) out += ',';
      out += std::to_string(id);
    }
    return out + "]";
  });
}

int cmd_detokenize(const Flags& flags) {
  LineReader lines;
  Tokenizer tokenizer = load_tokenizer(flags);
  return for_each_json_line(lines, [&](const Json& value) {
    if (!value.is_array()) fail("expected a JSON array of token ids, got ", Json::type_name(value.type()));
    std::vector<int32_t> ids;
    for (const Json& id : value.as_array()) {
      if (!id.is_integer()) fail("token ids must be integers, got ", id.dump());
      if (id.as_int64() < 0 || id.as_int64() >= tokenizer.vocab_size())
        fail("unknown token id ", id.as_int64(), " (the vocabulary has ids 0..", tokenizer.vocab_size() - 1, ")");
      ids.push_back(int32_t(id.as_int64()));
    }
    std::string out;
    json_append_quoted(out, tokenizer.decode(ids));
    return out;
  });
}

int cmd_chat_template(const Flags& flags) {
  // The template is Qwen3's, written in chat_template.cpp; the tokenizer is loaded only to check that
  // DIR holds a tokenizer, and its template checked to be Qwen's layout, both before reading stdin.
  LineReader lines;
  load_tokenizer(flags);
  check_chat_template(flags.get("tokenizer", data_dir() + "/qwen3-tokenizer"));
  return for_each_json_line(lines, [&](const Json& value) {
    ChatRequest request = parse_chat_request(value);
    std::string out;
    json_append_quoted(out, apply_chat_template(request.messages, request.add_generation_prompt,
                                                request.enable_thinking));
    return out;
  });
}

// Encode throughput over the concatenation of the files, repeated until at least 20 MB have been
// encoded, on one thread. The first pass fills the word cache; the figure is over all passes, and the
// first pass is also printed on its own.
int cmd_bench_tokenizer(const Flags& flags) {
  const auto& files = flags.get_all("file");
  if (files.empty()) throw UsageError("give at least one --file FILE to encode");
  Tokenizer tokenizer = load_tokenizer(flags);
  std::string text;
  for (const std::string& path : files) {
    const std::string file = read_file(path);
    check_utf8(file, path);  // here, so that the error names the file and the offset in it (encode sees them joined)
    text += file;
  }
  if (text.empty()) fail("the files are empty");

  using Clock = std::chrono::steady_clock;
  const double megabytes = double(text.size()) / 1e6;
  const size_t goal = 20000000;  // ceil(goal / bytes) passes, in whole numbers: a file a hair under 4 MB takes 6
  const int passes = int((goal + text.size() - 1) / text.size());
  size_t tokens = 0;
  double first_pass_s = 0;
  Clock::time_point start = Clock::now();
  for (int pass = 0; pass < passes; pass++) {
    tokens += tokenizer.encode(text).size();
    if (pass == 0) first_pass_s = std::chrono::duration<double>(Clock::now() - start).count();
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("encoded %.2f MB (%s) x %d passes = %.1f MB, %zu tokens, in %.3f s\n", megabytes,
              counted(int64_t(files.size()), "file").c_str(), passes, megabytes * passes, tokens, seconds);
  std::printf("throughput: %.2f MB/s, %.2f M tokens/s (first pass, cold word cache: %.2f MB/s)\n",
              megabytes * passes / seconds, double(tokens) / seconds / 1e6, megabytes / first_pass_s);
  return 0;
}

}  // namespace nanovllm
