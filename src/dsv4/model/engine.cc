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
                 pool_size(options), options.mtp && checkpoint_->has_mtp()) {}

SessionState Engine::new_session() const { return SessionState::create(config(), workspace_.context, has_mtp()); }

void Engine::forward(SessionState& s, std::span<const int32_t> tokens, float* logits, LogitRows rows,
                     int64_t chunk, UndoLog* undo) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  const ModelConfig& c = config();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id {} at index {} is outside the vocabulary [0, {})", tokens[i], i, c.vocab_size);
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
    forward_pass(s, tokens.subspan(begin, len), out, rows, undo);
  }
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
// hc_head -> norm -> head.
void Engine::forward_pass(SessionState& s, std::span<const int32_t> tokens, float* logits, LogitRows rows,
                          UndoLog* undo) {
  const ModelConfig& c = config();
  const Pass p{c, options_.numerics, pool_, workspace_, ropes_, static_cast<int64_t>(tokens.size()), s.position, undo};
  embed(p, tokens);
  for (int l = 0; l < c.num_layers; ++l) layer(p, weights_.layers[l], tokens, s.layers[l], *experts_);
  if (has_mtp()) keep_streams(p, s);
  s.position += p.T;
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  if (logits) head(p, rows, logits);
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
  for (int64_t t = 0; t < p.T; ++t)
    for (int v = 0; v < 2; ++v)
      ropes_[v].angles(p.pos0 + t, workspace_.rope_cos[v].data() + t * half, workspace_.rope_sin[v].data() + t * half);
}

// One layer (spec §3): the streams X go through mHC around attention, then around the MoE.
void Engine::layer(const Pass& p, const LayerWeights& L, std::span<const int32_t> tokens, LayerState& state,
                   ExpertProvider& experts) {
  ForwardWorkspace& ws = workspace_;
  const int l = L.spec.index;
  const int64_t D = p.c.hidden_size;
  const float eps = static_cast<float>(p.c.rms_norm_eps);
  float *X = ws.X.data(), *x = ws.x.data(), *y = ws.y.data();
  const HcMix mix = workspace_mix(ws);

  if (!L.spec.is_mtp) guess_experts(p, l, tokens);
  hc_pre(p, L.hc_attn, X, mix, x);
  ops::rms_norm_rows(x, L.attn_norm.data(), p.T, D, eps, x);
  attention(p, L, x, state, y);
  if (const int64_t i = find_nonfinite_f32(y, p.T * D); i >= 0)
    fail("layer {}: attention produced a non-finite value (token {} of the pass)", l, i / D);
  hc_post(p, mix, y, X);

  if (l + 1 < p.c.num_layers) guess_experts(p, l + 1, tokens);
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
// See expert_lookahead.h for how good each guess is.
void Engine::guess_experts(const Pass& p, int l, std::span<const int32_t> tokens) {
  const ExpertLookahead mode = options_.lookahead;
  if (mode == ExpertLookahead::kOff || !experts_->wants_predictions()) return;
  if (mode == ExpertLookahead::kExact && !weights_.layers[l].spec.hash_routed) return;
  predict_layer_experts(p, weights_.layers[l], workspace_.X.data(), tokens, *experts_, options_.early_hash_reads);
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

void Engine::head_rows(const Pass& p, const Matrix& fn, const std::vector<float>& base, const std::vector<float>& scale,
                       const std::vector<float>& norm, const float* X, int64_t n, float* logits) {
  const int64_t D = p.c.hidden_size;
  float* h = workspace_.x.data();  // [n, D]
  hc_head(p, fn, base, scale, X, n, h);
  ops::rms_norm_rows(h, norm.data(), n, D, static_cast<float>(p.c.rms_norm_eps), h);
  kernels::matmul(weights_.head, h, n, logits, kernels::Numerics::kReference, &pool_);
}

}  // namespace dsv4
