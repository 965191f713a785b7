// The book's shape, checked from the sources: calls flow along the reading order (the chapter rules in
// README.md, and the Makefile's deps_NN lines).
//
//   01_sequence/base/            includes only base/ (errors, JSON, files, bf16, CUDA checks)
//   01_sequence/{sequence,sampling_params,engine_config}.h   the shared data types: base/ and each other
//   01_sequence/tokenizer/       base/ and itself
//   01_sequence/llm_engine.*     the entry: anything but the command line
//   01_sequence/cli/             anything
//   chapter NN (02-07)           base/, the shared types, itself, and later chapters it calls (listed in
//                                the Makefile's deps_NN): never the entry, the command line, the
//                                tokenizer, or an earlier chapter's logic
// Tests (*_test.cpp, *_test.cu, tests/) are exempt: they may reach anything.

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "01_sequence/base/files.h"
#include "tests/test_util.h"

namespace {

const std::string kRoot = NANOVLLM_SOURCE_DIR;

// Every source file under `dir` (relative to the repository root), tests (*_test.cpp, *_test.cu) left out.
void list_sources(const std::string& dir, std::vector<std::string>& out) {
  for (const std::string& name : nanovllm::test::folder_entries(kRoot + "/" + dir)) {
    const std::string path = dir + "/" + name;
    if (nanovllm::is_directory(kRoot + "/" + path)) {
      list_sources(path, out);
    } else if (std::regex_match(name, std::regex(R"(.*\.(h|cpp|cu|cuh))")) &&
               !std::regex_match(name, std::regex(R"(.*_test\.(cpp|cu))"))) {
      out.push_back(path);
    }
  }
}

// The part of the book a path belongs to: "base", "types", "tokenizer", "entry", "cli", "02" .. "07",
// or "" for anything else.
std::string zone_of(const std::string& path) {
  if (path.rfind("01_sequence/base/", 0) == 0) return "base";
  if (path.rfind("01_sequence/tokenizer/", 0) == 0) return "tokenizer";
  if (path.rfind("01_sequence/cli/", 0) == 0) return "cli";
  if (path == "01_sequence/sequence.h" || path == "01_sequence/sampling_params.h" ||
      path == "01_sequence/engine_config.h")
    return "types";
  if (path.rfind("01_sequence/", 0) == 0) return "entry";
  if (path.size() > 3 && path[0] == '0' && path[2] == '_') return path.substr(0, 2);
  return "";
}

// Why `from` may not include `to`, or "" when it may. deps: the Makefile's deps_NN lists.
std::string violation(const std::string& from, const std::string& to,
                      const std::map<std::string, std::set<std::string>>& deps) {
  const std::string a = zone_of(from), b = zone_of(to);
  if (b.empty() || a == b) return "";
  if (b == "base") return "";
  if (a == "base") return "the base utilities include only each other";
  if (b == "types") return a == "tokenizer" ? "the tokenizer needs no engine type" : "";
  if (a == "types") return "the shared data types include only the base utilities and each other";
  if (b == "cli") return a == "cli" ? "" : "nothing below the command line includes it";
  if (a == "cli") return "";
  if (b == "entry") return "nothing below the entry includes it";
  if (b == "tokenizer") return a == "entry" ? "" : "only the entry and the command line use the tokenizer";
  if (a == "entry") return "";
  if (a == "tokenizer") return "the tokenizer includes only the base utilities";
  // Two chapters 02-07: calls go to later chapters that the Makefile lists as dependencies.
  if (b < a) return "chapter " + a + " calls back into earlier chapter " + b;
  auto it = deps.find(a);
  if (it == deps.end() || !it->second.count(b)) return "chapter " + a + " includes chapter " + b + ", not in deps_" + a;
  return "";
}

std::map<std::string, std::set<std::string>> makefile_deps() {
  std::map<std::string, std::set<std::string>> deps;
  std::istringstream makefile(nanovllm::read_file(kRoot + "/Makefile"));
  std::string line;
  const std::regex pattern(R"(^deps_(\d\d)\s*:=(.*)$)");
  std::smatch m;
  while (std::getline(makefile, line)) {
    if (!std::regex_match(line, m, pattern)) continue;
    std::istringstream list(m[2].str());
    std::string chapter;
    deps[m[1].str()];
    while (list >> chapter) deps[m[1].str()].insert(chapter);
  }
  return deps;
}

}  // namespace

TEST(Book_Layout, TheRuleRejectsCallsAgainstTheReadingOrder) {
  // The checker itself, on made-up includes: each of these must be refused, each of the others allowed.
  const std::map<std::string, std::set<std::string>> deps = {{"02", {"03"}}, {"04", {"05", "06", "07"}}};
  EXPECT_NE(violation("05_attention/a.cu", "04_model_runner/tensor.h", deps), "");
  EXPECT_NE(violation("03_block_manager/b.cpp", "02_scheduler/scheduler.h", deps), "");
  EXPECT_NE(violation("02_scheduler/s.cpp", "01_sequence/llm_engine.h", deps), "");
  EXPECT_NE(violation("04_model_runner/m.cpp", "01_sequence/cli/flags.h", deps), "");
  EXPECT_NE(violation("04_model_runner/m.cpp", "01_sequence/tokenizer/tokenizer.h", deps), "");
  EXPECT_NE(violation("01_sequence/base/json.h", "01_sequence/sequence.h", deps), "");
  EXPECT_NE(violation("02_scheduler/s.cpp", "05_attention/attention.h", deps), "");  // not in deps_02
  EXPECT_EQ(violation("02_scheduler/s.cpp", "03_block_manager/block_manager.h", deps), "");
  EXPECT_EQ(violation("04_model_runner/m.cpp", "07_sampler/sampler.h", deps), "");
  EXPECT_EQ(violation("04_model_runner/m.cpp", "01_sequence/sequence.h", deps), "");
  EXPECT_EQ(violation("01_sequence/llm_engine.cpp", "01_sequence/tokenizer/tokenizer.h", deps), "");
  EXPECT_EQ(violation("01_sequence/cli/bench.cpp", "04_model_runner/profiler.h", deps), "");
}

TEST(Book_Layout, IncludesFollowTheReadingOrder) {
  const auto deps = makefile_deps();
  ASSERT_EQ(deps.size(), 7u) << "the Makefile should have deps_01 .. deps_07";
  std::vector<std::string> sources;
  for (const std::string& chapter : nanovllm::test::kChapters) list_sources(chapter, sources);
  ASSERT_GT(sources.size(), 40u);
  const std::regex include(R"(^\s*#\s*include\s+"([^"]+)\")");
  int checked = 0;
  for (const std::string& file : sources) {
    std::istringstream text(nanovllm::read_file(kRoot + "/" + file));
    std::string line;
    for (int line_no = 1; std::getline(text, line); line_no++) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      checked++;
      const std::string why = violation(file, m[1].str(), deps);
      EXPECT_EQ(why, "") << file << ":" << line_no << " includes " << m[1].str();
    }
  }
  EXPECT_GT(checked, 100);
}

// `ls` of a chapter shows its subject first: the subject's header sits at the chapter's top level, not in a
// subfolder, and 01_sequence, whose subfolders hold the tokenizer, the command line and the base utilities, keeps
// at most four of them.
TEST(Book_Layout, EveryChapterHasAReadmeAndItsSubjectAtItsTopLevel) {
  for (const auto& [chapter, subject] : std::vector<std::pair<std::string, std::string>>{
           {"01_sequence", "sequence.h"}, {"02_scheduler", "scheduler.h"}, {"03_block_manager", "block_manager.h"},
           {"04_model_runner", "model_runner.h"}, {"05_attention", "attention.h"},
           {"06_tensor_parallel", "linear.h"}, {"07_sampler", "sampler.h"}}) {
    EXPECT_TRUE(nanovllm::is_regular_file(kRoot + "/" + chapter + "/README.md")) << chapter;
    EXPECT_TRUE(nanovllm::is_regular_file(kRoot + "/" + chapter + "/" + subject)) << chapter << "/" << subject;
  }
  // 01_sequence's top level: the entry files and at most four subfolders.
  const std::set<std::string> top = nanovllm::test::folder_entries(kRoot + "/01_sequence");
  ASSERT_FALSE(top.empty());
  int folders = 0;
  for (const std::string& name : top) folders += nanovllm::is_directory(kRoot + "/01_sequence/" + name);
  EXPECT_LE(folders, 4);
}
