// The RAM planner: from a budget (--ram) decide what stays resident and how many expert
// cache slots exist. The dense weights are always resident; the rest of the budget, after
// a reserve for the session state (and its undo logs), the forward workspace, the logits the caller keeps, the
// server's prefix cache and the process itself, becomes expert slots. The reserve's sizes
// come from the same functions that allocate those things (SessionState::bytes_at,
// ForwardWorkspace::bytes). When every routed expert fits, the resident provider is used.
#pragma once

#include <cstdint>
#include <memory>
#include <string>


namespace dsv4 {

class Checkpoint;
struct ModelConfig;

struct RamRequest {
  enum class Kind : uint8_t { kDefault, kMinimum, kBytes };
  Kind kind = Kind::kDefault;
  uint64_t bytes = 0;
  std::string text;  // as given, for messages
};

// "512M", "24G", "1.5G", "2T", "800K", "123456" (bytes), "min" or "auto" (the default share
// of available memory). Throws Error naming --ram on anything else.
RamRequest parse_ram(const std::string& text);

// The prefill chunk when none is given (--chunk 0) and the planner does not choose one
// (WorkloadShape::auto_chunk): the base the automatic chunk grows from.
inline constexpr int64_t kAutoChunkTokens = 512;
// The chunk to use for --chunk `requested` and sequences of up to `context` tokens, without
// a plan (a fixed chunk: `requested`, or kAutoChunkTokens at most).
int64_t resolve_chunk(int64_t requested, int64_t context);
struct WorkloadShape;
// --chunk `requested` for prompts of up to `longest` tokens: that chunk, or (0) the largest
// one up to `longest` the budget allows, chosen by plan_memory (MemoryPlan::chunk_tokens).
void choose_chunk(WorkloadShape& w, int64_t requested, int64_t longest);

// What the process will do with the model: sizes the reserve.
// WorkloadShape::sessions = 0: the plan reserves up to this many sessions, as many as cost
// at most a quarter of what is left for experts (or all, when every expert stays resident).
inline constexpr int64_t kAutoSessions = 4;

struct WorkloadShape {
  int64_t context_tokens = 4096;  // longest sequence a session will reach
  int64_t chunk_tokens = kAutoChunkTokens;  // rows per forward pass (the largest prefill chunk)
  // The plan picks the chunk: from min(kAutoChunkTokens, chunk_tokens) up to chunk_tokens, the
  // largest whose workspace keeps every expert resident when they are at the base chunk, or
  // else takes at most half of the base plan's expert cache (and leaves min_slots).
  bool auto_chunk = false;
  int64_t logit_rows = 1;         // rows of [vocab] logits the caller keeps
  int64_t sessions = 1;           // sessions alive at once (0: the plan picks, up to kAutoSessions)
  int threads = 1;                // compute threads (the workspace has scratch per thread)
  uint64_t prefix_cache_bytes = 0;  // the server's prefix cache bound
  bool mtp = false;               // the MTP drafter is loaded (its layer resident, experts too)
  int64_t admit_rows = 2;         // a prompt's rows per shared pass (EngineOptions::batch_prompt_rows)
};

struct MemoryPlan {
  uint64_t budget = 0;
  std::string budget_source;   // "--ram 12G", "--ram min", "default: 80% of 20.1 GiB available"
  uint64_t dense_bytes = 0;    // resident non-expert weights
  uint64_t mtp_bytes = 0;      // the MTP layer, experts included, resident (WorkloadShape::mtp)
  uint64_t reserve_bytes = 0;  // sessions + workspace + logits + prefix cache + process overhead
  uint64_t prefix_cache_bytes = 0;  // part of reserve_bytes
  uint64_t slot_bytes = 0;     // one expert cache slot
  int64_t total_experts = 0;
  int64_t min_slots = 0;       // smallest cache that still overlaps I/O with compute
  int64_t slots = 0;           // == total_experts when all resident
  bool all_resident = false;
  int64_t sessions = 1;        // sessions whose state the reserve holds (the server's slots)
  uint64_t expert_bytes = 0;   // RAM held for experts
  uint64_t minimum_budget = 0; // dense + mtp + min_slots + reserve
  // Parts of reserve_bytes, for the plan line: the sessions' state at the planned context
  // (one session's bytes, and per token of context), and the forward workspace of the chunk.
  int64_t context_tokens = 0;
  uint64_t session_bytes = 0;        // one session at context_tokens
  uint64_t undo_bytes = 0;           // one session slot's undo logs (session_undo_bytes), beside it
  double session_token_bytes = 0;    // one session's bytes per token of context
  int64_t chunk_tokens = 0;          // rows per forward pass (the engine's max_rows)
  bool chunk_chosen = false;         // picked by the plan (WorkloadShape::auto_chunk)
  uint64_t workspace_bytes = 0;      // the forward workspace for chunk_tokens rows
  uint64_t workspace_row_bytes = 0;  // what one more chunk row adds to it

  uint64_t projected_peak() const { return dense_bytes + mtp_bytes + expert_bytes + reserve_bytes; }
  std::string summary() const;  // the one line printed on stderr
};

// Fixed allowance for the process itself (code, libraries, allocator slack, thread stacks).
inline constexpr uint64_t kProcessOverheadBytes = 64ull << 20;

// Throws Error naming --ram and the minimum when the budget is below one token's working
// set (dense + min_slots expert slots + reserve).
MemoryPlan plan_memory(const Checkpoint& ck, const RamRequest& ram, const WorkloadShape& workload);

// The undo logs one session slot keeps at most beside its state: the generator's for a
// verify pass (kMaxDraftTokens + 1 rows, within a pass's rows) and, with several sessions
// sharing passes, the engine's for the slot's part of a shared pass (a decode row or
// admit_rows rows of a prompt chunk). UndoLog::most_for sizes both, as they are reserved.
uint64_t session_undo_bytes(const ModelConfig& c, const WorkloadShape& w);

// The reserve for a workload, without the process overhead: sessions (their state and undo
// logs), forward workspace, kept logits, prefix cache.
uint64_t workload_bytes(const ModelConfig& c, const WorkloadShape& w);

}  // namespace dsv4
