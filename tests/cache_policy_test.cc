// Cache policies replayed on a recorded trace of the skewed synthetic checkpoint (dsv4 synth
// --routing-skew real, 43 layers x 256 experts, 136 decode tokens; docs/benchmarks.md): the
// frequency policy against LRU and Belady at 7, 12 and 17.5 % of the experts cached.
// Deterministic replay, no timing.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dsv4/bench/expert_trace.h"

namespace dsv4 {
namespace {

TEST(CachePolicy, FrequencyAgainstLruOnSkewedTrace) {
  const std::vector<ExpertEvent> trace = load_trace(std::string(DSV4_SOURCE_DIR) + "/tests/data/skewed_routing_trace.txt");
  const int experts = 256, layers = 43, hash_layers = 3;
  // What the policy reaches today (freq 0.496 / 0.642 / 0.697 against LRU 0.450 / 0.626 / 0.703):
  // short of issue 48's LRU + 5 points and 0.9 x Belady; these bounds guard against regressions.
  const struct { double frac, margin; } sizes[] = {{0.07, 0.03}, {0.12, 0.01}, {0.175, -0.01}};
  for (const auto& [frac, margin] : sizes) {
    const int64_t slots = static_cast<int64_t>(frac * experts * layers + 0.5);
    const double lru = simulate_hit_rate(trace, experts, slots, "lru", 1, hash_layers);
    const double opt = simulate_hit_rate(trace, experts, slots, "opt", 1, hash_layers);
    const double freq = simulate_hit_rate(trace, experts, slots, "freq", 1, hash_layers);
    std::printf("%5.1f %% cached (%lld slots): freq %.3f  lru %.3f  opt %.3f\n", 100 * frac,
                static_cast<long long>(slots), freq, lru, opt);
    EXPECT_LE(freq, opt);
    EXPECT_GE(freq, lru + margin) << "at " << frac;
  }
}

}  // namespace
}  // namespace dsv4
