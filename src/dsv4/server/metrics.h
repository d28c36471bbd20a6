// Server metrics in the Prometheus text format (version 0.0.4): requests by endpoint and
// status, tokens in and out, time-to-first-token and decode-rate histograms, the routed-expert
// cache (requests, hits, bytes read) and the scheduler (queue depth, prefix cache). Counters
// are updated from the HTTP threads and the generation worker, so everything is guarded by one
// mutex (a few updates per request: contention is irrelevant).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/runtime/generator.h"

namespace dsv4::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Lines "<name>_bucket{le=…} n", "<name>_sum", "<name>_count".
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the scheduler reports at scrape time.
struct SchedulerGauges {
  size_t queue_depth = 0;
  bool running = false;
  size_t cache_entries = 0;
  uint64_t cache_bytes = 0;
  size_t running_count = 0;  // slots generating now
  size_t slots = 1;          // --parallel
};

class Metrics {
 public:
  Metrics();

  // endpoint: a fixed route name (never a raw client path, which would explode the label set).
  void count_request(const std::string& endpoint, int status);
  // One finished generation. ttft_s is measured from the request's arrival (queue included).
  void observe_generation(const GenerationStats& s, double ttft_s, double queue_s, FinishReason finish);
  void count_rejected();       // 429: queue full
  // Connections: open now, and refused at accept because the server had max_connections.
  void connection_opened();
  void connection_closed();
  void count_refused_connection();
  void count_cache_lookup(bool hit);
  // Totals of the expert provider, snapshotted by the worker (providers are not thread-safe).
  void set_expert_stats(const ExpertStats& s);

  std::string render(const SchedulerGauges& g) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finishes_;
  uint64_t prompt_tokens_ = 0, reused_tokens_ = 0, generated_tokens_ = 0, generations_ = 0;
  uint64_t decode_passes_ = 0, drafted_tokens_ = 0, accepted_tokens_ = 0;  // speculative decoding
  uint64_t rejected_ = 0, cache_hits_ = 0, cache_misses_ = 0;
  uint64_t open_connections_ = 0, refused_connections_ = 0;
  Histogram ttft_, decode_rate_, queue_wait_;
  ExpertStats experts_;
};

}  // namespace dsv4::server
