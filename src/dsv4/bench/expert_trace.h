// Recording and replaying the engine's expert requests, for measuring the I/O side apart
// from the kernels: a recorded trace (predict / prefetch / acquire / release, in order) is
// replayed against a fresh ExpertStore with a synthetic compute model standing in for the
// forward pass, so the overlap of reads and compute can be measured at any compute speed.
// Also simulates cache policies offline on the trace's acquire sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/experts/expert_store.h"

namespace dsv4 {

struct ExpertEvent {
  enum class Kind : uint8_t { kPredict, kPrefetch, kAcquire, kRelease, kTokenEnd, kExpect };
  Kind kind;
  int layer = 0;
  std::vector<int> experts;  // predict / prefetch: the list; acquire / release: one id
};

// Forwards every call to `inner` and records it.
class TracingProvider final : public ExpertProvider {
 public:
  explicit TracingProvider(std::unique_ptr<ExpertProvider> inner) : inner_(std::move(inner)) {}
  void prefetch(int layer, std::span<const int> experts) override;
  void predict(int layer, std::span<const int> experts) override;
  void expect(int layer, std::span<const int> experts) override;
  bool wants_predictions() const override { return inner_->wants_predictions(); }
  int64_t capacity() const override { return inner_->capacity(); }
  bool ready(int layer, int expert) const override { return inner_->ready(layer, expert); }
  const ExpertWeights& acquire(int layer, int expert) override;
  void release(int layer, int expert) override;
  ExpertStats stats() const override { return inner_->stats(); }
  uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  std::string storage_problem() override { return inner_->storage_problem(); }

  void mark_token_end() { record({ExpertEvent::Kind::kTokenEnd, 0, {}}); }
  // Off: calls are only forwarded (a long soak would otherwise grow the trace without end).
  void set_recording(bool on) { recording_ = on; }
  const std::vector<ExpertEvent>& events() const { return events_; }
  ExpertProvider& inner() { return *inner_; }

 private:
  void record(ExpertEvent e) {
    if (recording_) events_.push_back(std::move(e));
  }

  std::unique_ptr<ExpertProvider> inner_;
  std::vector<ExpertEvent> events_;
  bool recording_ = true;
};

// Text form, one event per line ("P|F|A|R|T|E layer e,e,..."), to replay a trace later.
void save_trace(const std::string& path, const std::vector<ExpertEvent>& events);
std::vector<ExpertEvent> load_trace(const std::string& path);

// Synthetic compute per token: attention + shared expert per layer, each routed expert,
// and the output head. Busy-waits (one core), like a compute thread would.
struct ComputeModel {
  double layer_dense_s = 0;
  double expert_s = 0;
  double head_s = 0;
  double per_token(int layers, int experts_per_token) const {
    return layers * (layer_dense_s + experts_per_token * expert_s) + head_s;
  }
};

struct ReplayResult {
  int tokens = 0;
  double seconds = 0;          // wall time of the timed tokens
  double compute_seconds = 0;  // synthetic compute inside them
  ExpertStats stats;           // of the timed tokens
};

// Replays `events` against a new store; tokens before `first_timed_token` (e.g. the
// prefill) run without compute to warm the cache, the rest are timed.
ReplayResult replay_trace(const Checkpoint& ck, const std::vector<ExpertEvent>& events,
                          const ExpertStoreOptions& store, const ComputeModel& compute, int first_timed_token);

// Hit rate of the trace's acquire sequence under a policy with `slots` slots, counting
// only the acquires of tokens >= first_counted_token: "lru" and "freq" are the store's own
// decisions (CachePolicy, experts/cache_policy.h; the first `hash_layers` layers are
// hash-routed), with the trace's releases unpinning (a trace without releases pins nothing);
// "lfu" (least frequently used so far, LRU among equals) and "opt" (Belady: evict the expert
// needed furthest in the future) ignore pins.
double simulate_hit_rate(const std::vector<ExpertEvent>& events, int n_experts, int64_t slots,
                         const std::string& policy, int first_counted_token, int hash_layers = 0,
                         int experts_per_token = 6);

}  // namespace dsv4
