#include "dsv4/server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace dsv4::server {
namespace {

std::string number(double v) { return fmt::format("{}", v); }

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// A metric with one unlabelled sample: its header, then its value.
void sample(std::string& out, const char* name, const char* type, const char* help, uint64_t value) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, number(sum_), name, count_);
  return out;
}

Metrics::Metrics()
    : ttft_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}),
      decode_rate_({0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256}),
      queue_wait_({0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::observe_generation(const GenerationStats& s, double ttft_s, double queue_s, FinishReason finish) {
  std::lock_guard lock(mu_);
  ++generations_;
  ++finishes_[finish_reason_name(finish)];
  prompt_tokens_ += static_cast<uint64_t>(s.prompt_tokens);
  reused_tokens_ += static_cast<uint64_t>(s.reused_tokens);
  generated_tokens_ += static_cast<uint64_t>(s.generated_tokens);
  decode_passes_ += static_cast<uint64_t>(s.decode_passes);
  drafted_tokens_ += static_cast<uint64_t>(s.drafted_tokens);
  accepted_tokens_ += static_cast<uint64_t>(s.accepted_tokens);
  queue_wait_.observe(queue_s);
  if (s.generated_tokens > 0) ttft_.observe(ttft_s);
  if (s.generated_tokens > 1 && s.decode_s > 0) decode_rate_.observe(s.decode_tok_s());
}

void Metrics::connection_opened() {
  std::lock_guard lock(mu_);
  ++open_connections_;
}

void Metrics::connection_closed() {
  std::lock_guard lock(mu_);
  --open_connections_;
}

void Metrics::count_refused_connection() {
  std::lock_guard lock(mu_);
  ++refused_connections_;
}

void Metrics::count_rejected() {
  std::lock_guard lock(mu_);
  ++rejected_;
}

void Metrics::count_cache_lookup(bool hit) {
  std::lock_guard lock(mu_);
  ++(hit ? cache_hits_ : cache_misses_);
}

void Metrics::set_expert_stats(const ExpertStats& s) {
  std::lock_guard lock(mu_);
  experts_ = s;
}

std::string Metrics::render(const SchedulerGauges& g) const {
  std::lock_guard lock(mu_);
  std::string out;
  header(out, "dsv4_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : requests_)
    out += fmt::format("dsv4_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  header(out, "dsv4_generations_total", "counter", "Finished generations by finish reason.");
  for (const auto& [reason, n] : finishes_) out += fmt::format("dsv4_generations_total{{reason=\"{}\"}} {}\n", reason, n);
  sample(out, "dsv4_rejected_requests_total", "counter", "Requests refused with 429 because the queue was full.", rejected_);
  sample(out, "dsv4_connections_open", "gauge", "Open client connections.", open_connections_);
  sample(out, "dsv4_connections_refused_total", "counter",
         "Connections closed at once because the server already had its maximum of open connections.", refused_connections_);
  sample(out, "dsv4_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", prompt_tokens_);
  sample(out, "dsv4_prompt_tokens_reused_total", "counter", "Prompt tokens taken from the prefix cache instead of prefilled.", reused_tokens_);
  sample(out, "dsv4_generated_tokens_total", "counter", "Generated tokens.", generated_tokens_);
  sample(out, "dsv4_decode_passes_total", "counter", "Forward passes of decoding (each verifies its drafts).", decode_passes_);
  sample(out, "dsv4_drafted_tokens_total", "counter", "Tokens drafted by speculative decoding.", drafted_tokens_);
  sample(out, "dsv4_accepted_tokens_total", "counter", "Drafted tokens that were right (kept).", accepted_tokens_);
  header(out, "dsv4_time_to_first_token_seconds", "histogram", "From request arrival to the first generated token.");
  out += ttft_.render("dsv4_time_to_first_token_seconds");
  header(out, "dsv4_decode_tokens_per_second", "histogram", "Decode rate of each generation (after the first token).");
  out += decode_rate_.render("dsv4_decode_tokens_per_second");
  header(out, "dsv4_queue_wait_seconds", "histogram", "Time requests waited for the engine.");
  out += queue_wait_.render("dsv4_queue_wait_seconds");
  sample(out, "dsv4_expert_requests_total", "counter", "Routed-expert lookups.", experts_.requests);
  sample(out, "dsv4_expert_hits_total", "counter", "Routed-expert lookups served from memory.", experts_.hits);
  header(out, "dsv4_expert_hit_rate", "gauge", "Routed-expert hits / lookups since start.");
  out += fmt::format("dsv4_expert_hit_rate {}\n",
                     number(experts_.requests ? double(experts_.hits) / double(experts_.requests) : 0.0));
  sample(out, "dsv4_expert_bytes_read_total", "counter", "Bytes of expert weights read from storage.", experts_.bytes_read);
  sample(out, "dsv4_queue_depth", "gauge", "Requests waiting for the engine.", g.queue_depth);
  sample(out, "dsv4_generation_running", "gauge", "1 while the engine is generating.", g.running ? 1u : 0u);
  sample(out, "dsv4_generations_running", "gauge", "Slots generating now (at most --parallel).", g.running_count);
  sample(out, "dsv4_slots", "gauge", "Generation slots (--parallel).", g.slots);
  header(out, "dsv4_prefix_cache_lookups_total", "counter", "Prefix cache lookups by result.");
  out += fmt::format("dsv4_prefix_cache_lookups_total{{result=\"hit\"}} {}\n", cache_hits_);
  out += fmt::format("dsv4_prefix_cache_lookups_total{{result=\"miss\"}} {}\n", cache_misses_);
  sample(out, "dsv4_prefix_cache_entries", "gauge", "Session snapshots in the prefix cache.", g.cache_entries);
  sample(out, "dsv4_prefix_cache_bytes", "gauge", "Memory held by the prefix cache.", g.cache_bytes);
  return out;
}

}  // namespace dsv4::server
