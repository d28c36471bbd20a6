#include "dsv4/model/engine.h"

#include <algorithm>

#include "dsv4/io/value_check.h"
#include "dsv4/model/attention.h"
#include "dsv4/model/expert_lookahead.h"
#include "dsv4/model/mhc.h"
#include "dsv4/model/moe.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/error.h"

namespace dsv4 {

std::unique_ptr<Engine> Engine::create(std::unique_ptr<const Checkpoint> checkpoint, const EngineOptions& options,
                                       std::unique_ptr<ExpertProvider> experts) {
  if (!checkpoint || !experts) fail("internal: an engine needs a checkpoint and an expert provider");
  return std::unique_ptr<Engine>(new Engine(std::move(checkpoint), options, std::move(experts)));
}

namespace {
int pool_size(const EngineOptions& o) { return o.threads > 0 ? o.threads : available_cpus(); }
}  // namespace

Engine::Engine(std::unique_ptr<const Checkpoint> checkpoint, const EngineOptions& options,
               std::unique_ptr<ExpertProvider> experts)
    : checkpoint_(std::move(checkpoint)),
      options_(options),
      weights_(ModelWeights::load(*checkpoint_, options.mtp && checkpoint_->has_mtp(), options.faults.get())),
      experts_(std::move(experts)),
      mtp_experts_(options.mtp && checkpoint_->has_mtp()
                       ? make_resident_experts(*checkpoint_, config().num_layers, 1, options.faults.get())
                       : nullptr),
      ropes_{Rope(config().rope_dim, config().rope_theta, YarnConfig{}),
             Rope(config().rope_dim, config().compress_rope_theta, config().yarn)},
      pool_(pool_size(options)),
      workspace_(config(), std::max<int64_t>(1, options.max_rows),
                 std::min<int64_t>(std::max<int64_t>(1, options.context), config().max_position_embeddings),
                 pool_size(options), options.mtp && checkpoint_->has_mtp()) {
  const size_t most_parts = static_cast<size_t>(workspace_.max_rows);  // a part has a row at least
  parts_.reserve(most_parts);
  layer_states_.reserve(most_parts);
  head_rows_out_.reserve(most_parts);
  batch_queue_.reserve(256);
  batch_taken_.reserve(most_parts);
  batch_returning_.reserve(most_parts);
  batch_items_.reserve(most_parts);
  batch_start_.reserve(most_parts);
  batch_undo_.resize(most_parts);
  batch_undo_ready_.assign(most_parts, 0);
  // A batched pass's own logs hold a decode row or a prompt chunk's rows beside other rows
  // (at most batch_prompt_rows): reserved for that many when a member joins or a pass is
  // first that wide (reserve_batch_undo), they never grow.
  batch_undo_size_ = UndoLog::most_for(
      config(), std::clamp<int64_t>(options_.batch_prompt_rows, 1, workspace_.max_rows));
}

SessionState Engine::new_session() const { return SessionState::create(config(), workspace_.context, has_mtp()); }

namespace {
void check_tokens(const ModelConfig& c, std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id {} at index {} is outside the vocabulary [0, {})", tokens[i], i, c.vocab_size);
}
}  // namespace

void Engine::forward(SessionState& s, std::span<const int32_t> tokens, float* logits, LogitRows rows,
                     int64_t chunk, UndoLog* undo, const std::atomic<bool>* cancel) {
  const ModelConfig& c = config();
  check_tokens(c, tokens);
  if (s.position + static_cast<int64_t>(tokens.size()) > context_limit())
    fail("sequence of {} tokens exceeds the context limit of {} tokens", s.position + tokens.size(), context_limit());
  if (s.layers.size() != c.layers.size()) fail("internal: a session not made by this engine's new_session()");
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (chunk <= 0 || chunk > workspace_.max_rows) chunk = workspace_.max_rows;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    const bool last = begin + len == n;
    float* out = nullptr;
    if (logits && rows == LogitRows::kAll) out = logits + begin * c.vocab_size;
    if (logits && rows == LogitRows::kLast && last) out = logits;
    forward_chunk(BatchItem{&s, tokens.subspan(begin, len), out, rows, undo, cancel});
  }
}

void Engine::forward_batch(std::span<const BatchItem> items) {
  const ModelConfig& c = config();
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& item = items[i];
    if (!item.session || item.tokens.empty()) fail("internal: a batch item needs a session and at least one token");
    if (item.session->layers.size() != c.layers.size())
      fail("internal: a session not made by this engine's new_session()");
    check_tokens(c, item.tokens);
    if (item.session->position + static_cast<int64_t>(item.tokens.size()) > context_limit())
      fail("sequence of {} tokens exceeds the context limit of {} tokens",
           item.session->position + item.tokens.size(), context_limit());
    for (size_t j = 0; j < i; ++j)
      if (items[j].session == item.session) fail("internal: a session appears twice in one batched pass");
    total += static_cast<int64_t>(item.tokens.size());
  }
  if (total > workspace_.max_rows)
    fail("internal: a batched pass of {} rows exceeds the workspace's {} rows", total, workspace_.max_rows);
  if (items.empty()) return;
  std::lock_guard<std::mutex> lock(forward_mutex_);
  run_pass(items);
}

uint64_t Engine::batch_undo_bytes() const {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  uint64_t total = 0;
  for (const UndoLog& log : batch_undo_) total += log.bytes();
  return total;
}

Engine::PassCounts Engine::pass_counts() const {
  PassCounts counts;
  {
    std::lock_guard<std::mutex> lock(counts_mutex_);
    counts = counts_;
  }
  std::lock_guard<std::mutex> lock(batch_mutex_);
  counts.returns_missed = batch_returns_missed_;
  return counts;
}

void Engine::anticipate(std::span<const int32_t> tokens) {
  if (!options_.early_hash_reads || options_.lookahead == ExpertLookahead::kOff || !experts_->wants_predictions())
    return;
  const ModelConfig& c = config();
  if (static_cast<int64_t>(tokens.size()) > workspace_.max_rows) return;
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size) return;  // forward() will refuse it
  std::lock_guard<std::mutex> lock(forward_mutex_);  // the lists live in the workspace
  for (int l = 0; l < c.num_layers; ++l)
    if (weights_.layers[l].spec.hash_routed)
      experts_->expect(l, hash_layer_experts(workspace_, c, weights_.layers[l], tokens));
}

// One pass through the whole model: embed -> layers (mHC around attention and MoE) ->
// hc_head -> norm -> head, over the rows of every item (one part per session).
void Engine::run_pass(std::span<const BatchItem> items) {
  const ModelConfig& c = config();
  ForwardWorkspace& ws = workspace_;
  parts_.clear();
  int64_t T = 0;
  for (const BatchItem& item : items) {
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    parts_.push_back(PassPart{item.session, T, n, item.session->position, item.undo});
    std::copy(item.tokens.begin(), item.tokens.end(), ws.pass_tokens.begin() + T);
    T += n;
  }
  const std::span<const int32_t> tokens(ws.pass_tokens.data(), static_cast<size_t>(T));
  const PassPart& first = parts_.front();
  Pass p{c, options_.numerics, pool_, ws, ropes_, T, first.pos0, first.undo};
  if (parts_.size() > 1) p.parts = parts_;
  if (items.size() == 1) p.cancel = items[0].cancel;
  embed(p, tokens);
  for (int l = 0; l < c.num_layers; ++l) {
    p.check_cancel();
    layer_states_.clear();
    for (const PassPart& part : parts_) layer_states_.push_back(&part.session->layers[static_cast<size_t>(l)]);
    layer(p, weights_.layers[l], tokens, layer_states_.data(), *experts_);
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    SessionState& s = *parts_[i].session;
    if (has_mtp()) keep_streams(p.part(i), s);
    s.position += parts_[i].T;
    s.tokens.insert(s.tokens.end(), items[i].tokens.begin(), items[i].tokens.end());
  }
  {
    std::lock_guard<std::mutex> lock(counts_mutex_);
    ++counts_.passes;
    counts_.rows += static_cast<uint64_t>(T);
    counts_.parts += parts_.size();
    if (parts_.size() > 1) counts_.widest_shared = std::max(counts_.widest_shared, static_cast<uint64_t>(T));
  }
  if (items.size() == 1) {
    if (items[0].logits) head(p, items[0].rows, items[0].logits);
  } else {
    head_parts(p, items);
  }
}

// The embedding of each token, replicated into the hc streams: ws.X [T, hc, D]; and the
// rope angles of the pass's positions.
void Engine::embed(const Pass& p, std::span<const int32_t> tokens) {
  const int64_t D = p.c.hidden_size;
  const int hc = p.c.hc_mult;
  for (int64_t t = 0; t < p.T; ++t) {
    float* Xt = workspace_.X.data() + t * hc * D;
    weights_.embed.row(tokens[t], Xt, workspace_.embed_raw.data());
    for (int j = 1; j < hc; ++j) std::copy_n(Xt, D, Xt + j * D);
  }
  rope_angles(p);
}

// The rope angles of the pass's positions for both rope variants.
void Engine::rope_angles(const Pass& p) {
  const int half = p.c.rope_dim / 2;
  for (int64_t t = 0; t < p.T; ++t) {
    const int64_t position = p.position_of_row(p.part_of_row(t), t);
    for (int v = 0; v < 2; ++v)
      ropes_[v].angles(position, workspace_.rope_cos[v].data() + t * half, workspace_.rope_sin[v].data() + t * half);
  }
}

// One layer (spec §3): the streams X go through mHC around attention, then around the MoE.
void Engine::layer(const Pass& p, const LayerWeights& L, std::span<const int32_t> tokens, LayerState* const* states,
                   ExpertProvider& experts) {
  ForwardWorkspace& ws = workspace_;
  const int l = L.spec.index;
  const int64_t D = p.c.hidden_size;
  const float eps = static_cast<float>(p.c.rms_norm_eps);
  float *X = ws.X.data(), *x = ws.x.data(), *y = ws.y.data();
  const HcMix mix = workspace_mix(ws);

  // The guess for the next layer only gets what this layer's experts leave of the cache:
  // reads that this layer's own would evict before the next layer runs are wasted.
  const int64_t capacity = experts_->capacity();
  const int this_layer = L.spec.is_mtp ? 0 : guess_experts(p, l, tokens, capacity);
  hc_pre(p, L.hc_attn, X, mix, x);
  ops::rms_norm_rows(x, L.attn_norm.data(), p.T, D, eps, x);
  attention(p, L, x, states, y);
  if (const int64_t i = find_nonfinite_f32(y, p.T * D); i >= 0)
    fail("layer {}: attention produced a non-finite value (token {} of the pass)", l, i / D);
  hc_post(p, mix, y, X);
  p.check_cancel();

  if (l + 1 < p.c.num_layers) guess_experts(p, l + 1, tokens, capacity < 0 ? -1 : std::max<int64_t>(0, capacity - this_layer));
  hc_pre(p, L.hc_ffn, X, mix, x);
  ops::rms_norm_rows(x, L.ffn_norm.data(), p.T, D, eps, x);
  moe(p, L, x, tokens, experts, y);
  if (const int64_t i = find_nonfinite_f32(y, p.T * D); i >= 0)
    fail("layer {}: the MoE's sum of expert outputs is not finite (token {} of the pass)", l, i / D);
  hc_post(p, mix, y, X);
}

// Expert I/O lookahead (never changes results): each layer's routed experts are guessed
// twice, so the SSD has work while compute runs: right after the previous layer's attention
// (the reads then overlap that layer's MoE once its own experts are in), and again at the
// layer's start, from closer to the router's real input (the reads overlap its attention).
// See expert_lookahead.h for how good each guess is. A cache smaller than a prefill chunk's
// experts of one layer (a 2,048-token chunk uses all 256) keeps no guess for the next layer
// through this layer's MoE: on the 4-layer synthetic checkpoint with 250 slots, 284 of 1,308
// reads were such guesses, evicted unread.
int Engine::guess_experts(const Pass& p, int l, std::span<const int32_t> tokens, int64_t room) {
  const ExpertLookahead mode = options_.lookahead;
  if (mode == ExpertLookahead::kOff || !experts_->wants_predictions() || room == 0) return 0;
  if (mode == ExpertLookahead::kExact && !weights_.layers[l].spec.hash_routed) return 0;
  return predict_layer_experts(p, weights_.layers[l], workspace_.X.data(), tokens, *experts_,
                               options_.early_hash_reads, room);
}

// Output: only the rows that were asked for. logits [rows, V].
void Engine::head(const Pass& p, LogitRows rows, float* logits) {
  const int64_t first = rows == LogitRows::kAll ? 0 : p.T - 1;
  const int64_t n = p.T - first;
  head_rows(p, weights_.hc_head_fn, weights_.hc_head_base, weights_.hc_head_scale, weights_.norm,
            workspace_.X.data() + first * p.c.hc_mult * p.c.hidden_size, n, logits);
  if (const int64_t i = find_nonfinite_f32(logits, n * p.c.vocab_size); i >= 0)
    fail("the output head produced a non-finite logit (token {} of the pass, vocabulary id {})",
         first + i / p.c.vocab_size, i % p.c.vocab_size);
}

void Engine::head_parts(const Pass& p, std::span<const BatchItem> items) {
  const int64_t row = int64_t(p.c.hc_mult) * p.c.hidden_size, V = p.c.vocab_size;
  float* X = workspace_.X.data();
  // The rows asked for, moved to the front of X in order (a row only ever moves down).
  head_rows_out_.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].logits) continue;
    const PassPart& part = parts_[i];
    const int64_t first = items[i].rows == LogitRows::kAll ? 0 : part.T - 1;
    for (int64_t t = first; t < part.T; ++t) {
      const int64_t from = part.row0 + t, to = static_cast<int64_t>(head_rows_out_.size());
      if (from != to) std::copy_n(X + from * row, row, X + to * row);
      head_rows_out_.push_back(items[i].logits + (t - first) * V);
    }
  }
  const int64_t n = static_cast<int64_t>(head_rows_out_.size());
  const int64_t group = static_cast<int64_t>(workspace_.batch_logits.size()) / V;
  float* logits = workspace_.batch_logits.data();
  for (int64_t g = 0; g < n; g += group) {
    const int64_t m = std::min(group, n - g);
    head_rows(p, weights_.hc_head_fn, weights_.hc_head_base, weights_.hc_head_scale, weights_.norm, X + g * row, m,
              logits);
    if (const int64_t i = find_nonfinite_f32(logits, m * V); i >= 0)
      fail("the output head produced a non-finite logit (logits row {} of the pass, vocabulary id {})", g + i / V,
           i % V);
    for (int64_t j = 0; j < m; ++j) std::copy_n(logits + j * V, V, head_rows_out_[static_cast<size_t>(g + j)]);
  }
}

void Engine::head_rows(const Pass& p, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
                       const std::vector<float>& norm, const float* X, int64_t n, float* logits) {
  const int64_t D = p.c.hidden_size;
  float* h = workspace_.x.data();  // [n, D]
  hc_head(p, fn, base, scale, X, n, h);
  ops::rms_norm_rows(h, norm.data(), n, D, static_cast<float>(p.c.rms_norm_eps), h);
  kernels::matmul(weights_.head, h, n, logits, kernels::Numerics::kReference, &pool_);
}

}  // namespace dsv4
