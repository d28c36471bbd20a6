#include "dsv4/runtime/planner.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "dsv4/experts/expert_layout.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/io/schema.h"
#include "dsv4/runtime/speculative.h"
#include "dsv4/model/session.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/model/workspace.h"
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

int64_t resolve_chunk(int64_t requested, int64_t context) {
  if (requested > 0) return requested;
  return std::max<int64_t>(1, std::min(kAutoChunkTokens, context));
}

void choose_chunk(WorkloadShape& w, int64_t requested, int64_t longest) {
  w.auto_chunk = requested <= 0;
  w.chunk_tokens = requested > 0 ? requested : std::max<int64_t>(1, longest);
}

uint64_t session_undo_bytes(const ModelConfig& c, const WorkloadShape& w) {
  const int64_t rows = std::max<int64_t>(1, std::min(w.chunk_tokens, std::max<int64_t>(1, w.context_tokens)));
  // The generator drafts at most rows - 1 tokens (a verify pass fits in one pass).
  const int64_t verify = rows > 1 ? std::min<int64_t>(kMaxDraftTokens + 1, rows) : 0;
  const int64_t shared = w.sessions > 1 ? std::clamp<int64_t>(w.admit_rows, 1, rows) : 0;
  return UndoLog::most_for(c, verify).bytes() + UndoLog::most_for(c, shared).bytes();
}

uint64_t workload_bytes(const ModelConfig& c, const WorkloadShape& w) {
  const int64_t context = std::max<int64_t>(1, w.context_tokens);
  const int64_t rows = std::max<int64_t>(1, std::min(w.chunk_tokens, context));
  return uint64_t(std::max<int64_t>(1, w.sessions)) * (SessionState::bytes_at(c, context, w.mtp) + session_undo_bytes(c, w)) +
         ForwardWorkspace::bytes(c, rows, context, std::max(1, w.threads), w.mtp) +
         uint64_t(std::max<int64_t>(0, w.logit_rows)) * uint64_t(c.vocab_size) * sizeof(float) + w.prefix_cache_bytes;
}

std::string MemoryPlan::summary() const {
  std::string experts =
      all_resident ? fmt::format("experts all {} resident = {}", total_experts, format_bytes(expert_bytes))
                   : fmt::format("experts {} of {} slots x {} = {} ({:.1f}%)", slots, total_experts,
                                 format_bytes(slot_bytes), format_bytes(expert_bytes),
                                 100.0 * double(slots) / double(std::max<int64_t>(1, total_experts)));
  const std::string cache =
      prefix_cache_bytes ? fmt::format(" (prefix cache {})", format_bytes(prefix_cache_bytes)) : std::string();
  const std::string mtp = mtp_bytes ? fmt::format(", mtp drafter {} resident", format_bytes(mtp_bytes)) : std::string();
  const std::string slots_text = sessions > 1 ? fmt::format(" for {} session slots", sessions) : std::string();
  // What the reserve holds: the sessions' state at the planned context (it grows with each
  // token of context) and the workspace of the chunk (it grows with each chunk row).
  // The undo logs beside each session slot (a verify pass's and its part of shared passes).
  const std::string undo = fmt::format(", undo logs {}", format_bytes(undo_bytes));
  const std::string parts = fmt::format(
      " (session {} at {} tokens, {:.0f} B/token{}; chunk {} rows{}, workspace {}, {}/row)",
      format_bytes(session_bytes), context_tokens, session_token_bytes, undo, chunk_tokens, chunk_chosen ? " auto" : "",
      format_bytes(workspace_bytes), format_bytes(workspace_row_bytes));
  return fmt::format("dsv4: ram plan: budget {} ({}), dense {} resident{}, {}, kv+scratch reserve {}{}{}{}, projected peak {}",
                     format_bytes(budget), budget_source, format_bytes(dense_bytes), mtp, experts,
                     format_bytes(reserve_bytes), parts, slots_text, cache, format_bytes(projected_peak()));
}

MemoryPlan plan_memory(const Checkpoint& ck, const RamRequest& ram, const WorkloadShape& workload) {
  const ModelConfig& c = ck.config();
  MemoryPlan p;
  // The embedding's rows are read per token; the MTP layer is not loaded until something runs it.
  const std::string drafter = c.num_mtp_layers > 0 ? layer_prefix(c, c.num_layers) : std::string("-");
  const std::set<std::string> unused(ck.unused_tensors().begin(), ck.unused_tensors().end());
  for (const auto& [name, ref] : ck.tensors()) {
    if (name.rfind("mtp.", 0) == 0) {
      // mtp.0 as loaded (64-byte aligned); later MTP layers and DSpark heads are never loaded.
      if (workload.mtp && ck.has_mtp() && name.rfind(drafter, 0) == 0 && !unused.count(name))
        p.mtp_bytes += (ref.info->bytes + 63) / 64 * 64;
    } else if (!is_routed_expert(name) && name != "embed.weight") {
      p.dense_bytes += ref.info->bytes;
    }
  }
  const ExpertLayout layout(ck);
  p.slot_bytes = layout.slot_bytes();
  p.total_experts = int64_t(layout.n_layers()) * layout.n_experts();
  // With sessions = 0 the count is picked below, once the budget is known; the minimum
  // budget is that of one.
  WorkloadShape shape = workload;
  shape.sessions = std::max<int64_t>(1, workload.sessions);
  // An automatic chunk starts from the base; workload.chunk_tokens is then its upper bound.
  const int64_t context = std::max<int64_t>(1, workload.context_tokens);
  const int64_t cap = std::max<int64_t>(1, std::min(workload.chunk_tokens, context));
  shape.chunk_tokens = workload.auto_chunk ? std::min(kAutoChunkTokens, cap) : cap;
  p.sessions = shape.sessions;
  p.reserve_bytes = workload_bytes(c, shape) + kProcessOverheadBytes;
  p.prefix_cache_bytes = workload.prefix_cache_bytes;
  // One token needs K experts per layer; twice that lets the next layer's reads run while
  // this layer computes.
  p.min_slots = std::min<int64_t>(p.total_experts, 2 * int64_t(c.n_experts_per_token));
  p.minimum_budget = p.dense_bytes + p.mtp_bytes + p.reserve_bytes + uint64_t(p.min_slots) * p.slot_bytes;
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
    fail("--ram: a budget of {} ({}) is below the minimum of {} for {} (dense {}{} + {} expert slots of {} + "
         "kv+scratch reserve {}); use --ram min or more",
         format_bytes(p.budget), p.budget_source, format_bytes(p.minimum_budget), ck.dir(), format_bytes(p.dense_bytes),
         p.mtp_bytes ? " + mtp drafter " + format_bytes(p.mtp_bytes) : std::string(), p.min_slots,
         format_bytes(p.slot_bytes), format_bytes(p.reserve_bytes));
  }
  if (workload.sessions <= 0) {
    for (int64_t n = kAutoSessions; n > 1; --n) {
      shape.sessions = n;
      const uint64_t one =
          SessionState::bytes_at(c, std::max<int64_t>(1, workload.context_tokens), workload.mtp) + session_undo_bytes(c, shape);
      const uint64_t reserve = workload_bytes(c, shape) + kProcessOverheadBytes;
      const uint64_t fixed = p.dense_bytes + p.mtp_bytes + reserve + uint64_t(p.min_slots) * p.slot_bytes;
      if (fixed > p.budget) continue;
      const uint64_t left = p.budget - p.dense_bytes - p.mtp_bytes - reserve;
      if (left >= resident_total || uint64_t(n - 1) * one * 4 <= left) {
        p.sessions = n;
        p.reserve_bytes = reserve;
        break;
      }
    }
  }
  // An automatic chunk grows from the base while the budget allows (WorkloadShape::auto_chunk).
  shape.sessions = p.sessions;
  if (workload.auto_chunk && cap > shape.chunk_tokens) {
    const uint64_t base_reserve = p.reserve_bytes;
    const uint64_t base_left = p.budget - p.dense_bytes - p.mtp_bytes - base_reserve;
    const bool base_resident = base_left >= resident_total;
    auto reserve_at = [&](int64_t rows) {
      WorkloadShape s = shape;
      s.chunk_tokens = rows;
      return workload_bytes(c, s) + kProcessOverheadBytes;
    };
    // Larger chunks only add workspace, so the rows that fit are a prefix: bisect.
    auto fits = [&](int64_t rows) {
      const uint64_t reserve = reserve_at(rows);
      if (p.dense_bytes + p.mtp_bytes + reserve > p.budget) return false;
      const uint64_t left = p.budget - p.dense_bytes - p.mtp_bytes - reserve;
      if (base_resident) return left >= resident_total;
      return left >= uint64_t(p.min_slots) * p.slot_bytes && reserve - base_reserve <= base_left / 2;
    };
    int64_t lo = shape.chunk_tokens, hi = cap;  // fits(lo); find the largest that fits
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid)) lo = mid;
      else hi = mid - 1;
    }
    shape.chunk_tokens = lo;
    p.reserve_bytes = reserve_at(lo);
  }
  p.chunk_tokens = shape.chunk_tokens;
  p.chunk_chosen = workload.auto_chunk;
  p.context_tokens = context;
  p.session_bytes = SessionState::bytes_at(c, context, workload.mtp);
  p.session_token_bytes = SessionState::bytes_per_token(c);
  p.undo_bytes = session_undo_bytes(c, shape);
  const int threads = std::max(1, workload.threads);
  p.workspace_bytes = ForwardWorkspace::bytes(c, p.chunk_tokens, context, threads, workload.mtp);
  // Per row: the mean over rows past the head's (kHeadRows of logits) up to the chunk, at least
  // 64 of them (the quantized activations grow in blocks of rows).
  const int64_t from = ForwardWorkspace::kHeadRows, to = std::max<int64_t>(p.chunk_tokens, from + 64);
  p.workspace_row_bytes = (ForwardWorkspace::bytes(c, to, context, threads, workload.mtp) -
                           ForwardWorkspace::bytes(c, from, context, threads, workload.mtp)) /
                          uint64_t(to - from);

  const uint64_t for_experts = p.budget - p.dense_bytes - p.mtp_bytes - p.reserve_bytes;
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

}  // namespace dsv4
