// log.h: lines on stderr that never collide with the progress bar. While generate() shows its
// progress line ("Generating: 3/8 [Decode: 412 tok/s]", redrawn in place with \r when stderr is a
// terminal), log() clears it, prints its own line, and redraws it below. Use it for anything you want
// to print from inside the engine (--trace does):
//
//   nanovllm::log("seq %lld hit %d prefix blocks", (long long)seq->seq_id, hits);
#pragma once

#include <string>

namespace nanovllm {

// printf-style; a newline is added.
void log(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The progress line: shown (and redrawn after every log()) until end_progress(), which leaves it on a
// line of its own. Only drawn when stderr is a terminal.
void show_progress(const std::string& line);
void end_progress();

}  // namespace nanovllm
