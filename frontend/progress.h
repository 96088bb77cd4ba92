// Training progress: a live bar on a terminal, plain log lines otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace pa {

enum class ProgressMode { Auto, Bar, Lines, Quiet };

class Progress {
public:
  // `done`: steps taken before this run (a resumed one); rates count this run's steps only.
  Progress(int64_t total, int64_t logEvery, ProgressMode mode, std::FILE* out = stderr, int64_t done = 0);
  // Called after every step; `val` < 0 when no validation loss is known yet.
  void step(int64_t step, double loss, double val, double lr);
  // A line of its own between the progress lines ("checkpoint ..."); the bar is redrawn below it.
  void note(const std::string& text);
  // Ends the bar's line (if any).
  void finish();
  double elapsedSeconds() const;

private:
  void drawBar(int64_t step, double loss, double val);
  int64_t total_, logEvery_, done_;
  bool bar_, quiet_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_, lastDraw_;
  bool drawn_ = false;
};

std::string formatDuration(double seconds);
// "12.34 MiB".
std::string formatMiB(size_t bytes);

}  // namespace pa
