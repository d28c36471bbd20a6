#include "dsv4/experts/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsv4/runtime/settings.h"
#include "dsv4/util/error.h"

namespace dsv4 {

CachePolicyKind parse_cache_policy(const std::string& text) {
  if (text == "lru") return CachePolicyKind::kLru;
  if (text == "freq") return CachePolicyKind::kFreq;
  fail("--cache-policy: \"{}\" is not a cache policy (lru or freq)", text);
}

const char* cache_policy_name(CachePolicyKind kind) { return kind == CachePolicyKind::kLru ? "lru" : "freq"; }

CachePolicyKind default_cache_policy() { return parse_cache_policy(setting_default<std::string>("cache_policy")); }

CachePolicy::CachePolicy(CachePolicyKind kind, int64_t slots, const CachePolicyShape& shape)
    : kind_(kind), shape_(shape), prio_(static_cast<size_t>(std::max<int64_t>(0, slots))) {
  if (kind_ == CachePolicyKind::kFreq) {
    half_life_ = 4.0 * std::max(1, shape.layers) * std::max(1, shape.experts_per_token);
    value_.assign(static_cast<size_t>(std::max(0, shape.layers)) * static_cast<size_t>(std::max(0, shape.experts)),
                  -std::numeric_limits<double>::infinity());
  }
}

int32_t CachePolicy::tier_of(int32_t key) const {
  return kind_ == CachePolicyKind::kFreq && key / std::max(1, shape_.experts) < shape_.hash_layers ? 0 : 1;
}

double CachePolicy::value_if_used_now(int32_t key) const {
  const double now = static_cast<double>(clock_) / half_life_;
  const double v = value_[static_cast<size_t>(key)];
  if (std::isinf(v)) return now;
  return std::max(v, now) + std::log2(1.0 + std::exp2(-std::abs(v - now)));
}

void CachePolicy::loaded(int slot, int32_t key) {
  // Read for a request still to come (prefetch, expect, a guess): as protected as a
  // learned-routed expert used now, also in a hash layer, so a read is not evicted before
  // the acquire it was made for (an expected hash-layer expert would otherwise go first).
  Priority& p = prio_[static_cast<size_t>(slot)];
  p.tier = 1;
  p.value = kind_ == CachePolicyKind::kLru ? static_cast<double>(++clock_) : value_if_used_now(key);
}

void CachePolicy::used(int slot, int32_t key) {
  Priority& p = prio_[static_cast<size_t>(slot)];
  p.tier = tier_of(key);
  if (kind_ == CachePolicyKind::kLru) {
    p.value = static_cast<double>(++clock_);
  } else {
    p.value = value_[static_cast<size_t>(key)] = value_if_used_now(key);
    ++clock_;
  }
}

void CachePolicy::released(int slot) {
  if (kind_ == CachePolicyKind::kLru) prio_[static_cast<size_t>(slot)].value = static_cast<double>(++clock_);
}

void CachePolicy::demoted(int slot) { prio_[static_cast<size_t>(slot)] = {kDemotedTier, 0}; }

void CachePolicy::freed(int slot) { prio_[static_cast<size_t>(slot)] = {kFreeTier, 0}; }

}  // namespace dsv4
