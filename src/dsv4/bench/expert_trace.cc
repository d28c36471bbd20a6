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

// "freq": every expert keeps a decayed use count (log2 of sum over its uses of 2^(t / half_life),
// t counted in acquires; time-invariant order, so no rescan), bounded to one double per expert.
// The victim is the cached expert with the smallest value; hash-routed layers' experts (their
// reuse is chance) always go first. A newcomer enters with its own value, so an expert used
// once is the next to go and never evicts a hot one (admission by value).
double simulate_frequency(const std::vector<std::pair<int64_t, int>>& seq, int n_experts, int hash_layers,
                          int64_t slots, double half_life, int first_counted_token) {
  std::unordered_map<int64_t, double> value;  // per expert seen, cached or not
  std::set<std::pair<std::pair<int, double>, int64_t>> order;  // ((not hash, value), key) of cached experts
  std::unordered_map<int64_t, std::pair<int, double>> rank;
  uint64_t hits = 0, counted = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    const int64_t k = seq[i].first;
    const bool count = seq[i].second >= first_counted_token;
    const double now = double(i) / half_life;
    auto v = value.find(k);
    const double nv = v == value.end() ? now
                                       : std::max(v->second, now) + std::log2(1.0 + std::exp2(-std::abs(v->second - now)));
    value[k] = nv;
    const std::pair<int, double> key{k / n_experts >= hash_layers ? 1 : 0, nv};
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

}  // namespace

double simulate_hit_rate(const std::vector<ExpertEvent>& events, int n_experts, int64_t slots,
                         const std::string& policy, int first_counted_token, int hash_layers,
                         int experts_per_token) {
  // The acquire sequence with token numbers.
  std::vector<std::pair<int64_t, int>> seq;  // (key, token)
  int token = 0;
  for (const ExpertEvent& e : events) {
    if (e.kind == ExpertEvent::Kind::kAcquire) seq.emplace_back(int64_t(e.layer) * n_experts + e.experts[0], token);
    if (e.kind == ExpertEvent::Kind::kTokenEnd) ++token;
  }
  if (policy == "freq") {
    int layers = 0;
    for (const auto& [k, t] : seq) layers = std::max(layers, int(k / n_experts) + 1);
    const double half_life = 4.0 * std::max(1, layers) * std::max(1, experts_per_token);  // about 4 tokens
    return simulate_frequency(seq, n_experts, hash_layers, slots, half_life, first_counted_token);
  }
  std::vector<size_t> next_use(seq.size(), std::numeric_limits<size_t>::max());
  if (policy == "opt") {
    std::unordered_map<int64_t, size_t> seen;
    for (size_t i = seq.size(); i-- > 0;) {
      auto it = seen.find(seq[i].first);
      if (it != seen.end()) next_use[i] = it->second;
      seen[seq[i].first] = i;
    }
  } else if (policy != "lru" && policy != "lfu") {
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
    if (policy == "lru") key = {i, 0};
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
