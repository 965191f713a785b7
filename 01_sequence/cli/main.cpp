// main.cpp: build/nanovllm, the command line. It only dispatches to the subcommands, one file each in
// 01_sequence/cli/.
//
// Exit codes: 0 success, 1 failure (bad file, bad request), 2 usage error. Errors are one stderr line
// "error: ...".
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "01_sequence/cli/flags.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const nanovllm::Flags&);
  std::vector<std::string> value_flags;
  std::vector<std::string> switches;
  const char* usage;
  const char* details = nullptr;  // a paragraph `COMMAND --help` prints after the usage line
};

// Flags every engine command takes (the "engine options" of README.md).
const std::vector<std::string> kEngineFlags = {"model", "device", "max-num-seqs", "max-num-batched-tokens",
                                               "max-model-len", "gpu-memory-utilization", "block-size",
                                               "kv-cache-blocks", "tensor-parallel-size", "seed", "tokenizer",
                                               "cpu-memory-mib", "attention-version", "linear-version", "collectives"};
const std::vector<std::string> kEngineSwitches = {"enforce-eager", "trace", "no-overlap"};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"generate", nanovllm::cmd_generate,
       plus(kEngineFlags, {"prompt", "prompt-ids", "requests", "max-tokens", "temperature", "top-k", "top-p"}),
       plus(kEngineSwitches, {"chat", "no-thinking", "ignore-eos", "json"}),
       "generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3 | --requests FILE)... [--chat [--no-thinking]] "
       "[--max-tokens N] "
       "[--temperature T] [--top-k K] [--top-p P] [--seed S] [--ignore-eos] [--json] [engine options]",
       "--requests FILE (\"-\" reads stdin): JSON Lines, one request a line with sampling of its own (nano-vllm's\n"
       "generate(prompts, sampling_params) with one SamplingParams a prompt). Its prompt is one of\n"
       "  {\"prompt\": \"text\"}   {\"prompt_token_ids\": [1, 2, 3]}\n"
       "  {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}], \"enable_thinking\": false}   (Qwen3's chat template)\n"
       "and any of \"max_tokens\", \"temperature\", \"top_k\", \"top_p\", \"ignore_eos\" and \"seed\" (its own random\n"
       "numbers) override the flags for that request. Requests run in command-line order, file lines in their order.\n"
       "--no-thinking: prompts rendered by the chat template get its empty thought (enable_thinking false): Qwen3\n"
       "answers without reasoning.\n"
       "Sampling, as nano-vllm's SamplingParams: --max-tokens 64, --temperature 1.0 (0: greedy), --top-k 0 and\n"
       "--top-p 1.0 (both off) unless given. --seed S is the engine's: a request's random numbers derive from it and\n"
       "the request's position, so a seeded run gives the same tokens however it is batched.\n"},
      {"bench", nanovllm::cmd_bench,
       {"model", "random", "device", "num-seqs", "max-input-len", "max-output-len", "max-model-len", "max-num-seqs",
        "max-num-batched-tokens", "gpu-memory-utilization", "cpu-memory-mib", "block-size", "kv-cache-blocks", "seed",
        "tensor-parallel-size", "attention-version", "linear-version", "collectives"},
       {"enforce-eager", "trace", "profile", "no-overlap"},
       "bench (--model DIR | --random PRESET) [--device cuda] [--num-seqs 256] [--max-input-len 1024] "
       "[--max-output-len 1024] [--profile] [more: --help]   nano-vllm's bench.py workload",
       "--random PRESET: random weights of a real model's shape (tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b),\n"
       "written to the data folder (build/data, or $NANOVLLM_DATA_DIR) as random-PRESET on first use. --profile: every\n"
       "operation timed one by one, without CUDA graphs, and a table of their kernel time over the run.\n"},
      {"bench-step", nanovllm::cmd_bench_step,
       {"model", "random", "device", "batch", "context", "iters", "block-size", "gpu-memory-utilization",
        "cpu-memory-mib", "attention-version", "linear-version", "tensor-parallel-size", "collectives"},
       {},
       "bench-step (--model DIR | --random PRESET) [--batch 256] [--context 1000] [--iters 20] [more: --help]   "
       "one decode step, kernel by kernel, with GB/s"},
      {"logits", nanovllm::cmd_logits, plus(kEngineFlags, {"prompt-ids"}), kEngineSwitches,
       "logits --model DIR [--device cpu|cuda] --prompt-ids 1,2,3   -> the vocabulary logits after the last token"},
      {"hash-blocks", nanovllm::cmd_hash_blocks, {"block-size"}, {},
       "hash-blocks [--block-size N]   stdin: JSON Lines of token-id arrays -> the chained xxh64 of each "
       "full block"},
      {"random-model", nanovllm::cmd_random_model, {"preset", "out", "seed", "tokenizer"}, {"force"},
       "random-model --preset PRESET --out DIR [--seed S] [--tokenizer DIR] [--force]   a checkpoint with random "
       "bf16 weights shaped like a real Qwen3 (--force: overwrite a folder that is not empty)"},
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
  std::fprintf(out, "\n%s", nanovllm::engine_options_help().c_str());
}

}  // namespace

// Tensor-parallel ranks that share a GPU wait for each other inside spinning kernels (06_tensor_parallel/
// all_reduce.h). CUDA's lazy loading of a kernel on its first launch may wait for the whole GPU, the
// spinning peer included: a deadlock. So with more than one rank every kernel is loaded up front, before
// the first CUDA call reads this setting.
static void load_kernels_eagerly_for_tensor_parallelism(int argc, char** argv) {
  for (int i = 2; i < argc; i++) {
    const std::string arg = argv[i];
    std::string value;
    if (arg == "--tensor-parallel-size" && i + 1 < argc) value = argv[i + 1];
    if (arg.rfind("--tensor-parallel-size=", 0) == 0) value = arg.substr(23);
    if (!value.empty() && value != "1") setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  }
}

// An error message as one line of UTF-8: a name or value quoted from a file or the command line may hold a
// newline or another control character, which would start a second line without "error: ". Each is written
// as an escape: \n, \r, \t by name, the other C0 controls and DEL as \xHH, the C1 controls (U+0080-U+009F:
// U+0085 is a line break) and the line and paragraph separators (U+2028, U+2029) as \uHHHH, and a byte that
// is not part of valid UTF-8 as \xHH. Every other character is written as it is. A value quoted whole may also
// be megabytes long (a 100,000-digit token id): past kMaxErrorBytes the line ends with how much was left out.
static std::string one_line(const char* message) {
  constexpr size_t kMaxErrorBytes = 2000;
  size_t length = std::strlen(message), shown = length;
  if (length > kMaxErrorBytes) {
    shown = kMaxErrorBytes;
    while (shown > 0 && (static_cast<unsigned char>(message[shown]) & 0xC0) == 0x80) shown--;  // a whole character
  }
  const unsigned char* text = reinterpret_cast<const unsigned char*>(message);
  auto escape = [](const char* format, unsigned value) {
    char buffer[8];
    std::snprintf(buffer, sizeof buffer, format, value);
    return std::string(buffer);
  };
  std::string line;
  for (size_t i = 0; i < shown;) {
    const unsigned char c = text[i];
    if (c < 0x80) {
      if (c == '\n') line += "\\n";
      else if (c == '\r') line += "\\r";
      else if (c == '\t') line += "\\t";
      else if (c < 0x20 || c == 0x7f) line += escape("\\x%02x", c);
      else line += char(c);
      i++;
      continue;
    }
    // A multi-byte character: its length from the lead byte, then the code point; anything that is not
    // the shortest form of a scalar value (a stray continuation byte, a sequence cut short, an overlong
    // form, a surrogate, past U+10FFFF) is shown byte by byte.
    const int bytes = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? (c <= 0xEF ? 3 : 0) : c >= 0xC2 ? 2 : 0;
    unsigned code = bytes == 2 ? c & 0x1F : bytes == 3 ? c & 0x0F : c & 0x07;
    bool valid = bytes > 0 && i + bytes <= shown;
    for (int k = 1; valid && k < bytes; k++) {
      valid = (text[i + k] & 0xC0) == 0x80;
      code = code << 6 | (text[i + k] & 0x3F);
    }
    valid = valid && !(bytes == 3 && (code < 0x800 || (code >= 0xD800 && code <= 0xDFFF))) &&
            !(bytes == 4 && (code < 0x10000 || code > 0x10FFFF));
    if (!valid) {
      line += escape("\\x%02x", c);
      i++;
    } else {
      if (code <= 0x9F || code == 0x2028 || code == 0x2029) line += escape("\\u%04x", code);
      else line.append(message + i, bytes);
      i += bytes;
    }
  }
  if (shown < length) line += " ... (" + std::to_string(length - shown) + " more bytes)";
  return line;
}

// `nanovllm COMMAND --help` (and `nanovllm help COMMAND`): the command's usage, and the engine options for
// the commands that take them all; a command that takes some (bench, bench-step) lists the flags it takes.
// Returns the exit code.
static int print_command_help(const Command& c) {
  std::printf("usage: nanovllm %s\n", c.usage);
  if (c.details) std::printf("\n%s", c.details);
  auto takes_all = [](const std::vector<std::string>& taken, const std::vector<std::string>& wanted) {
    return std::all_of(wanted.begin(), wanted.end(),
                       [&](const std::string& f) { return std::find(taken.begin(), taken.end(), f) != taken.end(); });
  };
  if (takes_all(c.value_flags, kEngineFlags) && takes_all(c.switches, kEngineSwitches)) {
    std::printf("\n%s", nanovllm::engine_options_help().c_str());
  } else if (c.value_flags.size() > 5) {
    std::string text = "\nflags:", line;
    std::vector<std::string> all = c.value_flags;
    all.insert(all.end(), c.switches.begin(), c.switches.end());
    for (const std::string& f : all) {
      if (line.size() + f.size() > 100) text += line + "\n      ", line.clear();
      line += " --" + f;
    }
    std::printf("%s%s\n(`nanovllm help` says what each engine option does)\n", text.c_str(), line.c_str());
  }
  if (std::fflush(stdout) == 0) return 0;
  std::fprintf(stderr, "error: cannot write to stdout: %s\n", std::strerror(errno));
  return 1;
}

int main(int argc, char** argv) {
  load_kernels_eagerly_for_tensor_parallelism(argc, argv);
  // A closed stdout would make every result vanish (and let the next file opened take descriptor 1):
  // refuse before doing any work.
  if (fcntl(STDOUT_FILENO, F_GETFD) == -1) {
    std::fprintf(stderr, "error: cannot write to stdout: %s\n", std::strerror(errno));
    return 1;
  }
  if (argc < 2) {
    std::fprintf(stderr, "error: no command given (try: nanovllm help)\n");
    return 2;
  }
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    // `help COMMAND` is `COMMAND --help`; a name that is no command is an error, not the general help.
    // `help help` (and `help --help`, `help -h`) asks about help itself: the general help.
    const bool about_help = argc == 3 && (!std::strcmp(argv[2], "help") || !std::strcmp(argv[2], "--help") ||
                                          !std::strcmp(argv[2], "-h"));
    if (argc == 3 && !about_help) {
      for (const Command& c : commands())
        if (!std::strcmp(argv[2], c.name)) return print_command_help(c);
      std::fprintf(stderr, "error: unknown command '%s' (try: nanovllm help)\n", one_line(argv[2]).c_str());
      return 2;
    }
    if (argc > 3) {
      std::fprintf(stderr, "error: help takes at most one command name\n");
      return 2;
    }
    print_usage(stdout);
    if (std::fflush(stdout) == 0) return 0;
    std::fprintf(stderr, "error: cannot write to stdout: %s\n", std::strerror(errno));
    return 1;
  }
  for (const Command& c : commands()) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    for (int i = 2; i < argc; i++) {
      // A value flag's value is not a request for help: `--prompt -h` asks about "-h".
      const std::string arg = argv[i];
      if (arg.rfind("--", 0) == 0 && arg.find('=') == std::string::npos &&
          std::find(c.value_flags.begin(), c.value_flags.end(), arg.substr(2)) != c.value_flags.end()) {
        i++;
        continue;
      }
      if (arg == "--help" || arg == "-h") return print_command_help(c);
    }
    try {
      nanovllm::Flags flags(argc - 2, argv + 2, c.value_flags, c.switches);
      const int code = c.run(flags);
      nanovllm::flush_stdout();  // a failed write is an error, even at the very end
      return code;
    } catch (const nanovllm::UsageError& e) {
      std::fprintf(stderr, "error: %s (usage: nanovllm %s)\n", one_line(e.what()).c_str(), c.usage);
      return 2;
    } catch (const nanovllm::Error& e) {
      std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "error: out of memory\n");
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: internal error: %s\n", one_line(e.what()).c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "error: unknown command '%s' (try: nanovllm help)\n", one_line(argv[1]).c_str());
  return 2;
}
