// The engine: loaded weights (dense part resident, routed experts behind an
// ExpertProvider), the forward workspace and the forward pass. Sessions hold all
// per-sequence state, so several sessions can share one engine; forward calls are
// serialized by the engine. Building one from a checkpoint directory and a RAM budget is the
// model loader's job (runtime/model_loader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "dsv4/experts/expert_provider.h"
#include "dsv4/io/checkpoint.h"
#include "dsv4/kernels/kernels.h"
#include "dsv4/model/rope.h"
#include "dsv4/model/session.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/model/weights.h"
#include "dsv4/model/workspace.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4 {

// Which layers' routed experts the engine guesses ahead (see expert_lookahead.h).
// kExact: only hash-routed layers, whose experts follow from the token ids (never wrong);
// kAll: also top-k layers, by running their router early (twice per layer). The default:
// on the 4-layer synthetic checkpoint it cut the decode time blocked on reads to about a
// third of kExact's, and the decode time by ~8 % (docs/benchmarks.md).
enum class ExpertLookahead : uint8_t { kOff, kExact, kAll };

struct EngineOptions {
  kernels::Numerics numerics = kernels::Numerics::kFast;
  int threads = 0;  // 0: all available CPUs
  ExpertLookahead lookahead = ExpertLookahead::kAll;
  // The workspace's shape: rows (tokens) per forward pass and the longest sequence a session
  // may reach. Longer inputs are fed in passes of max_rows; a longer session is refused.
  int64_t max_rows = 512;
  int64_t context = 4096;
  // Load the MTP layer (mtp.0, spec §4.1) with its routed experts resident, and keep what
  // its drafts need in every session (mtp_draft). Ignored when the checkpoint has none.
  bool mtp = false;
  // Hash-routed layers' experts follow from the token ids: read them as certain (full queue
  // depth) from the moment the token is known (anticipate(), which the generator calls as
  // soon as it has sampled the next token). Off: they are guessed like the other layers, in
  // idle read slots, at the layer's start.
  bool early_hash_reads = true;
  // The test fault layer for the dense weights' and embedding rows' reads (null: none; the
  // loader passes the store's).
  std::shared_ptr<IoFaults> faults;
};

// Which logits a forward call returns.
enum class LogitRows : uint8_t { kLast, kAll };

class Engine {
 public:
  // The checkpoint (opened and validated), the options and the routed experts; loads the
  // dense weights and allocates the workspace.
  static std::unique_ptr<Engine> create(std::unique_ptr<const Checkpoint> checkpoint, const EngineOptions& options,
                                        std::unique_ptr<ExpertProvider> experts);

  const ModelConfig& config() const { return checkpoint_->config(); }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  ExpertProvider& experts() { return *experts_; }
  kernels::Numerics numerics() const { return options_.numerics; }
  int threads() const { return pool_.size(); }
  // The longest sequence a session of this engine may reach, and the most tokens one pass
  // carries (the workspace's shape).
  int64_t context_limit() const { return workspace_.context; }
  int64_t max_rows() const { return workspace_.max_rows; }

  // A fresh session, its state allocated for context_limit() tokens.
  SessionState new_session() const;

  // Feeds `tokens` to the session in passes of at most `chunk` tokens (0 or more than the
  // workspace holds: the workspace's max_rows). logits: null, or [tokens.size(), vocab]
  // (kAll) / [vocab] (kLast). Throws Error on a token id outside the vocabulary or a session
  // past the context limit. With `undo`, every write into the session is saved there first,
  // so that the last positions fed can be taken back (UndoLog::rewind).
  void forward(SessionState& session, std::span<const int32_t> tokens, float* logits, LogitRows rows,
               int64_t chunk = 0, UndoLog* undo = nullptr);

  // The MTP drafter (mtp.cc). Whether it is loaded (EngineOptions::mtp and a checkpoint with
  // an MTP layer).
  bool has_mtp() const { return mtp_experts_ != nullptr; }
  const ExpertProvider* mtp_experts() const { return mtp_experts_.get(); }
  // Up to k guesses of the tokens after `next`, the token the session will be fed next:
  // out[0] is the MTP layer's greedy prediction from the main model's streams at the last
  // position fed and the embedding of `next`; out[i] feeds the MTP's own output streams and
  // out[i-1] back in. First brings the MTP layer's window up to the session (every position
  // fed since the last call, at most a window's worth). Never changes what forward()
  // computes; the chained positions are taken back from the MTP window before returning.
  // Returns the number of drafts written (k; 0 without MTP).
  int mtp_draft(SessionState& session, int32_t next, int k, int32_t* out);
  // The MTP layer's logits along a sequence, in a fresh session: row i predicts tokens[i+2]
  // from the main model's streams at position i and tokens[i+1]. logits [tokens.size()-1, V].
  void mtp_score(std::span<const int32_t> tokens, float* logits);

  // The next forward call will start with these tokens: start reading the experts that
  // certainly follow from them (hash-routed layers). Never changes results; a no-op when
  // the experts are resident or early reads are off.
  void anticipate(std::span<const int32_t> tokens);

 private:
  Engine(std::unique_ptr<const Checkpoint> checkpoint, const EngineOptions& options,
         std::unique_ptr<ExpertProvider> experts);
  // One pass of T <= max_rows tokens: embed -> layers -> (logits) hc_head -> norm -> head.
  void forward_pass(SessionState& s, std::span<const int32_t> tokens, float* logits, LogitRows rows, UndoLog* undo);
  void embed(const Pass& p, std::span<const int32_t> tokens);
  void rope_angles(const Pass& p);
  void layer(const Pass& p, const LayerWeights& L, std::span<const int32_t> tokens, LayerState& state,
             ExpertProvider& experts);
  void head(const Pass& p, LogitRows rows, float* logits);
  // The output head over streams X's rows: hc_head (fn, base, scale) -> norm -> head.
  void head_rows(const Pass& p, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
                 const std::vector<float>& norm, const float* X, int64_t n, float* logits);
  // MTP (mtp.cc): the main model's streams of the pass's rows into the session's ring.
  void keep_streams(const Pass& p, SessionState& s);
  // The MTP layer over positions [from, end) of the session (at most max_rows), each with
  // the token after it (`after_last` for position s.position - 1); logits of the last row
  // (kLast) or of every row (kAll).
  void mtp_pass(SessionState& s, int64_t from, int64_t end, int32_t after_last, float* logits, LogitRows rows);
  // The MTP layer brought up to position `end` (every position before it whose streams the
  // ring holds, at most a window); logits as mtp_pass. Always recomputes end - 1.
  void mtp_catch_up(SessionState& s, int64_t end, int32_t after_last, float* logits, LogitRows rows);
  // One chained draft row at `position`: streams ws.mtp_chain, next token `token`.
  void mtp_chain(SessionState& s, int64_t position, int32_t token, float* logits);
  // Hands the provider a guess of layer l's routed experts (never changes results).
  void guess_experts(const Pass& p, int l, std::span<const int32_t> tokens);

  std::unique_ptr<const Checkpoint> checkpoint_;  // first: the weights and experts point into it
  EngineOptions options_;
  ModelWeights weights_;
  std::unique_ptr<ExpertProvider> experts_;
  std::unique_ptr<ExpertProvider> mtp_experts_;  // the MTP layer's routed experts, resident (null: no MTP)
  Rope ropes_[2];  // sliding-only layers, compressed layers
  ThreadPool pool_;
  ForwardWorkspace workspace_;
  std::mutex forward_mutex_;
};

}  // namespace dsv4
