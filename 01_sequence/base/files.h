// files.h: the file helpers every chapter shares: read a whole file, write one atomically, ask what a
// path is. Errors name the path: "PATH: cannot read: No such file or directory".
#pragma once

#include <cstdio>
#include <string>

namespace nanovllm {

// How large a file read whole may be, and what to call such a file in the error. A file past its limit is
// the wrong file, named here rather than as "out of memory" once it has filled the memory. Prompt files
// (bench-tokenizer --file) may take 1 GiB. A parsed JSON value takes up to ~65 times its text in memory
// (each 2-byte "0," of an array becomes a 128-byte Json), so JSON files get less: Qwen3's tokenizer.json,
// the largest, is 11 MB, and its config files and a sharded checkpoint's index take kilobytes.
struct FileLimit {
  long long bytes;
  const char* kind;  // "PATH: cannot read: N bytes, more than the 16 MiB <kind> may hold"
};
constexpr FileLimit kAnyFile{1LL << 30, "a file read whole"};
constexpr FileLimit kConfigFile{16LL << 20, "a config file"};         // config.json and the other small JSON files
constexpr FileLimit kTokenizerFile{64LL << 20, "a tokenizer file"};  // tokenizer.json

// The whole file as bytes. Throws Error "PATH: cannot read: <reason>", also for a directory, a FIFO or a
// device (only a regular file is read), and for a file past `limit`.
std::string read_file(const std::string& path, FileLimit limit = kAnyFile);

// `path` opened for reading, if it is a regular file; its size in `*size` when asked. Throws Error "PATH: cannot
// read: <reason>" ("it is a directory", "not a regular file", or the system's reason) without ever waiting:
// a FIFO at the path is refused, not opened.
FILE* open_regular_file(const std::string& path, long long* size = nullptr);

// Writes `text` to PATH.tmp.<pid>, then renames it over `path`: a reader never sees half a file.
void write_file(const std::string& path, const std::string& text);

bool is_regular_file(const std::string& path);
bool is_directory(const std::string& path);

// For a file that may be absent (generation_config.json, a sharded checkpoint's index, ...): false when
// nothing is at `path`, true when a regular file is (through symbolic links). Anything else there is a
// mistake to name rather than to read as "absent": Error "PATH: cannot read: it is a directory" (or "not a
// regular file", or "a symbolic link that leads to no file").
bool optional_file_exists(const std::string& path);

// Creates the folder `path` and every missing folder above it (mkdir -p); one that another process creates
// meanwhile is as good. Throws Error "FOLDER: cannot create the directory: <reason>" naming the first
// folder that could not be made.
void make_directories(const std::string& path);

// A file written under a temporary name in the same folder and renamed into place by commit(); if it is
// destroyed uncommitted (an error, an exception), the temporary file is removed.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);  // Error "PATH: write failed: <reason>"
  void commit();

 private:
  std::string path_, temp_;
  FILE* file_ = nullptr;
  bool committed_ = false;
};

}  // namespace nanovllm
