// The docs are part of the code: every README, the walkthrough and the notes are checked against the
// code as it is. For each Markdown file:
//   - a path it names (a link, or a `path` in backticks that starts with one of our folders or is a
//     source file) exists;
//   - a C++ name it gives as `Class::member` exists in the sources;
//   - a nano-vllm line reference (`l.17-35`) is well formed: 1 <= first <= last <= 2000;
//   - a Makefile line it quotes (`deps_02 := 03`) is the Makefile's;
//   - it holds no merge conflict markers;
//   - it quotes no test count ("42 tests" goes stale with the next test);
//   - every ```check block (indented in a list item or not) runs: lines starting with "$ " are shell
//     commands (run from the repository root, in one shell, with build/ standing for the build folder
//     of this test binary), the other lines are output that the command before them must print (stdout
//     and stderr together; each quoted line matches one printed line, in any order; "…" in a quoted
//     line matches anything).
// The walkthrough's "All exercises" list names each chapter's exercises, 1 to its README's last.
// And no source comment cites a document that is not in the repository. tests/data/docs_fixture/ holds
// a README broken on purpose: the checker must find each of its faults.

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "01_sequence/base/common.h"
#include "01_sequence/base/files.h"
#include "tests/test_util.h"

namespace {

const std::string kRoot = NANOVLLM_SOURCE_DIR;

// Every file under `dir` (relative to the root) whose name matches `pattern`, skipping build folders,
// hidden folders and test data.
void list_files(const std::string& dir, const std::regex& pattern, std::vector<std::string>& out,
                bool with_test_data = false) {
  for (const std::string& name : nanovllm::test::folder_entries(kRoot + "/" + dir)) {
    if (name[0] == '.' || name.rfind("build", 0) == 0) continue;
    const std::string path = dir.empty() ? name : dir + "/" + name;
    if (path == "tests/data" && !with_test_data) continue;
    if (nanovllm::is_directory(kRoot + "/" + path)) {
      list_files(path, pattern, out, with_test_data);
    } else if (std::regex_match(name, pattern)) {
      out.push_back(path);
    }
  }
}

std::vector<std::string> sources() {
  std::vector<std::string> files;
  list_files("", std::regex(R"(.*\.(h|cpp|cu|cuh|py|sh))"), files);
  return files;
}

// The engine's sources, tests left out (a test may name what does not exist, to check that it does not).
const std::string& all_source_text() {
  static const std::string text = [] {
    std::string t;
    for (const std::string& f : sources())
      if (f.rfind("tests/", 0) != 0 && f.find("_test.c") == std::string::npos)  // _test.cpp and _test.cu
        t += nanovllm::read_file(kRoot + "/" + f) + "\n";
    return t;
  }();
  return text;
}

// Every file of the repository, test data included, for bare file names.
const std::vector<std::string>& all_files() {
  static const std::vector<std::string> files = [] {
    std::vector<std::string> f;
    list_files("", std::regex(".*"), f, /*with_test_data=*/true);
    return f;
  }();
  return files;
}

bool exists(const std::string& path) { return nanovllm::is_regular_file(path) || nanovllm::is_directory(path); }

std::string folder_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

// `unicode_tables.{h,cpp}` -> both names; anything else -> itself.
std::vector<std::string> expand_braces(const std::string& token) {
  const size_t open = token.find('{'), close = token.find('}');
  if (open == std::string::npos || close == std::string::npos || close < open) return {token};
  std::vector<std::string> out;
  std::istringstream alternatives(token.substr(open + 1, close - open - 1));
  std::string alt;
  while (std::getline(alternatives, alt, ','))
    out.push_back(token.substr(0, open) + alt + token.substr(close + 1));
  return out;
}

// True when `path`, with * wildcards, names at least one existing file relative to `base`.
bool glob_exists(const std::string& base, const std::string& path) {
  if (path.find('*') == std::string::npos) return exists(base + "/" + path);
  std::vector<std::string> files;
  const std::string folder = folder_of(path);
  std::string pattern = path.substr(folder.empty() ? 0 : folder.size() + 1);
  pattern = std::regex_replace(pattern, std::regex(R"(\.)"), R"(\.)");
  pattern = std::regex_replace(pattern, std::regex(R"(\*)"), ".*");
  const std::regex name_pattern(pattern);
  for (const std::string& name : nanovllm::test::folder_entries(base + "/" + folder))
    if (std::regex_match(name, name_pattern)) return true;
  return false;
}

// Paths, symbols and references of one Markdown file; returns one message per fault.
std::vector<std::string> check_references(const std::string& md) {
  std::vector<std::string> faults;
  const std::string text = nanovllm::read_file(kRoot + "/" + md);
  const std::string dir = kRoot + "/" + folder_of(md);
  auto fault = [&](const std::string& what) { faults.push_back(md + ": " + what); };

  // Links: [text](target).
  const std::regex link(R"(\]\(([^)\s]+)\))");
  for (std::sregex_iterator it(text.begin(), text.end(), link), end; it != end; ++it) {
    std::string target = (*it)[1].str();
    if (target.rfind("http", 0) == 0 || target.rfind("mailto:", 0) == 0 || target[0] == '#') continue;
    target = target.substr(0, target.find('#'));
    if (!exists(dir + "/" + target)) fault("link to a missing file: " + target);
  }

  // `backticked` paths and names.
  static const std::set<std::string> kOurs = [] {
    std::set<std::string> ours(nanovllm::test::kChapters.begin(), nanovllm::test::kChapters.end());
    ours.insert({"tests", "walkthrough", ".ci", "Makefile", "README.md"});
    return ours;
  }();
  const std::regex code(R"(`([^`\n]+)`)");
  const std::regex path_like(R"([A-Za-z0-9_.*{},/-]+)");
  const std::regex source_file(R"([A-Za-z0-9_*{},-]+\.(h|cpp|cu|cuh|sh|md))");
  const std::regex qualified(R"(([A-Z][A-Za-z0-9_]*)::(~?[A-Za-z_][A-Za-z0-9_]*)(\(\))?)");
  for (std::sregex_iterator it(text.begin(), text.end(), code), end; it != end; ++it) {
    const std::string token = (*it)[1].str();
    std::smatch m;
    if (std::regex_match(token, m, qualified)) {
      // Class::member: the qualified name appears in the sources, or the class and the member both do.
      const std::string& src = all_source_text();
      const std::string cls = m[1].str(), member = m[2].str();
      const bool found = src.find(cls + "::" + member) != std::string::npos ||
                         ((src.find("class " + cls) != std::string::npos ||
                           src.find("struct " + cls) != std::string::npos ||
                           src.find("enum class " + cls) != std::string::npos) &&
                          std::regex_search(src, std::regex("\\b" + member + "\\b")));
      if (!found) fault("no such C++ name: " + token);
      continue;
    }
    if (!std::regex_match(token, path_like)) continue;
    for (std::string path : expand_braces(token)) {
      while (!path.empty() && (path.back() == '/' || path.back() == '.' || path.back() == ',')) path.pop_back();
      if (path.empty()) continue;
      const std::string first = path.substr(0, path.find('/'));
      if (path.find('/') != std::string::npos) {
        // A path in one of our folders (from the root or from this file's folder) must exist.
        const bool ours_from_root = kOurs.count(first) > 0;
        const bool ours_from_here = first != ".." && exists(dir + "/" + first);
        if (first == "..") {
          if (path.rfind("../shared", 0) != 0 && !glob_exists(dir, path)) fault("missing path: " + path);
        } else if (ours_from_here && !glob_exists(dir, path)) {
          fault("missing path: " + path);
        } else if (ours_from_root && !ours_from_here && !glob_exists(kRoot, path)) {
          fault("missing path: " + path);
        }
      } else if (std::regex_match(path, source_file)) {
        // A bare source file name: beside this file, or anywhere in the repository.
        if (glob_exists(dir, path)) continue;
        bool found = false;
        for (const std::string& f : all_files())
          found |= f == path || (f.size() > path.size() && f.compare(f.size() - path.size() - 1, path.size() + 1, "/" + path) == 0);
        if (!found) fault("no such file anywhere: " + path);
      }
    }
  }

  // nano-vllm line references: l.N or l.N-M with 1 <= N <= M <= 2000 (a `file.py:N` is not checked).
  const std::regex line_ref(R"(\bl\.(\d+)(?:-(\d+))?)");
  for (std::sregex_iterator it(text.begin(), text.end(), line_ref), end; it != end; ++it) {
    const long a = std::stol((*it)[1].str());
    const long b = (*it)[2].matched ? std::stol((*it)[2].str()) : a;
    if (a < 1 || b < a || b > 2000) fault("malformed line reference: " + (*it)[0].str());
  }

  // A quoted Makefile dependency line is the Makefile's: `deps_02 := 03`.
  const std::string makefile = nanovllm::read_file(kRoot + "/Makefile");
  const std::regex deps_line(R"(deps_\d\d :=[ 0-9]*[0-9]|deps_\d\d :=)");
  for (std::sregex_iterator it(text.begin(), text.end(), deps_line), end; it != end; ++it)
    if (!std::regex_search(makefile, std::regex("(^|\n)" + (*it)[0].str() + " *\n")))
      fault("quotes a Makefile line it does not have: " + (*it)[0].str());

  // A merge left half done.
  const std::regex conflict_marker(R"((^|\n)(<<<<<<<|>>>>>>>) )");
  if (std::regex_search(text, conflict_marker)) fault("holds merge conflict markers");

  // Test counts go stale: "48 tests", "17 tests pass".
  const std::regex test_count(R"(\b\d+ tests\b)");
  for (std::sregex_iterator it(text.begin(), text.end(), test_count), end; it != end; ++it)
    fault("quotes a test count: " + (*it)[0].str());
  return faults;
}

// The output of a shell script run from the repository root, stdout and stderr together.
std::string run_shell(const std::string& script) {
  char name[] = "/tmp/nanovllm-docs-XXXXXX";
  const int fd = mkstemp(name);
  if (fd < 0) return "(cannot create a temporary file)";
  FILE* f = fdopen(fd, "w");
  std::fputs(script.c_str(), f);
  std::fclose(f);
  const std::string command = "cd '" + kRoot + "' && bash " + name + " 2>&1";
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    std::array<char, 4096> buffer;
    size_t n;
    while ((n = std::fread(buffer.data(), 1, buffer.size(), p)) > 0) out.append(buffer.data(), n);
    pclose(p);
  }
  std::remove(name);
  return out;
}

// Does `line` match the quoted `pattern` ("…" matches any text)?
bool matches(const std::string& line, const std::string& pattern) {
  std::string re;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 3, "…") == 0) {
      re += ".*";
      i += 3;
      continue;
    }
    if (std::string(R"(\^$.|?*+()[]{})").find(pattern[i]) != std::string::npos) re += '\\';
    re += pattern[i++];
  }
  return std::regex_match(line, std::regex(re));
}

// Runs every ```check block of a Markdown file; returns one message per quoted line not printed.
std::vector<std::string> check_commands(const std::string& md) {
  std::vector<std::string> faults;
  std::istringstream text(nanovllm::read_file(kRoot + "/" + md));
  const std::string build = nanovllm::data_dir() + "/..";  // the folder of this test binary
  std::string line;
  bool in_block = false;
  struct Command {
    std::string shell;
    std::vector<std::string> expected;
  };
  std::vector<Command> block;
  auto run_block = [&] {
    // One shell for the whole block (variables carry over), a marker line before each command.
    std::string script = "set -o pipefail\n";
    for (size_t i = 0; i < block.size(); i++) script += "echo '@@command " + std::to_string(i) + "'\n" + block[i].shell + "\n";
    const std::string out = run_shell(script);
    std::vector<std::vector<std::string>> printed(block.size());
    std::istringstream lines(out);
    std::string l;
    int current = -1;
    while (std::getline(lines, l)) {
      if (l.rfind("@@command ", 0) == 0) current = std::stoi(l.substr(10));
      else if (current >= 0) printed[size_t(current)].push_back(l);
    }
    for (size_t i = 0; i < block.size(); i++) {
      std::vector<bool> used(printed[i].size(), false);
      for (const std::string& want : block[i].expected) {
        bool found = false;
        for (size_t j = 0; j < printed[i].size() && !found; j++)
          if (!used[j] && matches(printed[i][j], want)) used[j] = found = true;
        if (!found) faults.push_back(md + ": `" + block[i].shell.substr(0, 60) + "` no longer prints: " + want);
      }
    }
    block.clear();
  };
  size_t indent = 0;  // a block inside a list item is indented: its lines lose that many spaces
  auto unindent = [&](std::string& l) {
    const size_t spaces = std::min(l.find_first_not_of(' '), l.size());  // npos: a blank line
    l.erase(0, std::min(indent, spaces));
  };
  while (std::getline(text, line)) {
    if (!in_block) {
      indent = line.find_first_not_of(' ');
      in_block = indent != std::string::npos && line.compare(indent, std::string::npos, "```check") == 0;
      continue;
    }
    unindent(line);
    if (line == "```") {
      run_block();
      in_block = false;
    } else if (line.rfind("$ ", 0) == 0) {
      std::string shell = std::regex_replace(line.substr(2), std::regex(R"(\bbuild/)"), build + "/");
      while (!shell.empty() && shell.back() == '\\' && std::getline(text, line)) {
        unindent(line);
        shell += "\n" + std::regex_replace(line, std::regex(R"(\bbuild/)"), build + "/");
      }
      block.push_back({shell, {}});
    } else if (!block.empty() && !line.empty()) {
      block.back().expected.push_back(line);
    }
  }
  return faults;
}

std::vector<std::string> markdown_files() {
  std::vector<std::string> docs;
  list_files("", std::regex(R"(.*\.md)"), docs);
  return docs;
}

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "  " + l + "\n";
  return s;
}

// The walkthrough's "All exercises" list against each chapter's README. `readme` is a chapter README's
// text: its exercises are the lines "N. ..." at the start of a line in its "## Exercises" section, which
// must be numbered 1, 2, ... in order. `walkthrough` is the walkthrough's text: its bullet for the chapter,
// "- [CHAPTER](../CHAPTER/README.md): 1 what; 2 what; ..." (continued on indented lines), must name the
// same numbers, 1 to the README's last, each after the colon or a semicolon. Returns one message per fault.
std::vector<std::string> check_exercise_list(const std::string& chapter, const std::string& readme,
                                             const std::string& walkthrough) {
  std::vector<std::string> faults;
  std::vector<int> in_readme;
  {
    std::istringstream lines(readme);
    std::string line;
    bool inside = false;
    std::smatch m;
    while (std::getline(lines, line)) {
      if (line.rfind("## ", 0) == 0) inside = line == "## Exercises";
      else if (inside && std::regex_search(line, m, std::regex(R"(^(\d+)\. )")))
        in_readme.push_back(std::stoi(m[1]));
    }
  }
  for (size_t i = 0; i < in_readme.size(); i++)
    if (in_readme[i] != static_cast<int>(i) + 1)
      faults.push_back(chapter + "/README.md: exercise " + std::to_string(in_readme[i]) + " where " +
                       std::to_string(i + 1) + " was due");

  const std::string head = "- [" + chapter + "](../" + chapter + "/README.md):";
  const std::string text = "\n" + walkthrough;  // so that a bullet on the first line starts a line too
  const size_t start = text.find("\n" + head);
  if (start == std::string::npos) {
    if (!in_readme.empty()) faults.push_back("the walkthrough lists no exercises of " + chapter);
    return faults;
  }
  std::string bullet;  // the bullet's text after its colon, its continuation lines joined
  {
    std::istringstream lines(text.substr(start + 1 + head.size()));
    std::string line;
    for (bool first = true; std::getline(lines, line); first = false) {
      if (!first && line.rfind("  ", 0) != 0) break;
      bullet += " " + line;
    }
  }
  std::vector<int> listed;
  const std::regex item(R"((?:^|;)\s+(\d+) )");
  for (std::sregex_iterator it(bullet.begin(), bullet.end(), item), end; it != end; ++it)
    listed.push_back(std::stoi((*it)[1]));
  bool one_to_n = listed.size() == in_readme.size();
  for (size_t i = 0; one_to_n && i < listed.size(); i++) one_to_n = listed[i] == static_cast<int>(i) + 1;
  if (!one_to_n) {
    std::string got;
    for (int n : listed) got += (got.empty() ? "" : " ") + std::to_string(n);
    faults.push_back("the walkthrough lists " + chapter + "'s exercises as [" + got + "], its README has " +
                     std::to_string(in_readme.size()));
  }
  return faults;
}
}  // namespace

TEST(Book_Docs, TheCheckerFindsEveryFaultOfABrokenReadme) {
  const std::string fixture = "tests/data/docs_fixture/broken_readme.txt";
  std::vector<std::string> faults = check_references(fixture);
  for (const std::string& f : check_commands(fixture)) faults.push_back(f);
  const std::string all = join(faults);
  EXPECT_NE(all.find("missing path: 01_sequence/no_such_file.h"), std::string::npos) << all;
  EXPECT_NE(all.find("link to a missing file: ../../../02_scheduler/gone.md"), std::string::npos) << all;
  EXPECT_NE(all.find("no such C++ name: ModelRunner::fly_to_the_moon"), std::string::npos) << all;
  EXPECT_NE(all.find("no such file anywhere: vanished.cpp"), std::string::npos) << all;
  EXPECT_NE(all.find("malformed line reference: l.30-20"), std::string::npos) << all;
  EXPECT_NE(all.find("quotes a test count: 42 tests"), std::string::npos) << all;
  EXPECT_NE(all.find("no longer prints: this line is not what the binary prints"), std::string::npos) << all;
  EXPECT_NE(all.find("no longer prints: an indented block is checked too"), std::string::npos) << all;
  EXPECT_EQ(faults.size(), 8u) << "the fixture's correct lines must pass:\n" << all;
}

TEST(Book_Docs, PathsSymbolsAndReferencesExist) {
  std::vector<std::string> faults;
  const std::vector<std::string> docs = markdown_files();
  ASSERT_GE(docs.size(), 10u);
  for (const std::string& md : docs)
    for (const std::string& f : check_references(md)) faults.push_back(f);
  EXPECT_TRUE(faults.empty()) << join(faults);
}

TEST(Book_Docs, CheckedCommandsPrintWhatTheDocsQuote) {
  if (!nanovllm::is_regular_file(nanovllm::data_dir() + "/../nanovllm"))
    GTEST_SKIP() << "build/nanovllm is not built (make builds it before running this test)";
  std::vector<std::string> faults;
  int blocks = 0;
  for (const std::string& md : markdown_files()) {
    if (nanovllm::read_file(kRoot + "/" + md).find("```check") != std::string::npos) blocks++;
    for (const std::string& f : check_commands(md)) faults.push_back(f);
  }
  EXPECT_GE(blocks, 1);
  EXPECT_TRUE(faults.empty()) << join(faults);
}

TEST(Book_Docs, SourceCommentsCiteOnlyWhatIsInTheRepository) {
  // Documents outside the repository (the design page and the nano-vllm notes of the team that wrote
  // this) mean nothing to a reader of the book.
  const std::string notes = std::string("nano-vllm-") + "notes";  // spelled in two pieces: not a citation
  const std::regex outside("notes P\\d+|DESIGN\\.md|" + notes);
  std::vector<std::string> faults;
  for (const std::string& file : sources()) {
    std::istringstream text(nanovllm::read_file(kRoot + "/" + file));
    std::string line;
    for (int n = 1; std::getline(text, line); n++)
      if (std::regex_search(line, outside)) faults.push_back(file + ":" + std::to_string(n) + ": " + line);
  }
  std::vector<std::string> docs = markdown_files();
  for (const std::string& md : docs) {
    std::istringstream text(nanovllm::read_file(kRoot + "/" + md));
    std::string line;
    for (int n = 1; std::getline(text, line); n++)
      if (std::regex_search(line, std::regex("notes P\\d+|" + notes)))
        faults.push_back(md + ":" + std::to_string(n) + ": " + line);
  }
  EXPECT_TRUE(faults.empty()) << join(faults);
}

TEST(Book_Docs, TheWalkthroughListsEveryExerciseOfEachChapter) {
  // The checker first, on a chapter of three exercises listed as two, and on one numbered out of order.
  const std::string three = "# ch\n\n## Exercises\n\n1. **A.** a\n   more\n2. **B.** b\n3. **C.** c\n\n## Next\n4. not one\n";
  const std::string listed_two = "## All exercises\n\n- [ch](../ch/README.md): 1 a; 2 b (3,\n  4 words).\n- [xx.md](xx.md): 3 x\n";
  std::vector<std::string> faults = check_exercise_list("ch", three, listed_two);
  ASSERT_EQ(faults.size(), 1u) << join(faults);
  EXPECT_NE(faults[0].find("[1 2], its README has 3"), std::string::npos) << faults[0];
  const std::string listed_three = "- [ch](../ch/README.md): 1 a; 2 b;\n  3 c\n";
  EXPECT_TRUE(check_exercise_list("ch", three, listed_three).empty());
  const std::string skipped = "## Exercises\n1. a\n3. c\n";
  EXPECT_FALSE(check_exercise_list("ch", skipped, "- [ch](../ch/README.md): 1 a; 2 c\n").empty());

  // Then the book.
  const std::string walkthrough = nanovllm::read_file(kRoot + "/walkthrough/README.md");
  faults.clear();
  int chapters = 0;
  for (const std::string& chapter : nanovllm::test::kChapters) {
    const std::string readme = nanovllm::read_file(kRoot + "/" + chapter + "/README.md");
    if (readme.find("\n## Exercises\n") != std::string::npos) chapters++;
    for (const std::string& f : check_exercise_list(chapter, readme, walkthrough)) faults.push_back(f);
  }
  EXPECT_EQ(chapters, int(nanovllm::test::kChapters.size()));  // every chapter has its exercises
  EXPECT_TRUE(faults.empty()) << join(faults);
}
