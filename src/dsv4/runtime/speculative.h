// Speculative decoding: a drafter guesses the next tokens, one forward pass verifies them all
// (k drafts + the token before them = k + 1 rows), and the rows after the first wrong guess
// are taken back (UndoLog). The output never changes: each verified row's logits are
// bit-identical to feeding the tokens one by one (the pass is chunk-invariant), the sampler
// draws every token from those logits exactly as without drafting, and a draft is kept only
// when it equals the token drawn. For a drafter that proposes one token (q = a point mass on
// it), this is standard speculative sampling — accept with min(1, p/q) = p(draft), else
// draw from the residual p without the draft, renormalized — realized with the sampler's own
// draw, so a seeded run emits the same tokens with drafting on or off.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dsv4 {

// The most tokens one step drafts (--draft-max and a request's draft_max take 1 to this):
// a verify pass carries at most kMaxDraftTokens + 1 rows, so its undo log is bounded too.
inline constexpr int kMaxDraftTokens = 16;

enum class SpecMode : uint8_t {
  kOff,    // one token per pass
  kAuto,   // draft when the measurements say it pays: n-gram drafts where the text repeats,
           // else MTP drafts (when the engine has the drafter)
  kNgram,  // prompt lookup: continue an earlier occurrence of the last tokens
  kMtp,    // the checkpoint's MTP layer (Engine::mtp_draft)
  kOracle, // benchmarks: drafts from a recorded continuation (every draft right)
};
SpecMode parse_spec_mode(const std::string& s);  // "off", "auto", "ngram", "mtp", "oracle" (Error otherwise)
const char* spec_mode_name(SpecMode m);

// Up to `max` tokens that followed the most recent earlier occurrence of the longest suffix
// of `history` (between kMinMatch and kMaxMatch tokens) — "prompt lookup". Writes them to
// out and returns how many (0: no earlier occurrence). `matched`: the suffix length found.
int ngram_draft(std::span<const int32_t> history, int max, int32_t* out, int* matched = nullptr);

// Chooses each step's draft length from what was measured: the acceptance rate of each draft
// position, and the time of a pass of n rows against a pass of one row. It drafts k tokens
// when k maximizes the expected tokens per second,
//   (1 + a1 + a1·a2 + … + a1·…·ak) / time(k + 1 rows),
// and k = 0 when no k beats one row per pass; then it tries k = 1 after kProbeInterval
// steps so that a change (a repetitive stretch of text) is noticed, and after twice as many
// each time a probe's draft is wrong (up to kMaxProbeInterval), so a drafter that is never
// right (random weights) costs almost nothing.
class DraftController {
 public:
  static constexpr int kProbeInterval = 16;
  static constexpr int kMaxProbeInterval = 512;
  DraftController(int draft_max, bool may_stop_drafting);
  // The draft length for the next step, at most `available` (what the drafter proposed).
  int draft_length(int available);
  // After a step that fed `rows` rows in `seconds` and kept `accepted` of its rows - 1 drafts.
  void record(int rows, int accepted, double seconds);

  int draft_max() const { return draft_max_; }
  double acceptance(int position) const { return accept_[position]; }

 private:
  int draft_max_;
  bool may_stop_;
  int steps_since_draft_ = 0;
  int probe_interval_ = kProbeInterval;
  bool probing_ = false;  // the last draft_length() was a probe
  std::vector<double> accept_;      // [draft_max]: P(draft i right | drafts before it right)
  std::vector<double> pass_time_;   // [draft_max + 1]: seconds of a pass of i + 1 rows (0: not seen)
};

}  // namespace dsv4
