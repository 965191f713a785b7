// files.cpp: reading, atomic writing, and stat() questions.
#include "01_sequence/base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "01_sequence/base/common.h"

namespace nanovllm {

std::string read_file(const std::string& path, FileLimit limit) {
  if (is_directory(path)) fail(path, ": cannot read: it is a directory");
  // A FIFO would block the open until a writer came, a device such as /dev/zero never end: only a regular
  // file is read (a path that does not exist falls through to fopen's own error).
  const auto too_large = [&](long long bytes) {
    const bool gib = limit.bytes % (1LL << 30) == 0;
    fail(path, ": cannot read: ", bytes, " bytes, more than the ", limit.bytes >> (gib ? 30 : 20), gib ? " GiB " : " MiB ",
         limit.kind, " may hold");
  };
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) fail(path, ": cannot read: not a regular file");
    if (st.st_size > limit.bytes) too_large(st.st_size);
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, ": cannot read: ", std::strerror(errno));
  std::string text;
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (text.size() + n > size_t(limit.bytes)) {  // a file that grew while it was read
      std::fclose(f);
      too_large((long long)(text.size() + n));
    }
    text.append(chunk, n);
  }
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) fail(path, ": read failed");
  return text;
}

void write_file(const std::string& path, const std::string& text) {
  AtomicFileWriter out(path);
  out.write(text.data(), text.size());
  out.commit();
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool optional_file_exists(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return false;
    fail(path, ": cannot read: ", std::strerror(errno));
  }
  if (stat(path.c_str(), &st) != 0) fail(path, ": cannot read: a symbolic link that leads to no file (", std::strerror(errno), ")");
  if (S_ISDIR(st.st_mode)) fail(path, ": cannot read: it is a directory");
  if (!S_ISREG(st.st_mode)) fail(path, ": cannot read: not a regular file");
  return true;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_directories(const std::string& path) {
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string folder = path.substr(0, end);  // "a", "a/b", ... and last the whole path
    if (!folder.empty() && !is_directory(folder) && mkdir(folder.c_str(), 0755) != 0) {
      const int error = errno;
      if (!(error == EEXIST && is_directory(folder))) fail(folder, ": cannot create the directory: ", std::strerror(error));
    }
    if (end == std::string::npos) return;
  }
}

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), temp_(path + ".tmp." + std::to_string(getpid())) {
  file_ = std::fopen(temp_.c_str(), "wb");
  if (!file_) fail(path_, ": cannot write: ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_) std::fclose(file_);
  if (!committed_) std::remove(temp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, file_) != n) fail(path_, ": write failed: ", std::strerror(errno));
}

void AtomicFileWriter::commit() {
  FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) fail(path_, ": write failed: ", std::strerror(errno));
  if (std::rename(temp_.c_str(), path_.c_str()) != 0)
    fail(path_, ": cannot rename the temporary file: ", std::strerror(errno));
  committed_ = true;
}

}  // namespace nanovllm
