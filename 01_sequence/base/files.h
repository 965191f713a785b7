// files.h: the file helpers every chapter shares: read a whole file, write one atomically, ask what a
// path is. Errors name the path: "PATH: cannot read: No such file or directory".
#pragma once

#include <cstdio>
#include <string>

namespace nanovllm {

// The whole file as bytes. Throws Error "PATH: cannot read: <reason>", also for a directory, a FIFO or a
// device (only a regular file is read), and for a file past kMaxReadFileBytes: the files read whole are
// configs, tokenizers and prompts (Qwen3's tokenizer.json, the largest, is 11 MB), so a bigger one is the
// wrong file, named here rather than as "out of memory" once it has filled the memory.
constexpr long long kMaxReadFileBytes = 1LL << 30;
std::string read_file(const std::string& path);

// Writes `text` to PATH.tmp.<pid>, then renames it over `path`: a reader never sees half a file.
void write_file(const std::string& path, const std::string& text);

bool is_regular_file(const std::string& path);
bool is_directory(const std::string& path);

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
