// Rotary position embedding on the trailing `rope_dim` dims of a vector, interleaved pairs:
// (v[2i], v[2i+1]) of that slice is the complex number v[2i] + j·v[2i+1], multiplied by
// exp(j·pos·freq_i). Sliding-only layers use rope_theta; compressed layers use
// compress_rope_theta with YaRN (frequencies beyond the correction range divided by factor).
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/io/config.h"

namespace dsv4 {

class Rope {
 public:
  Rope() = default;
  // Plain RoPE, or YaRN-scaled when `yarn.enabled`. A model has two: sliding-only layers use
  // (rope_theta, no YaRN), compressed layers (compress_rope_theta, YaRN).
  Rope(int rope_dim, double theta, const YarnConfig& yarn);

  int dim() const { return rope_dim_; }
  int pairs() const { return rope_dim_ / 2; }
  // cos / sin of pos·freq_i for i < pairs(): computed once per position, shared by every head.
  void angles(int64_t pos, float* cos, float* sin) const;
  // Rotates the last dim() entries of v[0..width) by the angles (inverse: by their negation).
  void rotate(float* v, int width, const float* cos, const float* sin, bool inverse = false) const;

 private:
  int rope_dim_ = 0;
  std::vector<float> inv_freq_;  // pairs() entries, float32 as the reference computes them
};

}  // namespace dsv4
