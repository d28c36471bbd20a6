// Which cached expert the SSD expert cache gives up for a new one (--cache-policy). One class
// makes every decision, for the store (ExpertStore) and for the offline replay of a recorded
// trace (simulate_hit_rate in bench/expert_trace.h), so a replayed hit rate is what the store
// does with the same requests and slots.
//
//   lru   the least recently used (loaded, acquired or released) expert goes first.
//   freq  every expert keeps a decayed use count (log2 of the sum over its acquires of
//         2^(t / half_life), t counted in acquires, half-life about 4 tokens; the order is
//         time-invariant, so nothing is rescanned). The cached expert with the smallest
//         value goes first; hash-routed layers' experts (their reuse is chance) go before
//         any learned-routed one. A newcomer enters with its own value, so an expert used
//         once is the next to go and never evicts a hot one.
// Both: guesses that proved wrong (demoted()) go before everything, and a free slot is
// taken before any eviction. Bookkeeping is one priority per slot and, for freq, one double
// per expert, allocated once: an access is O(1), a victim is a scan of the slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class CachePolicyKind : uint8_t { kLru, kFreq };
// "lru" | "freq"; throws Error naming --cache-policy otherwise.
CachePolicyKind parse_cache_policy(const std::string& text);
const char* cache_policy_name(CachePolicyKind kind);
// The default, as the settings table declares it (--cache-policy).
CachePolicyKind default_cache_policy();

struct CachePolicyShape {
  int layers = 0, experts = 0;  // keys are layer * experts + expert
  int hash_layers = 0;          // the first hash_layers layers route by token id
  int experts_per_token = 6;    // sets freq's half-life (4 tokens of acquires)
};

class CachePolicy {
 public:
  CachePolicy(CachePolicyKind kind, int64_t slots, const CachePolicyShape& shape);

  CachePolicyKind kind() const { return kind_; }
  void loaded(int slot, int32_t key);  // a read of `key` into `slot` began
  void used(int slot, int32_t key);    // `key` in `slot` was acquired
  void released(int slot);             // ... and released
  void demoted(int slot);              // a guess nobody needed: goes first
  void freed(int slot);                // the slot holds nothing

  // The first free slot, else the slot with the lowest priority among those `ok(slot)`
  // allows (the first of equals); -1 when none.
  template <typename Ok>
  int victim(Ok&& ok) const {
    int best = -1;
    for (size_t i = 0; i < prio_.size(); ++i) {
      const Priority& p = prio_[i];
      if (p.tier == kFreeTier) return static_cast<int>(i);
      if (ok(static_cast<int>(i)) && (best < 0 || p < prio_[best])) best = static_cast<int>(i);
    }
    return best;
  }

 private:
  static constexpr int32_t kFreeTier = -2, kDemotedTier = -1;
  struct Priority {
    int32_t tier = kFreeTier;
    double value = 0;
    bool operator<(const Priority& o) const { return tier != o.tier ? tier < o.tier : value < o.value; }
  };
  int32_t tier_of(int32_t key) const;
  double value_if_used_now(int32_t key) const;

  CachePolicyKind kind_;
  CachePolicyShape shape_;
  double half_life_ = 1;
  std::vector<Priority> prio_;  // per slot
  std::vector<double> value_;   // freq: per expert, log2 of its decayed use count (-inf: never used)
  uint64_t clock_ = 0;          // lru: loads, acquires and releases; freq: acquires
};

}  // namespace dsv4
