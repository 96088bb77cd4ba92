// Progress display.
#include "frontend/progress.h"

#include <unistd.h>

#include <cmath>

namespace pa {

std::string formatMiB(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string formatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

Progress::Progress(int64_t total, int64_t logEvery, ProgressMode mode, std::FILE* out, int64_t done)
    : total_(total), logEvery_(logEvery), done_(done), out_(out), start_(std::chrono::steady_clock::now()), lastDraw_(start_) {
  quiet_ = mode == ProgressMode::Quiet;
  bar_ = mode == ProgressMode::Bar || (mode == ProgressMode::Auto && isatty(fileno(out)));
}

double Progress::elapsedSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::drawBar(int64_t step, double loss, double val) {
  const double el = elapsedSeconds();
  const double rate = el > 0 ? static_cast<double>(step - done_) / el : 0.0;
  const int width = 24;
  const int filled = total_ ? static_cast<int>(width * step / total_) : width;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  char valBuf[32] = "";
  if (val >= 0) std::snprintf(valBuf, sizeof valBuf, "  val %.4e", val);
  std::fprintf(out_, "\r[%s] %lld/%lld  loss %.4e%s  %.1f steps/s  ETA %s\033[K", bar.c_str(), (long long)step,
               (long long)total_, loss, valBuf, rate, formatDuration(rate > 0 ? (total_ - step) / rate : NAN).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void Progress::step(int64_t step, double loss, double val, double lr) {
  if (quiet_) return;
  if (bar_) {
    const auto now = std::chrono::steady_clock::now();
    // Redraw at most ten times a second, and always on the last step.
    if (step == total_ || now - lastDraw_ > std::chrono::milliseconds(100)) {
      lastDraw_ = now;
      drawBar(step, loss, val);
    }
    return;
  }
  if (step % logEvery_ == 0 || step == total_) {
    const double el = elapsedSeconds();
    char valBuf[32] = "";
    if (val >= 0) std::snprintf(valBuf, sizeof valBuf, "  val %.6e", val);
    std::fprintf(out_, "step %lld/%lld  loss %.6e%s  lr %.3e  %.1f steps/s\n", (long long)step, (long long)total_, loss,
                 valBuf, lr, el > 0 ? static_cast<double>(step - done_) / el : 0.0);
    std::fflush(out_);
  }
}

void Progress::note(const std::string& text) {
  if (quiet_) return;
  if (bar_ && drawn_) std::fprintf(out_, "\r\033[K");
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
  drawn_ = false;
}

void Progress::finish() {
  if (bar_ && drawn_) std::fprintf(out_, "\n");
}

}  // namespace pa
