#include "dsv4/experts/planner.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dsv4/experts/expert_layout.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/util/error.h"
#include "dsv4/util/memory.h"

namespace dsv4 {
namespace {

// Share of MemAvailable the default budget takes: the page cache, other processes and the
// kernel keep the rest.
constexpr double kDefaultShare = 0.80;

bool is_routed_expert(const std::string& name) { return name.find(".ffn.experts.") != std::string::npos; }

}  // namespace

RamRequest parse_ram(const std::string& text) {
  RamRequest r;
  r.text = text;
  if (text == "auto") return r;
  if (text == "min") {
    r.kind = RamRequest::Kind::kMinimum;
    return r;
  }
  const std::optional<uint64_t> bytes = parse_byte_size(text);
  if (!bytes) fail("--ram \"{}\": expected a size such as 512M, 24G, 1.5G, or \"min\" or \"auto\"", text);
  if (*bytes < (1u << 20)) fail("--ram \"{}\" is below 1 MiB (did you forget the unit, as in 512M?)", text);
  r.kind = RamRequest::Kind::kBytes;
  r.bytes = *bytes;
  return r;
}

uint64_t estimate_session_bytes(const ModelConfig& c, int64_t context) {
  uint64_t total = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerSpec& spec = c.layer(l);
    uint64_t floats = uint64_t(c.sliding_window) * c.head_dim;  // window ring
    if (spec.compress_ratio != 0) {
      const uint64_t coff = spec.kind == AttentionKind::kCSA ? 2 : 1;
      const uint64_t entries = static_cast<uint64_t>(context / spec.compress_ratio + 1);
      floats += entries * c.head_dim + 4ull * spec.compress_ratio * coff * c.head_dim;
      if (spec.kind == AttentionKind::kCSA) floats += entries * c.index_head_dim + 16ull * 2 * c.index_head_dim;
    }
    total += floats * 4;
  }
  return total + static_cast<uint64_t>(context) * 4;  // the token list
}

uint64_t estimate_activation_bytes(const ModelConfig& c, const WorkloadShape& w) {
  const uint64_t T = static_cast<uint64_t>(std::max<int64_t>(1, std::min(w.chunk_tokens, w.context_tokens)));
  const uint64_t D = c.hidden_size, hc = c.hc_mult, H = c.num_heads, hd = c.head_dim;
  // Live at once in the worst sub-block (attention of a CSA layer): streams and their
  // normalized copy, x/y, the query path, window kv, attention output and its groups, the
  // low-rank output, the indexer's queries and scores over the visible entries, the router
  // logits and an expert's intermediate activations. (The MoE's outputs kept per (token,
  // slot) until they are summed, K*D, live only after the attention's 3*H*hd are freed.)
  uint64_t per_token = 2 * hc * D + 4 * D + c.q_lora_rank + 3 * H * hd + uint64_t(c.o_groups) * c.o_lora_rank +
                       uint64_t(c.index_n_heads) * c.index_head_dim +
                       static_cast<uint64_t>(w.context_tokens / 4 + 1) + c.n_routed_experts +
                       2ull * c.moe_intermediate + uint64_t(c.n_experts_per_token) * 2;
  uint64_t bytes = T * per_token * 4 + uint64_t(c.sliding_window) * hd * 4;
  bytes += static_cast<uint64_t>(w.logit_rows) * (c.vocab_size + D) * 4;
  return bytes + bytes / 4;  // allocator slack
}

std::string MemoryPlan::summary() const {
  std::string experts =
      all_resident ? fmt::format("experts all {} resident = {}", total_experts, format_bytes(expert_bytes))
                   : fmt::format("experts {} of {} slots x {} = {} ({:.1f}%)", slots, total_experts,
                                 format_bytes(slot_bytes), format_bytes(expert_bytes),
                                 100.0 * double(slots) / double(std::max<int64_t>(1, total_experts)));
  return fmt::format("dsv4: ram plan: budget {} ({}), dense {} resident, {}, kv+scratch reserve {}, projected peak {}",
                     format_bytes(budget), budget_source, format_bytes(dense_bytes), experts,
                     format_bytes(reserve_bytes), format_bytes(projected_peak()));
}

MemoryPlan plan_memory(const Checkpoint& ck, const RamRequest& ram, const WorkloadShape& workload) {
  const ModelConfig& c = ck.config();
  MemoryPlan p;
  for (const auto& [name, ref] : ck.tensors())
    if (!is_routed_expert(name) && name != "embed.weight") p.dense_bytes += ref.info->bytes;  // rows read per token
  const ExpertLayout layout(ck);
  p.slot_bytes = layout.slot_bytes();
  p.total_experts = int64_t(layout.n_layers()) * layout.n_experts();
  p.reserve_bytes = estimate_session_bytes(c, workload.context_tokens) + estimate_activation_bytes(c, workload) +
                    kProcessOverheadBytes;
  // One token needs K experts per layer; twice that lets the next layer's reads run while
  // this layer computes.
  p.min_slots = std::min<int64_t>(p.total_experts, 2 * int64_t(c.n_experts_per_token));
  p.minimum_budget = p.dense_bytes + p.reserve_bytes + uint64_t(p.min_slots) * p.slot_bytes;
  const uint64_t resident_total = uint64_t(p.total_experts) * layout.max_payload_bytes();

  switch (ram.kind) {
    case RamRequest::Kind::kBytes:
      p.budget = ram.bytes;
      p.budget_source = "--ram " + ram.text;
      break;
    case RamRequest::Kind::kMinimum:
      p.budget = p.minimum_budget;
      p.budget_source = "--ram min";
      break;
    case RamRequest::Kind::kDefault: {
      const uint64_t available = available_memory_bytes();
      if (available == 0) fail("--ram: cannot read the available memory from /proc/meminfo; give --ram explicitly");
      p.budget = static_cast<uint64_t>(double(available) * kDefaultShare);
      p.budget_source = fmt::format("default: {:.0f}% of {} available", kDefaultShare * 100, format_bytes(available));
      break;
    }
  }
  if (p.budget < p.minimum_budget) {
    fail("--ram: a budget of {} ({}) is below the minimum of {} for {} (dense {} + {} expert slots of {} + "
         "kv+scratch reserve {}); use --ram min or more",
         format_bytes(p.budget), p.budget_source, format_bytes(p.minimum_budget), ck.dir(), format_bytes(p.dense_bytes),
         p.min_slots, format_bytes(p.slot_bytes), format_bytes(p.reserve_bytes));
  }
  const uint64_t for_experts = p.budget - p.dense_bytes - p.reserve_bytes;
  if (for_experts >= resident_total) {
    p.all_resident = true;
    p.slots = p.total_experts;
    p.expert_bytes = resident_total;
  } else {
    p.slots = std::min<int64_t>(p.total_experts, static_cast<int64_t>(for_experts / p.slot_bytes));
    p.slots = std::max(p.slots, p.min_slots);
    p.expert_bytes = uint64_t(p.slots) * p.slot_bytes;
  }
  return p;
}

std::string stats_line(const ExpertStats& s, uint64_t peak_rss) {
  return fmt::format(
      "dsv4: stats: experts {} requests, {:.1f}% hits, {} reads ({:.2f} GB at {:.2f} GB/s), {} stalls, {:.2f} s "
      "blocked on I/O; peak RSS {}",
      s.requests, 100.0 * s.hit_rate(), s.reads, s.bytes_read / 1e9, s.read_gbps(), s.stalls, s.blocked_seconds,
      format_bytes(peak_rss));
}

std::unique_ptr<ExpertProvider> make_planned_provider(const Checkpoint& ck, const MemoryPlan& plan,
                                                      ExpertStoreOptions store) {
  if (plan.all_resident) return make_resident_experts(ck);
  store.slots = plan.slots;
  return std::make_unique<ExpertStore>(ck, store);
}

}  // namespace dsv4
