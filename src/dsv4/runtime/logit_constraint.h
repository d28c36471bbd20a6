// What the generator needs from constrained decoding (src/dsv4/constrain/ implements it):
// before each draw the tokens that cannot continue a valid output get a logit of -inf, so
// every sampler setting (greedy, temperature, top-k/p, min-p, repetition penalty) works
// unchanged on what is left; after the draw the constraint advances by the chosen token.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>

namespace dsv4 {

// One generation's progress through a constraint.
class ConstrainedRun {
 public:
  virtual ~ConstrainedRun() = default;
  static constexpr int64_t kNoBudget = std::numeric_limits<int64_t>::max();
  // Sets the logit of every token that cannot come next to -inf. At least one token always
  // stays allowed (the constraint never reaches a dead end). `tokens_left` counts the token
  // drawn now and every one after it that the generation may still take: where a token would
  // leave too few for the shortest complete output, it is not allowed either, so an output
  // given at least LogitConstraint::min_tokens() always completes. Where the budget is ample
  // (no allowed token is refused for it) the mask is exactly the unbudgeted one.
  virtual void mask(std::span<float> logits, int64_t tokens_left) = 0;
  void mask(std::span<float> logits) { mask(logits, kNoBudget); }
  // The sampled token (it was allowed by the last mask).
  virtual void advance(int32_t token) = 0;
  // The output is a complete value and nothing may follow: the generation stops here.
  virtual bool complete() const = 0;
  // The output so far is a complete value (more could follow, e.g. digits of a number).
  virtual bool may_end() const = 0;
  // Seconds spent in mask() and advance() so far.
  virtual double seconds() const = 0;
};

class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  // `end_tokens` (e.g. end-of-sentence) are allowed exactly where the output may end.
  virtual std::unique_ptr<ConstrainedRun> begin(std::span<const int32_t> end_tokens) const = 0;
  // Fewest tokens of a complete output (counting one per byte and the end token where the
  // output could go on): a generation needs max_tokens at least this.
  virtual int64_t min_tokens() const = 0;
};

}  // namespace dsv4
