// main.cpp: build/nanovllm, the command line. It only dispatches: each subcommand lives beside the
// chapter it shows (hash-blocks in 03, tokenize in 01, ...).
//
// Exit codes: 0 success, 1 failure (bad file, bad request), 2 usage error. Errors are one stderr line
// "error: ...".
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "01_sequence/cli.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const nanovllm::Flags&);
  std::vector<std::string> value_flags;
  std::vector<std::string> switches;
  const char* usage;
};

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"hash-blocks", nanovllm::cmd_hash_blocks, {"block-size"}, {},
       "hash-blocks [--block-size N]   stdin: JSON Lines of token-id arrays -> the chained xxh64 of each "
       "full block"},
      {"tokenize", nanovllm::cmd_tokenize, {"tokenizer"}, {},
       "tokenize [--tokenizer DIR]   stdin: JSON Lines of strings -> one JSON array of token ids per line"},
      {"detokenize", nanovllm::cmd_detokenize, {"tokenizer"}, {},
       "detokenize [--tokenizer DIR]   stdin: JSON Lines of token-id arrays -> one JSON string per line"},
      {"chat-template", nanovllm::cmd_chat_template, {"tokenizer"}, {},
       "chat-template [--tokenizer DIR]   stdin: JSON Lines {\"messages\":[...],\"add_generation_prompt\":"
       "bool,\"enable_thinking\":bool} -> the rendered prompt, one JSON string per line"},
      {"bench-tokenizer", nanovllm::cmd_bench_tokenizer, {"tokenizer", "file"}, {},
       "bench-tokenizer [--tokenizer DIR] --file FILE...   encode throughput (MB/s) over the files"},
  };
  return table;
}

void print_usage(FILE* out) {
  std::fprintf(out, "usage: nanovllm COMMAND [flags]\n\ncommands:\n");
  for (const Command& c : commands()) std::fprintf(out, "  %s\n", c.usage);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : commands()) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      nanovllm::Flags flags(argc - 2, argv + 2, c.value_flags, c.switches);
      return c.run(flags);
    } catch (const nanovllm::UsageError& e) {
      std::fprintf(stderr, "error: %s (usage: nanovllm %s)\n", e.what(), c.usage);
      return 2;
    } catch (const nanovllm::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "error: out of memory\n");
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: internal error: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "error: unknown command '%s' (try: nanovllm help)\n", argv[1]);
  return 2;
}
