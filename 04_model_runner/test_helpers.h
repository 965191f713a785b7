// test_helpers.h: small helpers shared by chapter 04's tests (a scratch directory, file bytes, the
// message of an expected Error). Header-only, so it is not part of the chapter's library.
#pragma once

#include <ftw.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "01_sequence/common.h"

namespace nanovllm::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/nanovllm-ch04-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (!mkdtemp(buffer.data())) std::abort();
    path_ = buffer.data();
  }
  ~TempDir() {
    // Depth first (FTW_DEPTH), not following symbolic links (FTW_PHYS).
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return std::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline void write_string(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The message of the nanovllm::Error that `f` throws, or "(no error)". Any other exception propagates
// and fails the test.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A golden tiny checkpoint, "tiny-qwen3-a" or "tiny-qwen3-b": relative to the repository root when the
// tests run from there (as `make test` does), else found from the binary's folder (build/..).
inline std::string golden_dir(const std::string& name) {
  std::string relative = "tests/data/golden/" + name;
  if (access((relative + "/config.json").c_str(), R_OK) == 0) return relative;
  return data_dir() + "/../../" + relative;
}

}  // namespace nanovllm::testing
