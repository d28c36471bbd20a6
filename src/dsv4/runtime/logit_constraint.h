// What the generator needs from constrained decoding (src/dsv4/constrain/ implements it):
// before each draw the tokens that cannot continue a valid output get a logit of -inf, so
// every sampler setting (greedy, temperature, top-k/p, min-p, repetition penalty) works
// unchanged on what is left; after the draw the constraint advances by the chosen token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace dsv4 {

// One generation's progress through a constraint.
class ConstrainedRun {
 public:
  virtual ~ConstrainedRun() = default;
  // Sets the logit of every token that cannot come next to -inf. At least one token always
  // stays allowed (the constraint never reaches a dead end).
  virtual void mask(std::span<float> logits) = 0;
  // The sampled token (it was allowed by the last mask).
  virtual void advance(int32_t token) = 0;
  // The output is a complete value and nothing may follow: the generation stops here.
  virtual bool complete() const = 0;
  // Seconds spent in mask() and advance() so far.
  virtual double seconds() const = 0;
};

class LogitConstraint {
 public:
  virtual ~LogitConstraint() = default;
  // `end_tokens` (e.g. end-of-sentence) are allowed exactly where the output may end.
  virtual std::unique_ptr<ConstrainedRun> begin(std::span<const int32_t> end_tokens) const = 0;
};

}  // namespace dsv4
