// test_util.h: small helpers shared by the test files: test data paths, files, a scratch folder, the
// message of an expected Error, a fixed-seed generator, many comparisons reported as one assertion, and
// running build/nanovllm.
#pragma once

#include <ftw.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <dirent.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "01_sequence/base/json.h"

namespace nanovllm::test {

// The book's chapter folders in reading order, as the README lists them: the tests that walk the book
// (book_docs_test, book_layout_test) take them from here, so a new chapter is named once.
inline const std::vector<std::string> kChapters = {"01_sequence",     "02_scheduler", "03_block_manager",
                                                   "04_model_runner", "05_attention", "06_tensor_parallel",
                                                   "07_sampler"};

// Path of a file under tests/data/ in the source tree.
inline std::string data_path(const std::string& relative) {
  return std::string(NANOVLLM_SOURCE_DIR) + "/tests/data/" + relative;
}

inline Json read_json(const std::string& path) { return Json::parse(read_file(path), path); }

// The names in a folder, "." and ".." left out (none where the folder cannot be opened).
inline std::set<std::string> folder_entries(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.insert(e->d_name);
    closedir(d);
  }
  return names;
}

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

// A golden tiny checkpoint, "tiny-qwen3-a" or "tiny-qwen3-b", in the source tree.
inline std::string golden_dir(const std::string& name) { return data_path("golden/" + name); }

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/nanovllm-test-XXXXXX";
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

// The message of the Error that f() throws, or "" if it throws none. Any other exception propagates and
// fails the test.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A fixed-seed generator of our own (splitmix64): the same test data with any standard library.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi), 24 random bits.
  float uniform(float lo = -1, float hi = 1) { return lo + (hi - lo) * float(next() >> 40) * (1.0f / 16777216.0f); }
  int below(int n) { return int(next() % uint64_t(n)); }
};

inline std::vector<float> random_vector(size_t n, Rng& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform();
  return v;
}

// Many comparisons (every element, or every row, of a kernel's output against a reference), reported
// as one assertion. A wrong change in a kernel makes most of its outputs wrong at once; one EXPECT per
// element would print thousands of failures and bury the one line that says what is wrong. This keeps
// the count, the worst check and the first few, in the order they were made:
//
//   MismatchSummary rows("query rows");
//   for (int i = 0; i < n; i++) rows.check(row_error(i), 1e-5, [&] { return "row " + std::to_string(i); });
//   EXPECT_TRUE(rows.result());
//     -> 240 of 240 query rows over the limit 1e-05; worst: row 17 (1.03)
//        first: row 0 (1.02791); row 1 (0.884355); row 2 (0.969276); row 3 (0.907373); row 4 (0.93)
class MismatchSummary {
 public:
  explicit MismatchSummary(std::string what, int first_shown = 5) : what_(std::move(what)), shown_(first_shown) {}

  // Passes when error <= limit; a NaN error fails. `where()` (a string) is called only for failures.
  template <class Where>
  bool check(double error, double limit, Where where) {
    checks_++;
    if (error <= limit) return true;
    limit_ = limit;
    const std::string line = where() + " (" + format(error) + ")";
    if (failures_++ < shown_) first_ += (first_.empty() ? "" : "; ") + line;
    if (failures_ == 1 || std::isnan(error) || (!std::isnan(worst_error_) && error > worst_error_)) {
      worst_error_ = error;
      worst_ = line;
    }
    return false;
  }

  ::testing::AssertionResult result() const {
    if (failures_ == 0) return ::testing::AssertionSuccess() << checks_ << " " << what_ << " within the limit";
    return ::testing::AssertionFailure() << failures_ << " of " << checks_ << " " << what_ << " over the limit "
                                         << format(limit_) << "; worst: " << worst_ << "\n  first: " << first_;
  }
  int failures() const { return failures_; }

 private:
  static std::string format(double x) {
    std::ostringstream s;
    s.precision(6);
    s << x;
    return s.str();
  }
  std::string what_, first_, worst_;
  int shown_, checks_ = 0, failures_ = 0;
  double limit_ = 0, worst_error_ = 0;
};

// |got[i] - want[i]| <= tol for i in [0, n), as one assertion (MismatchSummary): each failure is shown
// as "<where(i)>: got G, want W".
template <class Got, class Want, class Where>
::testing::AssertionResult all_near(const Got* got, const Want* want, size_t n, double tol, Where where,
                                    const std::string& what = "values") {
  MismatchSummary summary(what);
  for (size_t i = 0; i < n; i++) {
    const double g = double(got[i]), w = double(want[i]);
    summary.check(std::abs(g - w), tol, [&] {
      std::ostringstream s;
      s.precision(8);
      s << where(i) << ": got " << g << ", want " << w;
      return s.str();
    });
  }
  return summary.result();
}

}  // namespace nanovllm::test

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

namespace nanovllm::test {

// build/nanovllm, beside the running test binary.
inline std::string nanovllm_binary() { return data_dir() + "/../nanovllm"; }

struct CommandResult {
  int exit_code;
  std::string out, err;
};

// Runs `build/nanovllm <args>` through the shell with `input` on stdin; captures stdout and stderr.
// `args` is pasted into a shell command line: quote what needs quoting.
inline CommandResult run_nanovllm(const std::string& args, const std::string& input = "") {
  char dir_template[] = "/tmp/nanovllm-test-XXXXXX";
  std::string dir = mkdtemp(dir_template);
  {
    std::ofstream in(dir + "/in");
    in << input;
  }
  std::string command = nanovllm_binary() + " " + args + " <" + dir + "/in >" + dir + "/out 2>" + dir + "/err";
  int status = std::system(command.c_str());
  CommandResult result{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
                       read_file(dir + "/out"), read_file(dir + "/err")};
  std::system(("rm -rf " + dir).c_str());
  return result;
}

// For a run that failed after it started (its first lines say where it runs): the last line of `err`
// when it is the only line starting "error: ", else "".
inline std::string last_error_line(const std::string& err) {
  const size_t start = err.rfind('\n', err.size() >= 2 ? err.size() - 2 : 0);
  const std::string last = start == std::string::npos ? err : err.substr(start + 1);
  const bool only = err.find("error: ") == err.size() - last.size();
  return last.rfind("error: ", 0) == 0 && only ? last : "";
}

// True when `err` is exactly one line starting "error: " (the command line's error contract).
inline bool is_one_error_line(const std::string& err) {
  return err.rfind("error: ", 0) == 0 && err.find('\n') == err.size() - 1;
}

}  // namespace nanovllm::test
