#include "dsv4/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dsv4/util/portable_math.h"

namespace dsv4 {

Rope::Rope(int rope_dim, double theta, const YarnConfig& yarn) : rope_dim_(rope_dim) {
  const int half = rope_dim / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  // float32 arithmetic, as the reference builds its tables: base^(2i/dim), then 1/that.
  std::vector<float> pos_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(rope_dim);
    pos_freq[i] = portable::pow(static_cast<float>(theta), exponent);
    inv_freq_[i] = 1.0f / pos_freq[i];
  }
  if (!yarn.enabled) return;

  // YaRN: keep high-frequency pairs (few rotations over the original context), divide
  // low-frequency pairs by `factor`, blend linearly between the correction dims.
  auto correction_dim = [&](double rotations) {
    return rope_dim * portable::log(static_cast<double>(yarn.original_max_position) / (rotations * 2 * std::numbers::pi)) /
           (2 * portable::log(theta));
  };
  double low = std::max(0.0, std::floor(correction_dim(yarn.beta_fast)));
  double high = std::min(static_cast<double>(rope_dim - 1), std::ceil(correction_dim(yarn.beta_slow)));
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    float ramp = static_cast<float>((i - low) / (high - low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    float extrapolation = 1.0f - ramp;
    float interpolated = 1.0f / (static_cast<float>(yarn.factor) * pos_freq[i]);
    inv_freq_[i] = interpolated * (1.0f - extrapolation) + inv_freq_[i] * extrapolation;
  }
}

void Rope::angles(int64_t pos, float* cos, float* sin) const {
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    float angle = inv_freq_[i] * p;  // one float32 rounding, as the reference
    cos[i] = static_cast<float>(portable::cos(static_cast<double>(angle)));
    sin[i] = static_cast<float>(portable::sin(static_cast<double>(angle)));
  }
}

void Rope::rotate(float* v, int width, const float* cos, const float* sin, bool inverse) const {
  float* r = v + (width - rope_dim_);
  for (int i = 0; i < rope_dim_ / 2; ++i) {
    float c = cos[i], s = inverse ? -sin[i] : sin[i];
    float re = r[2 * i], im = r[2 * i + 1];
    r[2 * i] = re * c - im * s;
    r[2 * i + 1] = re * s + im * c;
  }
}

}  // namespace dsv4
