// files.cpp: reading, atomic writing, and stat() questions.
#include "01_sequence/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "01_sequence/base/common.h"

namespace nanovllm {

FILE* open_regular_file(const std::string& path, long long* size) {
  // O_NONBLOCK: open() itself would wait for a writer on a FIFO, even one swapped in after a stat() of the
  // path; checked on the descriptor, not the name, so nothing can change between the check and the read.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot read: ", errno == EISDIR ? "it is a directory" : std::strerror(errno));
  struct stat st = {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool directory = S_ISDIR(st.st_mode);
    close(fd);
    fail(path, ": cannot read: ", directory ? "it is a directory" : "not a regular file");
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // reads of a regular file never block anyway
  FILE* file = fdopen(fd, "rb");
  if (!file) {
    const int error = errno;
    close(fd);
    fail(path, ": cannot read: ", std::strerror(error));
  }
  if (size) *size = st.st_size;
  return file;
}

std::string read_file(const std::string& path, FileLimit limit) {
  // Only a regular file is read: a FIFO would wait for a writer, a device such as /dev/zero never end.
  const auto too_large = [&](long long bytes) {
    const bool gib = limit.bytes % (1LL << 30) == 0;
    fail(path, ": cannot read: ", bytes, " bytes, more than the ", limit.bytes >> (gib ? 30 : 20), gib ? " GiB " : " MiB ",
         limit.kind, " may hold");
  };
  long long size = 0;
  FILE* f = open_regular_file(path, &size);
  if (size > limit.bytes) {
    std::fclose(f);
    too_large(size);
  }
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
