// Rotary position embedding on the trailing `rope_dim` dims of a vector, interleaved pairs:
// (v[2i], v[2i+1]) of that slice is the complex number v[2i] + j·v[2i+1], multiplied by
// exp(j·pos·freq_i). Sliding-only layers use rope_theta; compressed layers use
// compress_rope_theta with YaRN (frequencies beyond the correction range divided by factor).
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/io/config.h"

namespace dsv4 {

// cos/sin of pos·freq_i for one position, computed once and reused for every head.
struct RopeAngles {
  std::vector<float> cos, sin;
};

class Rope {
 public:
  Rope() = default;
  // Plain RoPE, or YaRN-scaled when `yarn.enabled`.
  Rope(int rope_dim, double theta, const YarnConfig& yarn);

  static Rope for_layer(const ModelConfig& c, const LayerSpec& l);

  int dim() const { return rope_dim_; }
  RopeAngles angles(int64_t pos) const;
  // Rotates the last rope_dim entries of v[0..width) by +pos (inverse=false) or -pos.
  void rotate(float* v, int width, const RopeAngles& a, bool inverse = false) const;
  void apply(float* v, int width, int64_t pos, bool inverse = false) const { rotate(v, width, angles(pos), inverse); }

  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  int rope_dim_ = 0;
  std::vector<float> inv_freq_;  // rope_dim/2 entries, float32 as the reference computes them
};

}  // namespace dsv4
