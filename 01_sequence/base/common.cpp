// common.cpp: data_dir(), the one non-inline helper of common.h.
#include "01_sequence/base/common.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>

namespace nanovllm {

std::string data_dir() {
  if (const char* dir = std::getenv("NANOVLLM_DATA_DIR"); dir && *dir) return dir;  // README, "Command line"
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "build/data";  // no /proc: assume the working directory is the repository root
  std::string exe(path, size_t(n));
  return exe.substr(0, exe.rfind('/')) + "/data";
}

}  // namespace nanovllm
