// The RAM planner: from a budget (--ram) decide what stays resident and how many expert
// cache slots exist. The dense weights are always resident; the rest of the budget, after
// a reserve for the KV state, activations and the process itself, becomes expert slots.
// When every routed expert fits, the resident provider is used (no streaming overhead).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/experts/expert_store.h"

namespace dsv4 {

class Checkpoint;

struct RamRequest {
  enum class Kind : uint8_t { kDefault, kMinimum, kBytes };
  Kind kind = Kind::kDefault;
  uint64_t bytes = 0;
  std::string text;  // as given, for messages
};

// "512M", "24G", "1.5G", "2T", "800K", "123456" (bytes), "min" or "auto" (the default share
// of available memory). Throws Error naming --ram on anything else.
RamRequest parse_ram(const std::string& text);

// What the process will do with the model: sizes the KV / activation reserve.
struct WorkloadShape {
  int64_t context_tokens = 4096;  // longest sequence a session will reach
  int64_t chunk_tokens = 512;     // largest prefill chunk
  int64_t logit_rows = 1;         // rows of [vocab] logits the caller keeps
};

struct MemoryPlan {
  uint64_t budget = 0;
  std::string budget_source;   // "--ram 12G", "--ram min", "default: 80% of 20.1 GiB available"
  uint64_t dense_bytes = 0;    // resident non-expert weights
  uint64_t reserve_bytes = 0;  // KV state + activations + process overhead
  uint64_t slot_bytes = 0;     // one expert cache slot
  int64_t total_experts = 0;
  int64_t min_slots = 0;       // smallest cache that still overlaps I/O with compute
  int64_t slots = 0;           // == total_experts when all resident
  bool all_resident = false;
  uint64_t expert_bytes = 0;   // RAM held for experts
  uint64_t minimum_budget = 0; // dense + min_slots + reserve

  uint64_t projected_peak() const { return dense_bytes + expert_bytes + reserve_bytes; }
  std::string summary() const;  // the one line printed on stderr
};

// Fixed allowance for the process itself (code, libraries, allocator slack, thread stacks).
inline constexpr uint64_t kProcessOverheadBytes = 64ull << 20;

// Throws Error naming --ram and the minimum when the budget is below one token's working
// set (dense + min_slots expert slots + reserve).
MemoryPlan plan_memory(const Checkpoint& ck, const RamRequest& ram, const WorkloadShape& workload);

// KV state and activation bytes for a workload (part of reserve_bytes).
uint64_t estimate_session_bytes(const ModelConfig& c, int64_t context_tokens);
uint64_t estimate_activation_bytes(const ModelConfig& c, const WorkloadShape& w);

// One line for stderr: "dsv4: stats: experts N requests, H% hits, ...; peak RSS X".
std::string stats_line(const ExpertStats& s, uint64_t peak_rss);

// The provider the plan calls for: resident experts, or an ExpertStore with plan.slots.
std::unique_ptr<ExpertProvider> make_planned_provider(const Checkpoint& ck, const MemoryPlan& plan,
                                                      ExpertStoreOptions store);

}  // namespace dsv4
