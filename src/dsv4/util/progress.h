// Progress on stderr: a redrawn bar when stderr is a terminal, otherwise one line per 10 %
// (so logs and CI output stay readable).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace dsv4 {

class Progress {
 public:
  // `label` e.g. "prefill"; `unit` e.g. "tokens". Nothing is printed for totals below
  // `min_total` (short prompts do not need a bar).
  Progress(std::string label, std::string unit, int64_t total, int64_t min_total = 0, FILE* out = stderr);
  ~Progress();
  // `note` (optional) follows the count, e.g. "41.2 tok/s, ETA 3m10s".
  void update(int64_t done, const std::string& note = "");
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_;
  bool enabled_;
  bool tty_;
  FILE* out_;
  int last_decile_ = -1;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dsv4
