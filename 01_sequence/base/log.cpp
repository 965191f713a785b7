// log.cpp: one stderr writer, so that a progress line drawn with \r and other lines take turns.
#include "01_sequence/base/log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace nanovllm {

namespace {

std::mutex mutex;
std::string progress;  // the line on screen now; "" when none

// ANSI "erase the whole line" after a carriage return: the cursor is back at column 0 on an empty line.
void erase_progress() {
  if (!progress.empty()) std::fputs("\r\x1b[2K", stderr);
}
void draw_progress() {
  if (!progress.empty()) std::fputs(progress.c_str(), stderr);
}

}  // namespace

void log(const char* format, ...) {
  std::lock_guard<std::mutex> lock(mutex);
  erase_progress();
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  draw_progress();
  std::fflush(stderr);
}

void show_progress(const std::string& line) {
  if (!isatty(STDERR_FILENO)) return;
  std::lock_guard<std::mutex> lock(mutex);
  erase_progress();
  progress = line;
  draw_progress();
  std::fflush(stderr);
}

void end_progress() {
  std::lock_guard<std::mutex> lock(mutex);
  if (progress.empty()) return;
  std::fputc('\n', stderr);
  progress.clear();
  std::fflush(stderr);
}

}  // namespace nanovllm
