#include "dsv4/runtime/speculative.h"

#include <algorithm>

#include "dsv4/util/error.h"

namespace dsv4 {

SpecMode parse_spec_mode(const std::string& s) {
  if (s == "off") return SpecMode::kOff;
  if (s == "auto") return SpecMode::kAuto;
  if (s == "ngram") return SpecMode::kNgram;
  if (s == "mtp") return SpecMode::kMtp;
  if (s == "oracle") return SpecMode::kOracle;
  fail("spec mode \"{}\": expected off, auto, ngram, mtp or oracle", s);
}

const char* spec_mode_name(SpecMode m) {
  switch (m) {
    case SpecMode::kOff: return "off";
    case SpecMode::kAuto: return "auto";
    case SpecMode::kNgram: return "ngram";
    case SpecMode::kMtp: return "mtp";
    case SpecMode::kOracle: return "oracle";
  }
  return "?";
}

namespace {
constexpr int kMinMatch = 1, kMaxMatch = 4;
// How far back prompt lookup searches: far enough for a long prompt's quotes, bounded so a
// step costs microseconds however long the session.
constexpr size_t kSearchWindow = 16384;
}  // namespace

int ngram_draft(std::span<const int32_t> history, int max, int32_t* out, int* matched) {
  const size_t n = history.size();
  if (max <= 0 || n < 2) return 0;
  const size_t from = n > kSearchWindow ? n - kSearchWindow : 0;
  for (int len = std::min<int>(kMaxMatch, static_cast<int>(n) - 1); len >= kMinMatch; --len) {
    const int32_t* suffix = history.data() + n - len;
    // The most recent earlier occurrence (it may overlap the suffix, not be it).
    for (size_t start = n - len; start-- > from;) {
      if (!std::equal(suffix, suffix + len, history.data() + start)) continue;
      const size_t follow = start + len;
      const int k = static_cast<int>(std::min<size_t>(static_cast<size_t>(max), n - follow));
      std::copy_n(history.data() + follow, k, out);
      if (matched) *matched = len;
      return k;
    }
  }
  return 0;
}

DraftController::DraftController(int draft_max, bool may_stop_drafting)
    : draft_max_(std::max(0, draft_max)),
      may_stop_(may_stop_drafting),
      accept_(static_cast<size_t>(draft_max_), 0.5),
      pass_time_(static_cast<size_t>(draft_max_) + 1, 0.0) {}

int DraftController::draft_length(int available) {
  available = std::min(available, draft_max_);
  if (available <= 0) return 0;
  // A pass time not measured yet is extrapolated from the nearest measured one, assuming a
  // pass of n rows costs 1 + 0.1 (n - 1) of one row (decode is bound by reading the weights,
  // which the rows share); the measurements correct it after the first try.
  auto model = [](int rows) { return 1.0 + 0.1 * (rows - 1); };
  auto time_of = [&](int rows) {
    const double t = pass_time_[static_cast<size_t>(rows - 1)];
    if (t > 0) return t;
    for (int d = 1; d <= draft_max_; ++d)
      for (const int r : {rows - d, rows + d})
        if (r >= 1 && r <= draft_max_ + 1 && pass_time_[static_cast<size_t>(r - 1)] > 0)
          return pass_time_[static_cast<size_t>(r - 1)] * model(rows) / model(r);
    return model(rows);
  };
  int best = 0;
  double best_rate = 1.0 / time_of(1), expected = 1.0, run = 1.0;
  for (int k = 1; k <= available; ++k) {
    run *= accept_[static_cast<size_t>(k - 1)];
    expected += run;
    const double rate = expected / time_of(k + 1);
    if (rate > best_rate) best = k, best_rate = rate;
  }
  probing_ = false;
  if (best == 0 && !may_stop_) best = 1;
  if (best == 0 && ++steps_since_draft_ >= probe_interval_) best = 1, probing_ = true;
  if (best > 0) steps_since_draft_ = 0;
  return best;
}

void DraftController::record(int rows, int accepted, double seconds) {
  constexpr double kWeight = 0.15;  // exponential moving averages
  if (rows < 1 || rows > draft_max_ + 1) return;
  if (probing_ && rows > 1) probe_interval_ = accepted > 0 ? kProbeInterval : std::min(2 * probe_interval_, kMaxProbeInterval);
  probing_ = false;
  double& t = pass_time_[static_cast<size_t>(rows - 1)];
  t = t > 0 ? (1 - kWeight) * t + kWeight * seconds : seconds;
  // Draft i (0-based) was tried if the ones before it were right.
  for (int i = 0; i < rows - 1 && i <= accepted; ++i) {
    const double right = i < accepted ? 1.0 : 0.0;
    accept_[static_cast<size_t>(i)] = (1 - kWeight) * accept_[static_cast<size_t>(i)] + kWeight * right;
  }
}

}  // namespace dsv4
