// The engine: loaded weights (dense part resident, routed experts behind an
// ExpertProvider), the forward workspace and the forward pass. Sessions hold all
// per-sequence state, so several sessions can share one engine; forward calls are
// serialized by the engine. Building one from a checkpoint directory and a RAM budget is the
// model loader's job (runtime/model_loader.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

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
  // Continuous batching (join_batch): how long the thread leading a shared pass waits for the
  // other members' rows before it starts the pass without them.
  int batch_wait_us = 5000;
  // The most rows of a prompt chunk a shared pass carries beside other sessions' rows (a
  // decoding session's token, a draft's verify rows); the rest of the chunk follows in the
  // next passes. A pass with no other rows takes the whole chunk. Each prompt row adds its
  // own routed experts to the pass (about 6 new ones per layer under uniform routing), so
  // this bounds how much a prompt being admitted slows the streams of the others. Two keep
  // the streams' p99 inter-token latency within 2x the p50 (docs/benchmarks.md); four cost
  // 1.7x a decode pass at the median and ~2.5x at the 99th percentile.
  int64_t batch_prompt_rows = 2;
  // The test fault layer for the dense weights' and embedding rows' reads (null: none; the
  // loader passes the store's).
  std::shared_ptr<IoFaults> faults;
};

// Which logits a forward call returns.
enum class LogitRows : uint8_t { kLast, kAll };

// One session's rows of a batched pass (Engine::forward_batch).
struct BatchItem {
  SessionState* session = nullptr;
  std::span<const int32_t> tokens;
  float* logits = nullptr;  // null, or [tokens, V] (kAll) / [V] (kLast)
  LogitRows rows = LogitRows::kLast;
  UndoLog* undo = nullptr;  // as forward()'s
  const std::atomic<bool>* cancel = nullptr;  // as forward()'s
};

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
  // so that the last positions fed can be taken back (UndoLog::rewind). When `cancel` is
  // raised (from another thread: Ctrl-C) the pass under way stops at its next check and
  // throws PassCancelled, the session half updated (the caller rewinds it); passes shared
  // with other sessions under continuous batching run to their end.
  void forward(SessionState& session, std::span<const int32_t> tokens, float* logits, LogitRows rows,
               int64_t chunk = 0, UndoLog* undo = nullptr, const std::atomic<bool>* cancel = nullptr);

  // One pass over several sessions' rows (each session once; at most max_rows() tokens in
  // all): the dense matmuls and the MoE run once over every row (each routed expert the rows
  // need is read once), the attention per session. Each session ends exactly as forward()
  // would have left it alone, with the same logits, bit for bit: every kernel computes a
  // row from that row alone. Throws Error as forward() does; on a failure inside the pass
  // the sessions may be half updated (the batching below rewinds and retries them).
  void forward_batch(std::span<const BatchItem> items);

  // Continuous batching. While at least one member exists, forward() calls from different
  // threads share passes: each chunk waits in a queue, and one waiting thread at a time runs
  // a pass over the queued rows (in arrival order, at most max_rows() rows, at most one
  // prefill chunk — a request of several rows without an undo log — per pass, and of it at
  // most batch_prompt_rows rows when the pass carries other rows too), after
  // waiting up to batch_wait_us for every member to queue its rows. A member is a thread
  // that will keep calling forward() (a server slot, a benchmark stream): the pass waits
  // for members only, never for idle threads. Results are those of each session alone. A
  // pass that fails is taken back in every session and each request is rerun alone, so a
  // fault costs only the request it belongs to; its session is left as before the pass (a
  // request with its own undo log begun before the pass gets the error instead of a rerun,
  // and rewinds itself).
  class BatchMember {
   public:
    BatchMember() = default;
    explicit BatchMember(Engine* engine);
    BatchMember(BatchMember&& o) noexcept : engine_(std::exchange(o.engine_, nullptr)) {}
    BatchMember& operator=(BatchMember&& o) noexcept;
    ~BatchMember() { leave(); }
    void leave();

   private:
    Engine* engine_ = nullptr;
  };
  BatchMember join_batch() { return BatchMember(this); }
  // Passes run so far and the rows they carried (batched or not): rows / passes is the
  // mean batch.
  struct PassCounts {
    uint64_t passes = 0, rows = 0, parts = 0;
    uint64_t widest_shared = 0;  // the most rows of a pass that carried several sessions
    // Shared passes started before every session of the previous pass had queued again (each
    // such session's stream waits a whole extra pass: an inter-token gap of two passes).
    uint64_t returns_missed = 0;
  };
  PassCounts pass_counts() const;
  // The bytes the logs of shared passes hold (one per session of a pass, reserved when a
  // member joins or a pass is first that wide, for a decode row or batch_prompt_rows rows:
  // UndoLog::most_for): what the planner reserves per session slot beside its state.
  uint64_t batch_undo_bytes() const;

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
  // One chunk of forward(): straight to run_pass, or through the batch queue.
  void forward_chunk(const BatchItem& item);
  // The batch queue (engine_batch.cc): queue `item`, lead passes until it is done.
  void forward_batched(const BatchItem& item);
  struct BatchRequest;
  void lead_batch(std::unique_lock<std::mutex>& lock);
  void run_requests(std::span<BatchRequest* const> requests);
  void reserve_batch_undo(int parts);  // the logs of a pass with this many parts
  UndoLog& batch_undo_log(size_t part);
  // One pass of T <= max_rows tokens of one or more sessions: embed -> layers -> (logits)
  // hc_head -> norm -> head. Callers hold forward_mutex_.
  void run_pass(std::span<const BatchItem> items);
  void embed(const Pass& p, std::span<const int32_t> tokens);
  void rope_angles(const Pass& p);
  void layer(const Pass& p, const LayerWeights& L, std::span<const int32_t> tokens, LayerState* const* states,
             ExpertProvider& experts);
  void head(const Pass& p, LogitRows rows, float* logits);
  // The output head of a pass of several sessions: the rows each item asks for, in groups of
  // ws.kHeadRows through ws.batch_logits.
  void head_parts(const Pass& p, std::span<const BatchItem> items);
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
  // Hands the provider a guess of layer l's routed experts, at most `room` of them (-1: no
  // limit; 0: no guess). Never changes results. Returns how many experts layer l is guessed
  // to use (0 when not guessed).
  int guess_experts(const Pass& p, int l, std::span<const int32_t> tokens, int64_t room);

  std::unique_ptr<const Checkpoint> checkpoint_;  // first: the weights and experts point into it
  EngineOptions options_;
  ModelWeights weights_;
  std::unique_ptr<ExpertProvider> experts_;
  std::unique_ptr<ExpertProvider> mtp_experts_;  // the MTP layer's routed experts, resident (null: no MTP)
  Rope ropes_[2];  // sliding-only layers, compressed layers
  ThreadPool pool_;
  ForwardWorkspace workspace_;
  mutable std::mutex forward_mutex_;
  // The pass's parts and per-part scratch (reserved for max_rows parts: never allocates).
  std::vector<PassPart> parts_;
  std::vector<LayerState*> layer_states_;
  std::vector<float*> head_rows_out_;
  PassCounts counts_;  // under forward_mutex_ (read under it too)
  mutable std::mutex counts_mutex_;

  // Continuous batching (engine_batch.cc), under batch_mutex_.
  mutable std::mutex batch_mutex_;
  std::condition_variable batch_cv_;
  std::vector<BatchRequest*> batch_queue_;
  int batch_members_ = 0;
  bool batch_leading_ = false;
  // The leader's (one at a time): the requests of the pass, their items, undo logs, positions.
  std::vector<BatchRequest*> batch_taken_;
  // The sessions whose requests the previous pass finished (their threads come back after
  // sampling) and the passes that started without one of them.
  std::vector<const SessionState*> batch_returning_;
  uint64_t batch_returns_missed_ = 0;
  std::vector<BatchItem> batch_items_;
  std::vector<UndoLog> batch_undo_;  // [max_rows] each reserved for batch_undo_size_ when first used
  std::vector<char> batch_undo_ready_;
  UndoLog::Size batch_undo_size_;
  std::vector<int64_t> batch_start_;
};

}  // namespace dsv4
