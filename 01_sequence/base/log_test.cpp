// Tests for the stderr writer (01_sequence/base/log.h): the progress line and log() lines taking turns on
// a terminal.
#include "01_sequence/base/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

using namespace nanovllm;

namespace {

// The bytes `body` writes to stderr when stderr is a terminal: it runs in a child process whose stderr is
// the far end of a pseudo-terminal in raw mode (no \n -> \r\n translation), and the parent reads them all.
// Returns "no pseudo-terminal" when none can be had.
std::string stderr_on_a_terminal(const std::function<void()>& body) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) return "no pseudo-terminal";
  const int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
  if (slave < 0) return "no pseudo-terminal";
  termios raw;
  tcgetattr(slave, &raw);
  cfmakeraw(&raw);
  tcsetattr(slave, TCSANOW, &raw);
  std::fflush(stderr);
  const pid_t child = fork();
  if (child == 0) {
    dup2(slave, STDERR_FILENO);
    body();
    std::fflush(stderr);
    _exit(0);
  }
  close(slave);
  int status = 0;
  waitpid(child, &status, 0);
  std::string bytes;
  char buffer[256];
  fcntl(master, F_SETFL, O_NONBLOCK);
  for (ssize_t n; (n = read(master, buffer, sizeof buffer)) > 0;) bytes.append(buffer, size_t(n));
  close(master);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the child failed";
  return bytes;
}

}  // namespace

TEST(Ch01_Log, ALogLineClearsTheProgressLineAndRedrawsItBelow) {
  // log.h's contract: a log() line while the progress line is shown erases it (log.cpp: \r, then ANSI
  // "erase the whole line", ESC [2K), prints its own line, and redraws the progress line below it;
  // end_progress() leaves the progress line on a line of its own (a \n), after which a log() line is
  // printed alone, with nothing erased or redrawn. So, byte by byte:
  //   "3/8"                  show_progress("3/8"): nothing to erase yet
  //   "\r\x1b[2K" "trace 1\n" "3/8"   log("trace %d", 1)
  //   "\n"                   end_progress()
  //   "after\n"              log("after")
  const std::string bytes = stderr_on_a_terminal([] {
    show_progress("3/8");
    log("trace %d", 1);
    end_progress();
    log("after");
  });
  if (bytes == "no pseudo-terminal") GTEST_SKIP() << "no pseudo-terminal to give stderr";
  EXPECT_EQ(bytes, "3/8\r\x1b[2Ktrace 1\n3/8\nafter\n");
}

TEST(Ch01_Log, ANewProgressLineReplacesTheOldInPlace) {
  // show_progress() erases the line on screen before drawing the new one, so the two never run together;
  // end_progress() with no progress line shown writes nothing (there is no line to leave).
  const std::string bytes = stderr_on_a_terminal([] {
    end_progress();
    show_progress("1/2");
    show_progress("2/2");
    end_progress();
    end_progress();
  });
  if (bytes == "no pseudo-terminal") GTEST_SKIP() << "no pseudo-terminal to give stderr";
  EXPECT_EQ(bytes, "1/2\r\x1b[2K2/2\n");
}
