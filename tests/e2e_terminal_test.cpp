// The progress line in a terminal (01_sequence/base/log.h): with stderr a terminal, generate() redraws
// "Generating: 1/2 [Decode: 412 tok/s]" in place with \r, and every other line (the --trace lines, and
// anything printed through log(), which is how --trace prints) must land on a line of its own. The test
// runs build/nanovllm under script(1), which gives it a pseudo-terminal, renders the captured bytes
// as a terminal would (\r, \n, and the "erase line" escape), and compares the screen with what the same
// command prints when stderr is a file (no progress line at all).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

using namespace nanovllm;

namespace {

// What a shell command prints on stdout, and its exit status.
std::pair<int, std::string> shell(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), p)) > 0) out.append(buffer.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The screen a terminal shows after receiving `bytes`: \r moves to column 0, \n to the next line,
// ESC [ 2 K erases the whole line and ESC [ K (or 0 K) the rest of it; other bytes overwrite the cell
// under the cursor. Returns the lines, trailing spaces removed.
std::vector<std::string> render(const std::string& bytes) {
  std::vector<std::string> screen(1);
  size_t row = 0, col = 0;
  for (size_t i = 0; i < bytes.size(); i++) {
    const char c = bytes[i];
    if (c == '\r') {
      col = 0;
    } else if (c == '\n') {
      if (++row == screen.size()) screen.emplace_back();
    } else if (c == '\x1b' && i + 1 < bytes.size() && bytes[i + 1] == '[') {
      size_t end = i + 2;  // a CSI sequence: parameters, then one final byte in @..~
      while (end < bytes.size() && !(bytes[end] >= '@' && bytes[end] <= '~')) end++;
      const std::string params = bytes.substr(i + 2, end - i - 2);
      if (end < bytes.size() && bytes[end] == 'K') {
        std::string& line = screen[row];
        if (params == "2") line.clear();
        else if ((params.empty() || params == "0") && col < line.size()) line.resize(col);
      }
      i = end;
    } else {
      std::string& line = screen[row];
      if (line.size() <= col) line.resize(col + 1, ' ');
      line[col++] = c;
    }
  }
  for (std::string& line : screen) line.erase(line.find_last_not_of(' ') + 1);
  return screen;
}

// Rates vary from run to run: "1234 tok/s" -> "N tok/s".
std::string without_rates(const std::string& line) {
  return std::regex_replace(line, std::regex(R"(\d+ tok/s)"), "N tok/s");
}

}  // namespace

TEST(E2E_Terminal, TraceLinesNeverJoinTheProgressLine) {
  if (shell("command -v script >/dev/null").first != 0)
    GTEST_SKIP() << "script (util-linux, Debian package bsdutils) is not installed: no way to give the engine a terminal";
  // Two prompts, four steps: the progress line is on screen from step 1 on, so steps 2-4 trace while
  // it is drawn. Stdout (the completions) goes to /dev/null; stderr is the terminal.
  const std::string args = "generate --model '" + test::golden_dir("tiny-qwen3-b") +
                           "' --prompt-ids 1,2,3 --prompt-ids 4,5 --temperature 0 --max-tokens 4 --trace --device cpu";
  const std::string command = test::nanovllm_binary() + " " + args + " >/dev/null";
  auto [status, raw] = shell("script -q -e -c \"" + command + "\" /dev/null </dev/null 2>&1");
  if (status != 0 && raw.find("pseudo-terminal") != std::string::npos)
    GTEST_SKIP() << "script cannot open a pseudo-terminal here: " << raw;
  ASSERT_EQ(status, 0) << raw;

  // The test means something only if the progress line was on screen when trace lines came.
  const size_t progress = raw.find("Generating: ");
  ASSERT_NE(progress, std::string::npos) << "no progress line: stderr was not a terminal?\n" << raw;
  ASSERT_NE(raw.find("[step 2]", progress), std::string::npos) << raw;

  // What a terminal shows, progress lines left out, is what the command prints to a file.
  std::vector<std::string> shown;
  int progress_lines = 0;
  for (const std::string& line : render(raw)) {
    if (line.rfind("Generating: ", 0) == 0) {
      progress_lines++;
      EXPECT_EQ(line.find("[step"), std::string::npos) << "a trace line glued behind the progress line: " << line;
      continue;
    }
    if (!line.empty()) shown.push_back(without_rates(line));
  }
  EXPECT_EQ(progress_lines, 1) << "the progress line is redrawn in place, and left on a line of its own at the end";
  auto [file_status, plain] = shell(test::nanovllm_binary() + " " + args + " 2>&1 >/dev/null");
  ASSERT_EQ(file_status, 0) << plain;
  std::vector<std::string> expected;
  std::istringstream lines(plain);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) expected.push_back(without_rates(line));
  ASSERT_GE(expected.size(), 6u) << plain;  // device line, steps 1-4, summary
  EXPECT_EQ(expected[1].rfind("[step 1] prefill", 0), 0u) << plain;
  EXPECT_EQ(shown, expected) << "the terminal showed:\n" << raw;
}
