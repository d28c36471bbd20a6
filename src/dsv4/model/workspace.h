// The forward workspace: every activation one forward pass writes besides the session,
// allocated once for a shape (rows per pass, context limit) and reused by every pass, so
// steady-state decode and prefill make no heap allocation. ForwardWorkspace::bytes() is the
// planner's reserve for it, computed from the same list of buffers the constructor allocates.
//
// Liveness, for readers of the blocks: the streams X carry the residual through the whole
// pass; x, y, mix and the mHC scratch are rewritten by every sub-block; the expert lookahead
// borrows x, mix and the router logits between sub-blocks, when none of them is live.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <span>
#include <vector>

#include "dsv4/io/config.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/rope.h"

namespace dsv4 {

class ThreadPool;
class UndoLog;
struct SessionState;

// Per-token mixing coefficients of one mHC sub-block.
struct HcMix {
  float* pre = nullptr;   // [T, hc]
  float* post = nullptr;  // [T, hc]
  float* comb = nullptr;  // [T, hc, hc], row-major C[j][k]
};

// One (kv, gate) row pair a compressor pools over (a window slot, at a feature offset).
struct PoolSlot {
  const float* kv;
  const float* gate;
};

struct ForwardWorkspace {
  // `threads`: the pool size (tasks that need private scratch get one slice per chunk).
  // `mtp`: also the MTP drafter's buffers.
  ForwardWorkspace(const ModelConfig& c, int64_t max_rows, int64_t context, int threads, bool mtp = false);
  // The bytes the constructor allocates for this shape.
  static uint64_t bytes(const ModelConfig& c, int64_t max_rows, int64_t context, int threads, bool mtp = false);
  // Chained MTP drafts one call makes at most (mtp_saved's rows).
  static constexpr int kMtpMaxChain = 16;

  int64_t max_rows = 0;  // rows (tokens) one pass may carry
  int64_t context = 0;   // longest sequence a session may reach
  int scratch_slots = 0; // private scratch slices of the parallel attention / indexer loops
  int64_t attend_rows = 0;   // most kv rows one query attends to (window + entries)
  int64_t index_entries = 0; // most compressed entries the indexer scores for one query

  // Streams and sub-block input / output.
  std::vector<float> X;         // [T, hc, D] residual streams
  std::vector<float> x, y;      // [T, D]
  std::vector<uint16_t> embed_raw;  // [D] one embedding row as read
  // mHC.
  std::vector<float> mix_pre, mix_post, mix_comb;  // [T, hc], [T, hc], [T, hc*hc]
  std::vector<float> mix_m;       // [T, (2+hc)*hc] fn · rmsnorm(flatten(X))
  std::vector<float> mix_normed;  // [T, hc*D]
  std::vector<float> mix_out;     // [hc, D] one token's new streams
  // RoPE angles of the pass's positions, per variant (0: sliding-only layers, 1: compressed).
  std::vector<float> rope_cos[2], rope_sin[2];  // [T, rope_dim/2]
  std::vector<float> entry_cos, entry_sin;      // [rope_dim/2] a compressed entry's position
  // Attention.
  std::vector<float> qr;        // [T, q_lora]
  std::vector<float> q;         // [T, H*hd]
  std::vector<float> kv_rows;   // [window-1 + T, hd] previous window then the pass's rows
  std::vector<float> o;         // [T, H*hd]
  std::vector<float> og;        // [T, hd*H/G] one output group
  std::vector<float> z;         // [T, G*R]
  std::vector<float> attend_scores;  // [scratch_slots, kAttendHeadBlock, attend_rows]
  std::vector<const float*> attend_row_ptrs;  // [scratch_slots, attend_rows] the kv rows one task reads
  // Heads one attention task computes together (they share the token's kv rows).
  static constexpr int kAttendHeadBlock = 8;
  // Compressor and lightning indexer.
  std::vector<float> comp_kv, comp_gate;  // [T, 2*hd]
  std::vector<PoolSlot> pool_slots;       // [2 * largest ratio]
  std::vector<float> pooled;              // [hd]
  std::vector<float> index_q;             // [T, IH*Id]
  std::vector<float> index_weight;        // [T, IH]
  std::vector<float> index_scores;        // [scratch_slots, index_entries]
  std::vector<int32_t> index_order;       // [scratch_slots, index_entries]
  std::vector<int32_t> picks;             // [T, index_topk] chosen entries, ascending
  std::vector<int32_t> pick_count;        // [T]
  // MoE.
  std::vector<float> router_logits;       // [T, E]
  std::vector<float> router_score;        // [E]
  std::vector<float> router_biased;       // [E]
  std::vector<int32_t> router_order;      // [E]
  std::vector<int32_t> route_experts;     // [T, K]
  std::vector<float> route_weights;       // [T, K]
  std::vector<int32_t> user_offset;       // [E+1] CSR over experts of the (token, slot) pairs
  std::vector<int32_t> users;             // [T*K] entries t*K + k, grouped by expert
  std::vector<int32_t> needed, pending;   // [E]
  std::vector<float> shared_out;          // [T, D]
  std::vector<float> routed_out;          // [T*K, D]
  std::vector<float> expert_x, expert_y;  // [T, D] one expert's rows
  std::vector<float> ffn_g, ffn_u;        // [T, I]
  std::vector<int32_t> slot_order;        // [K]
  kernels::QuantizedInput ffn_in, down_in;  // the activations of w1/w3 and of w2
  // The attention projections' activations (matmul's scratch: fast FP8 quantizes them).
  kernels::QuantizedInput dense_in;       // [T, dense_cols(c)]
  // Expert lookahead.
  std::vector<int32_t> ranked;            // [T, 2K] each token's best experts
  std::vector<int32_t> guess;             // [E]
  std::vector<char> guessed;              // [E]
  // MTP drafter (empty without it).
  std::vector<int32_t> mtp_next;          // [T] the token after each row's position
  std::vector<float> mtp_chain;           // [hc, D] the last MTP row's output streams
  std::vector<float> mtp_logits;          // [V]
  std::vector<float> mtp_saved;           // [kMtpMaxChain, hd + hc*D] what chained drafts overwrite
  // Batched passes (several sessions' rows in one pass, Engine::forward_batch).
  std::vector<int32_t> pass_tokens;       // [T] every part's tokens, in row order
  std::vector<float> kv_all;              // [T, hd] the pass's window kv rows, before each part's ring
  std::vector<float> batch_logits;        // [kHeadRows, V] head rows of a batch, before they go to each part
  static constexpr int64_t kHeadRows = 16;

 private:
  template <typename Visit>
  static void for_each_buffer(ForwardWorkspace* ws, const ModelConfig& c, int64_t rows, int64_t context,
                              int threads, bool mtp, Visit&& visit);
};

// A run of consecutive rows of a pass that belong to one session: rows [row0, row0 + T) of
// the pass's buffers are positions [pos0, pos0 + T) of `session`.
struct PassPart {
  SessionState* session = nullptr;
  int64_t row0 = 0, T = 0, pos0 = 0;
  UndoLog* undo = nullptr;  // when set, every write into this session is saved first
};

// Thrown out of a pass whose cancel flag was raised (Ctrl-C during a long prefill): the pass
// stops at its next check, leaving the session half updated for the caller to rewind.
class PassCancelled : public std::exception {
 public:
  const char* what() const noexcept override { return "cancelled"; }
};

// What every block of one forward pass shares: the model, the numerics, the pool, the
// workspace and where the pass's rows sit in the sequence. A pass carries rows of one
// session (parts empty: rows [0, T) at positions pos0..) or of several (one PassPart each);
// the blocks that read or write a session's state run once per part, on part(i), whose
// rows index the pass's buffers from row0 (row(t)); everything else runs once over all T
// rows, so each weight is read once per pass whatever the number of sessions.
struct Pass {
  const ModelConfig& c;
  kernels::Numerics numerics;
  ThreadPool& pool;
  ForwardWorkspace& ws;
  const Rope* ropes;  // [2]: sliding-only layers, compressed layers
  int64_t T = 0;      // rows in this pass
  int64_t pos0 = 0;   // position of row 0
  UndoLog* undo = nullptr;  // when set, every write into the session is saved first
  std::span<const PassPart> parts = {};  // several sessions' rows (empty: one session)
  int64_t row0 = 0;   // a part's first row in the pass's buffers (see row())
  // Raised from another thread to abandon the pass. Checked on the calling thread between a
  // layer's blocks and between routed experts, never inside a kernel, so the pass stops
  // within a few milliseconds of work at any chunk size.
  const std::atomic<bool>* cancel = nullptr;

  void check_cancel() const {
    if (cancel && cancel->load(std::memory_order_relaxed)) throw PassCancelled();
  }

  // The pass's parts: 1 for a one-session pass.
  size_t n_parts() const { return parts.empty() ? 1 : parts.size(); }
  // The pass restricted to part i's rows (this pass itself when it has one session).
  Pass part(size_t i) const;
  // Row t of this (part of the) pass in the pass's buffers.
  int64_t row(int64_t t) const { return row0 + t; }
  // The part that row r of the pass belongs to, and that row's position in its session.
  size_t part_of_row(int64_t r) const;
  int64_t position_of_row(size_t part, int64_t r) const {
    return parts.empty() ? pos0 + r : parts[part].pos0 + (r - parts[part].row0);
  }

  int rope_variant(const LayerSpec& l) const { return l.compress_ratio == 0 ? 0 : 1; }
  const Rope& rope(const LayerSpec& l) const { return ropes[rope_variant(l)]; }
  // The angles of row t's position for layer kind l.
  const float* cos(const LayerSpec& l, int64_t t) const;
  const float* sin(const LayerSpec& l, int64_t t) const;
};

}  // namespace dsv4
