#include "dsv4/util/progress.h"

#include <algorithm>

#include <fmt/format.h>

#include "dsv4/platform/platform.h"

namespace dsv4 {

Progress::Progress(std::string label, std::string unit, int64_t total, int64_t min_total, FILE* out)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      enabled_(total > 0 && total >= min_total),
      tty_(platform::is_terminal(out)),
      out_(out),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (!finished_ && tty_ && enabled_ && last_decile_ >= 0) std::fputc('\n', out_);
}

void Progress::update(int64_t done, const std::string& note) {
  if (!enabled_ || finished_) return;
  done = std::clamp<int64_t>(done, 0, total_);
  const double frac = double(done) / double(total_);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? done / secs : 0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    fmt::print(out_, "\r{} [{}{}] {:3.0f}% {}/{} {} {:.1f} {}/s{}{}\x1b[K", label_, std::string(filled, '#'),
               std::string(kWidth - filled, '-'), frac * 100, done, total_, unit_, rate, unit_, note.empty() ? "" : ", ",
               note);
    std::fflush(out_);
    last_decile_ = 0;
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (decile > last_decile_ && done > 0) {  // nothing to say at 0 (the clock's start)
      fmt::print(out_, "{}: {:3d}% ({}/{} {}, {:.1f} {}/s{}{})\n", label_, decile * 10, done, total_, unit_, rate, unit_,
                 note.empty() ? "" : ", ", note);
      last_decile_ = decile;
    }
  }
  if (done == total_) finish();
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && enabled_ && last_decile_ >= 0) {
    std::fputs("\r\x1b[K", out_);  // erase the bar: the stats line says what happened
    std::fflush(out_);
  }
}

}  // namespace dsv4
