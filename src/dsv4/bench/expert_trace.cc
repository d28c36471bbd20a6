#include "dsv4/platform/platform.h"
#include "dsv4/bench/expert_trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "dsv4/experts/cache_policy.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

using Clock = std::chrono::steady_clock;

void busy_wait(double seconds) {
  if (seconds <= 0) return;
  const auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < until) {
  }
}

}  // namespace

void TracingProvider::prefetch(int layer, std::span<const int> experts) {
  record({ExpertEvent::Kind::kPrefetch, layer, {experts.begin(), experts.end()}});
  inner_->prefetch(layer, experts);
}

void TracingProvider::predict(int layer, std::span<const int> experts) {
  record({ExpertEvent::Kind::kPredict, layer, {experts.begin(), experts.end()}});
  inner_->predict(layer, experts);
}

void TracingProvider::expect(int layer, std::span<const int> experts) {
  record({ExpertEvent::Kind::kExpect, layer, {experts.begin(), experts.end()}});
  inner_->expect(layer, experts);
}

const ExpertWeights& TracingProvider::acquire(int layer, int expert) {
  record({ExpertEvent::Kind::kAcquire, layer, {expert}});
  return inner_->acquire(layer, expert);
}

void TracingProvider::release(int layer, int expert) {
  record({ExpertEvent::Kind::kRelease, layer, {expert}});
  inner_->release(layer, expert);
}

void save_trace(const std::string& path, const std::vector<ExpertEvent>& events) {
  FILE* f = platform::fopen_utf8(path, "w");
  if (!f) fail("{}: cannot create", path);
  static const char kKinds[] = "PFARTE";
  for (const ExpertEvent& e : events) {
    std::string line = fmt::format("{} {} ", kKinds[static_cast<int>(e.kind)], e.layer);
    for (size_t i = 0; i < e.experts.size(); ++i) line += fmt::format("{}{}", i ? "," : "", e.experts[i]);
    line += '\n';
    std::fputs(line.c_str(), f);
  }
  if (std::fclose(f) != 0) fail("{}: write failed", path);
}

std::vector<ExpertEvent> load_trace(const std::string& path) {
  std::ifstream in(platform::fs_path(path));
  if (!in) fail("{}: cannot open", path);
  std::vector<ExpertEvent> events;
  std::string kind, list;
  int layer;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    if (!(ls >> kind >> layer)) fail("{}: bad trace line \"{}\"", path, line);
    ExpertEvent e;
    const size_t k = std::string("PFARTE").find(kind);
    if (kind.size() != 1 || k == std::string::npos) fail("{}: bad trace event \"{}\"", path, kind);
    e.kind = static_cast<ExpertEvent::Kind>(k);
    e.layer = layer;
    if (ls >> list) {
      std::istringstream ids(list);
      std::string id;
      while (std::getline(ids, id, ',')) e.experts.push_back(std::stoi(id));
    }
    events.push_back(std::move(e));
  }
  return events;
}

ReplayResult replay_trace(const Checkpoint& ck, const std::vector<ExpertEvent>& events,
                          const ExpertStoreOptions& options, const ComputeModel& compute, int first_timed_token) {
  const int last_layer = ck.config().num_layers - 1;
  ExpertStore store(ck, options);
  ReplayResult r;
  int token = 0;
  bool timing = first_timed_token == 0;
  Clock::time_point start = Clock::now();
  ExpertStats before = store.stats();
  auto spend = [&](double s) {
    if (!timing) return;
    busy_wait(s);
    r.compute_seconds += s;
  };
  for (const ExpertEvent& e : events) {
    switch (e.kind) {
      case ExpertEvent::Kind::kPredict:
        // The engine guesses layer l after layer l-1's attention; layer 0 at the start.
        if (e.layer > 0) spend(compute.layer_dense_s);
        store.predict(e.layer, e.experts);
        break;
      case ExpertEvent::Kind::kExpect:  // issued where a token's experts become known
        store.expect(e.layer, e.experts);
        break;
      case ExpertEvent::Kind::kPrefetch:
        if (e.layer == last_layer) spend(compute.layer_dense_s);  // the last attention has no guess after it
        store.prefetch(e.layer, e.experts);
        break;
      case ExpertEvent::Kind::kAcquire:
        store.acquire(e.layer, e.experts[0]);
        spend(compute.expert_s);
        break;
      case ExpertEvent::Kind::kRelease:
        store.release(e.layer, e.experts[0]);
        break;
      case ExpertEvent::Kind::kTokenEnd:
        spend(compute.head_s);
        if (timing) ++r.tokens;
        if (++token == first_timed_token) {
          timing = true;
          start = Clock::now();
          before = store.stats();
        }
        break;
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.stats = store.stats() - before;
  return r;
}

namespace {

// The store's own decisions (CachePolicy) on the trace's acquires and releases, without
// reads: a missing expert takes the policy's victim among unpinned slots at once. A trace
// without releases (the synthetic skewed one) pins nothing.
double simulate_policy(const std::vector<ExpertEvent>& events, int n_experts, int64_t slots, CachePolicyKind kind,
                       int first_counted_token, int hash_layers, int experts_per_token) {
  int layers = 0;
  bool releases = false;
  for (const ExpertEvent& e : events) {
    if (e.kind == ExpertEvent::Kind::kAcquire) layers = std::max(layers, e.layer + 1);
    if (e.kind == ExpertEvent::Kind::kRelease) releases = true;
  }
  CachePolicy policy(kind, slots, CachePolicyShape{layers, n_experts, hash_layers, experts_per_token});
  std::vector<int32_t> slot_of(static_cast<size_t>(layers) * static_cast<size_t>(n_experts), -1);
  std::vector<int32_t> key_of(static_cast<size_t>(std::max<int64_t>(0, slots)), -1);
  std::vector<int> pins(key_of.size(), 0);
  uint64_t hits = 0, counted = 0;
  int token = 0;
  for (const ExpertEvent& e : events) {
    if (e.kind == ExpertEvent::Kind::kTokenEnd) ++token;
    if (e.kind != ExpertEvent::Kind::kAcquire && e.kind != ExpertEvent::Kind::kRelease) continue;
    const int32_t k = e.layer * n_experts + e.experts[0];
    int v = slot_of[static_cast<size_t>(k)];
    if (e.kind == ExpertEvent::Kind::kRelease) {
      if (v >= 0 && pins[static_cast<size_t>(v)] > 0) {
        --pins[static_cast<size_t>(v)];
        policy.released(v);
      }
      continue;
    }
    const bool count = token >= first_counted_token;
    if (count) ++counted;
    if (v >= 0) {
      if (count) ++hits;
    } else {
      v = policy.victim([&](int i) { return pins[static_cast<size_t>(i)] == 0; });
      if (v < 0) fail("cache replay: all {} slots are pinned", slots);
      if (key_of[static_cast<size_t>(v)] >= 0) slot_of[static_cast<size_t>(key_of[static_cast<size_t>(v)])] = -1;
      key_of[static_cast<size_t>(v)] = k;
      slot_of[static_cast<size_t>(k)] = v;
      policy.loaded(v, k);
    }
    policy.used(v, k);
    if (releases) ++pins[static_cast<size_t>(v)];
  }
  return counted ? double(hits) / double(counted) : 0.0;
}

}  // namespace

double simulate_hit_rate(const std::vector<ExpertEvent>& events, int n_experts, int64_t slots,
                         const std::string& policy, int first_counted_token, int hash_layers,
                         int experts_per_token) {
  if (policy == "lru" || policy == "freq")
    return simulate_policy(events, n_experts, slots, parse_cache_policy(policy), first_counted_token, hash_layers,
                           experts_per_token);
  // The acquire sequence with token numbers.
  std::vector<std::pair<int64_t, int>> seq;  // (key, token)
  int token = 0;
  for (const ExpertEvent& e : events) {
    if (e.kind == ExpertEvent::Kind::kAcquire) seq.emplace_back(int64_t(e.layer) * n_experts + e.experts[0], token);
    if (e.kind == ExpertEvent::Kind::kTokenEnd) ++token;
  }
  std::vector<size_t> next_use(seq.size(), std::numeric_limits<size_t>::max());
  if (policy == "opt") {
    std::unordered_map<int64_t, size_t> seen;
    for (size_t i = seq.size(); i-- > 0;) {
      auto it = seen.find(seq[i].first);
      if (it != seen.end()) next_use[i] = it->second;
      seen[seq[i].first] = i;
    }
  } else if (policy != "lfu") {
    fail("unknown cache policy \"{}\"", policy);
  }
  // Cached keys ordered by eviction priority (smallest evicted first).
  std::set<std::pair<std::pair<uint64_t, uint64_t>, int64_t>> order;
  std::unordered_map<int64_t, std::pair<uint64_t, uint64_t>> rank;
  std::unordered_map<int64_t, uint64_t> uses;
  uint64_t hits = 0, counted = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    const int64_t k = seq[i].first;
    const bool count = seq[i].second >= first_counted_token;
    ++uses[k];
    std::pair<uint64_t, uint64_t> key;
    if (policy == "lfu") key = {uses[k], i};
    if (policy == "opt") key = {std::numeric_limits<uint64_t>::max() - next_use[i], 0};
    auto it = rank.find(k);
    if (it != rank.end()) {
      if (count) ++hits;
      order.erase({it->second, k});
    } else if (static_cast<int64_t>(rank.size()) >= slots) {
      auto victim = order.begin();
      rank.erase(victim->second);
      order.erase(victim);
    }
    if (count) ++counted;
    rank[k] = key;
    order.insert({key, k});
  }
  return counted ? double(hits) / double(counted) : 0.0;
}

}  // namespace dsv4
