// Elementary functions that give the same bits on every OS, compiler and libm.
//
// The C libraries disagree in the last bit of exp, log, sin, cos and pow (glibc's are
// nearly correctly rounded, MinGW's and others' are not), and the forward pass calls them
// for softmax, RoPE, gates and the router: one differing bit there changes the logits
// across platforms. These are built only from IEEE-754 operations that every conforming
// platform rounds the same way (+ − × ÷, nearbyint, ldexp, frexp; the build sets
// -ffp-contract=off so nothing is fused): range reduction, then a fixed polynomial in double
// precision. The double results are within a few ulps of the true value
// (tests/portable_math_test.cc measures them); the float ones,
// rounded once from them, are correctly rounded but for inputs within ~1e-16 of a tie.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace dsv4::portable {

namespace detail {

// 2^(j/32), j = 0 .. 31, correctly rounded.
inline constexpr double kExp2Table[32] = {
    0x1.0000000000000p+0,
    0x1.059b0d3158574p+0,
    0x1.0b5586cf9890fp+0,
    0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0,
    0x1.1d4873168b9aap+0,
    0x1.2387a6e756238p+0,
    0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0,
    0x1.371a7373aa9cbp+0,
    0x1.3dea64c123422p+0,
    0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0,
    0x1.5342b569d4f82p+0,
    0x1.5ab07dd485429p+0,
    0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0,
    0x1.71f75e8ec5f74p+0,
    0x1.7a11473eb0187p+0,
    0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0,
    0x1.93737b0cdc5e5p+0,
    0x1.9c49182a3f090p+0,
    0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0,
    0x1.b7f76f2fb5e47p+0,
    0x1.c199bdd85529cp+0,
    0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0,
    0x1.dfc97337b9b5fp+0,
    0x1.ea4afa2a490dap+0,
    0x1.f50765b6e4540p+0,
};

}  // namespace detail

// e^x. |error| < 2 ulps. x = (32m + j)·ln2/32 + r with |r| <= ln2/64, so
// e^x = 2^m · 2^(j/32) · e^r; e^r by its Taylor series to r^7 (the next term is below 2^-60).
// No libm calls: the rounding to an integer is the 1.5·2^52 trick, 2^m is built from its bits.
inline double exp(double x) {
  if (std::isnan(x)) return x;
  if (x >= 709.782712893384) return std::numeric_limits<double>::infinity();
  if (x < -708.0) {
    if (x < -745.2) return 0.0;
    return exp(x + 512 * 6.93147180559945286227e-01) * 0x1p-512;  // a subnormal result
  }
  constexpr double kInvLn2x32 = 4.61662413084468283841e+01;  // 32 / ln 2
  constexpr double kLn2x32Hi = 6.93147180369123816490e-01 / 32;  // 32 significant bits: k·it is exact
  constexpr double kLn2x32Lo = 1.90821492927058770002e-10 / 32;
  constexpr double kShift = 0x1.8p52;  // adding it rounds to an integer (|value| < 2^51)
  const double kd = (x * kInvLn2x32 + kShift) - kShift;
  const int64_t k = static_cast<int64_t>(kd);
  const double r = (x - kd * kLn2x32Hi) - kd * kLn2x32Lo;  // |r| <= 0.0109
  double p = 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const int64_t m = k >> 5;  // floor(k / 32), -1022 <= m <= 1024
  if (m > 1023) return p * detail::kExp2Table[k & 31] * 0x1p1023 * 2.0;  // may overflow to +inf
  const double scale = std::bit_cast<double>(static_cast<uint64_t>(m + 1023) << 52);
  return p * detail::kExp2Table[k & 31] * scale;
}

// Natural logarithm. |error| < 3 ulps.
inline double log(double x) {
  if (std::isnan(x) || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  int e = 0;
  double m = std::frexp(x, &e);  // x = m · 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752440) m *= 2, e -= 1;  // m in [1/√2, √2)
  const double f = m - 1.0;   // exact
  const double s = f / (2.0 + f);  // log(1 + f) = 2 atanh(s), |s| <= 0.1716
  const double s2 = s * s;
  double p = 1.0 / 25.0;
  for (int n = 23; n >= 1; n -= 2) p = p * s2 + 1.0 / n;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double k = e;
  return k * kLn2Hi + (2.0 * s * p + k * kLn2Lo);
}

// log(1 + x), accurate for small x (the factor corrects the rounding of 1 + x). < 4 ulps.
inline double log1p(double x) {
  const double u = 1.0 + x;
  if (u == 1.0) return x;
  if (std::isinf(u)) return u;
  return log(u) * (x / (u - 1.0));
}

// base^exponent for base > 0 (log's error times |exponent · log base|).
inline double pow(double base, double exponent) { return exp(exponent * log(base)); }

namespace detail {

// sin(r) and cos(r) for |r| <= π/4 (+ a little): Taylor series to r^21 / 21! and r^20 / 20!.
inline double sin_kernel(double r) {
  const double r2 = r * r;
  double p = -1.0 / 51090942171709440000.0;
  p = p * r2 + 1.0 / 121645100408832000.0;
  p = p * r2 - 1.0 / 355687428096000.0;
  p = p * r2 + 1.0 / 1307674368000.0;
  p = p * r2 - 1.0 / 6227020800.0;
  p = p * r2 + 1.0 / 39916800.0;
  p = p * r2 - 1.0 / 362880.0;
  p = p * r2 + 1.0 / 5040.0;
  p = p * r2 - 1.0 / 120.0;
  p = p * r2 + 1.0 / 6.0;
  return r - r * r2 * p;  // r - r^3/6 + ...
}

inline double cos_kernel(double r) {
  const double r2 = r * r;
  double p = 1.0 / 2432902008176640000.0;
  p = p * r2 - 1.0 / 6402373705728000.0;
  p = p * r2 + 1.0 / 20922789888000.0;
  p = p * r2 - 1.0 / 87178291200.0;
  p = p * r2 + 1.0 / 479001600.0;
  p = p * r2 - 1.0 / 3628800.0;
  p = p * r2 + 1.0 / 40320.0;
  p = p * r2 - 1.0 / 720.0;
  p = p * r2 + 1.0 / 24.0;
  p = p * r2 - 0.5;
  return 1.0 + r2 * p;
}

// x = k·π/2 + r; returns r and the quadrant k mod 4. π/2 in three 33-bit parts, so each
// k·part is exact for |k| < 2^20 (|x| < 1.6e6, every RoPE angle of a 1M context); beyond that
// the reduction loses accuracy but stays deterministic.
inline double reduce_half_pi(double x, int* quadrant) {
  constexpr double kTwoOverPi = 6.36619772367581382433e-01;
  constexpr double kPio2_1 = 1.57079632673412561417e+00;
  constexpr double kPio2_2 = 6.07710050630396597660e-11;
  constexpr double kPio2_3 = 2.02226624871116645580e-21;
  const double k = std::nearbyint(x * kTwoOverPi);
  const double r = ((x - k * kPio2_1) - k * kPio2_2) - k * kPio2_3;
  const double q = k - 4.0 * std::floor(k * 0.25);  // exact: k is an integer
  *quadrant = static_cast<int>(q);
  return r;
}

}  // namespace detail

// sin and cos: < 3 ulps where the result is not near 0.
inline double sin(double x) {
  if (!std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  int q = 0;
  const double r = detail::reduce_half_pi(x, &q);
  switch (q) {
    case 0: return detail::sin_kernel(r);
    case 1: return detail::cos_kernel(r);
    case 2: return -detail::sin_kernel(r);
    default: return -detail::cos_kernel(r);
  }
}

inline double cos(double x) {
  if (!std::isfinite(x)) return std::numeric_limits<double>::quiet_NaN();
  int q = 0;
  const double r = detail::reduce_half_pi(x, &q);
  switch (q) {
    case 0: return detail::cos_kernel(r);
    case 1: return -detail::sin_kernel(r);
    case 2: return -detail::cos_kernel(r);
    default: return detail::sin_kernel(r);
  }
}

// Float versions: one rounding from the double result.
inline float exp(float x) { return static_cast<float>(exp(static_cast<double>(x))); }
inline float log(float x) { return static_cast<float>(log(static_cast<double>(x))); }
inline float log1p(float x) { return static_cast<float>(log1p(static_cast<double>(x))); }
inline float pow(float base, float exponent) {
  return static_cast<float>(pow(static_cast<double>(base), static_cast<double>(exponent)));
}

}  // namespace dsv4::portable
