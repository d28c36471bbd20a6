// portable_math.h: accurate (against the C library in long double) and the same bits on every
// platform (a checksum of its outputs that the Linux, aarch64 and Windows test binaries share).
#include "dsv4/util/portable_math.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace dsv4 {
namespace {

// Distance in units in the last place between two finite doubles of the same sign.
double ulps(double got, long double want) {
  const double w = static_cast<double>(want);
  if (got == w) return 0;
  const double ulp = std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

// sin and cos in long double with a reduction of our own: the C library's long double sin is
// not accurate for large arguments everywhere (MinGW's is the x87 fsin, 8000 ulps off at 1e6).
// π/2 in 30-bit parts, so k · part is exact in long double for |k| < 2^34.
long double reference_sin_cos(double x, bool want_cos) {
  const long double k = std::nearbyint(static_cast<long double>(x) * 0.636619772367581343075535053490057448L);
  const long double r = ((static_cast<long double>(x) - k * 0x1.921fb54p+0L) - k * 0x1.10b46118p-30L) - k * 0x1.313198ap-61L;
  const int q = static_cast<int>(k - 4 * std::floor(k / 4)) + (want_cos ? 1 : 0);
  switch (q % 4) {
    case 0: return std::sin(r);
    case 1: return std::cos(r);
    case 2: return -std::sin(r);
    default: return -std::cos(r);
  }
}

std::vector<double> inputs(double lo, double hi, int n, uint32_t seed) {
  std::mt19937_64 rng(seed);  // its output is fixed by the standard; the distributions' are not
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = lo + (hi - lo) * std::ldexp(static_cast<double>(rng() >> 11), -53);
  return v;
}

TEST(PortableMath, DoubleFunctionsAreWithinAFewUlps) {
  double worst_exp = 0, worst_log = 0, worst_sin = 0, worst_cos = 0;
  for (double x : inputs(-700, 700, 20000, 1)) worst_exp = std::max(worst_exp, ulps(portable::exp(x), std::exp((long double)x)));
  for (double x : inputs(-30, 30, 20000, 2)) worst_exp = std::max(worst_exp, ulps(portable::exp(x), std::exp((long double)x)));
  for (double x : inputs(1e-300, 1e300, 20000, 3)) worst_log = std::max(worst_log, ulps(portable::log(x), std::log((long double)x)));
  for (double x : inputs(0.5, 2.0, 20000, 4)) {
    if (std::fabs(x - 1) < 1e-3) continue;  // log near 1 is tested by log1p
    worst_log = std::max(worst_log, ulps(portable::log(x), std::log((long double)x)));
  }
  // RoPE angles: float positions times inverse frequencies, up to a 1M-token context.
  // Near a zero of sin or cos the relative error says little; those are left out.
  for (double lo_hi : {1.5e6, 4.0}) {
    for (double x : inputs(-lo_hi, lo_hi, 20000, 5)) {
      const long double s = reference_sin_cos(x, false), c = reference_sin_cos(x, true);
      if (std::fabs(s) > 1e-3) worst_sin = std::max(worst_sin, ulps(portable::sin(x), s));
      if (std::fabs(c) > 1e-3) worst_cos = std::max(worst_cos, ulps(portable::cos(x), c));
    }
  }
  EXPECT_LE(worst_exp, 2.0);
  EXPECT_LE(worst_log, 3.0);
  EXPECT_LE(worst_sin, 3.0);
  EXPECT_LE(worst_cos, 3.0);
  for (double x : inputs(-1e-6, 1e-6, 2000, 7)) EXPECT_LE(ulps(portable::log1p(x), std::log1p((long double)x)), 4.0) << x;
  for (double x : inputs(-0.5, 1e6, 2000, 8)) EXPECT_LE(ulps(portable::log1p(x), std::log1p((long double)x)), 4.0) << x;
  // pow is exp(e · log b): log's error grows by |e · log b| (6.9 here).
  EXPECT_LE(ulps(portable::pow(10000.0, 0.75), std::pow(10000.0L, 0.75L)), 10.0);
}

TEST(PortableMath, EdgeCases) {
  EXPECT_EQ(portable::exp(0.0), 1.0);
  EXPECT_EQ(portable::exp(-1000.0), 0.0);
  EXPECT_TRUE(std::isinf(portable::exp(1000.0)));
  EXPECT_TRUE(std::isnan(portable::exp(NAN)));
  EXPECT_EQ(portable::exp(-std::numeric_limits<float>::infinity()), 0.0f);  // softmax of a masked -inf
  EXPECT_EQ(portable::log(1.0), 0.0);
  EXPECT_TRUE(std::isinf(portable::log(0.0)) && portable::log(0.0) < 0);
  EXPECT_TRUE(std::isnan(portable::log(-1.0)));
  EXPECT_EQ(portable::sin(0.0), 0.0);
  EXPECT_EQ(portable::cos(0.0), 1.0);
  EXPECT_TRUE(std::isnan(portable::sin(INFINITY)));
  EXPECT_EQ(portable::log1p(0.0), 0.0);
}

// Floats are one rounding of the double result: equal to the correctly rounded value except
// near a tie, and never more than one ulp away.
TEST(PortableMath, FloatFunctionsAreCorrectlyRoundedButForTies) {
  int differ = 0, total = 0;
  for (double d : inputs(-87, 88, 100000, 9)) {
    ++total;
    const float x = static_cast<float>(d);
    const float got = portable::exp(x), want = static_cast<float>(std::exp(static_cast<long double>(x)));
    if (got != want) {
      ++differ;
      EXPECT_EQ(std::fabs(std::nextafter(want, got) - got), 0.0f) << x;
    }
  }
  EXPECT_LE(differ, total / 10000) << differ << " of " << total;
}

// The same inputs give the same bits everywhere: this checksum is the one the x86-64 Linux
// build computes, and the Windows (MinGW, under wine) and aarch64 (qemu) test binaries
// assert it too. A libm call slipping in, or a fused multiply-add, changes it.
TEST(PortableMath, SameBitsOnEveryPlatform) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](double v) {
    h ^= std::bit_cast<uint64_t>(v);
    h *= 1099511628211ull;
  };
  for (double x : inputs(-100, 100, 4000, 11)) mix(portable::exp(x));
  for (double x : inputs(1e-30, 1e30, 4000, 12)) mix(portable::log(x));
  for (double x : inputs(-1, 1e3, 4000, 13)) mix(portable::log1p(x));
  for (double x : inputs(-2e6, 2e6, 4000, 14)) mix(portable::sin(x)), mix(portable::cos(x));
  for (double x : inputs(-90, 90, 4000, 15)) mix(portable::exp(static_cast<float>(x)));
  for (int i = 0; i < 64; ++i) mix(portable::pow(10000.0f, static_cast<float>(2 * i) / 128.0f));
  EXPECT_EQ(h, 0xa7bf1b57d8eeb564ull) << std::hex << "checksum 0x" << h;
}

}  // namespace
}  // namespace dsv4
