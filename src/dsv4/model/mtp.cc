// The MTP drafter (spec §4.1): the checkpoint's mtp.0 layer predicts the token after next
// from the main model's pre-head streams h_i at position i and the embedding of t_{i+1}:
//
//   X      = h_proj · RMSNorm_hnorm(h_i)  +  broadcast over streams (e_proj · RMSNorm_enorm(embed[t_{i+1}]))
//   X      = Block_mtp(X)                     a full mHC block: sliding-window attention + MoE
//   logits = head · RMSNorm_norm(HCHead_mtp(X))   the shared output head
//
// Its block has its own sliding window (LayerState of the MTP layer), rotated at position i,
// so every position the session is fed must pass through it once (with the token that
// followed) before its drafts are good: the engine keeps the main model's streams of the last
// window positions in the session (MtpState), and mtp_draft first brings the MTP window up to
// the session. A sliding-window block's key at i depends only on its input at i, and a query
// sees the last `window` positions, so a window's worth of catch-up is all that is ever needed.
// Drafts longer than one feed the MTP's own output streams back as h (as vLLM does); those
// chained rows are taken back from the window before mtp_draft returns. Drafts never change
// what the main model computes: they only choose which tokens a verify pass feeds.
#include <algorithm>

#include "dsv4/model/engine.h"
#include "dsv4/model/mhc.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

// Chained drafts one mtp_draft call makes at most (the workspace's mtp_saved holds their rows).
constexpr int kMaxChain = ForwardWorkspace::kMtpMaxChain;

int32_t greedy(const float* logits, int64_t V) {
  return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);  // lowest id on ties
}

}  // namespace

void Engine::keep_streams(const Pass& p, SessionState& s) {
  const int64_t W = p.c.sliding_window, row = int64_t(p.c.hc_mult) * p.c.hidden_size;
  for (int64_t t = std::max<int64_t>(0, p.T - W); t < p.T; ++t) {
    const int64_t pos = p.pos0 + t, r = pos % W;
    std::copy_n(workspace_.X.data() + p.row(t) * row, row, s.mtp.streams.data() + r * row);
    s.mtp.stream_position[static_cast<size_t>(r)] = pos;
  }
}

// One MTP pass over rows whose h streams are in ws.X [T, hc, D] and whose next tokens are
// in ws.mtp_next [T]: the input projections, the block, the head.
void Engine::mtp_pass(SessionState& s, int64_t from, int64_t end, int32_t after_last, float* logits,
                      LogitRows rows) {
  const ModelConfig& c = config();
  ForwardWorkspace& ws = workspace_;
  const LayerWeights& L = weights_.layers[static_cast<size_t>(c.num_layers)];
  const MtpWeights& m = *L.mtp;
  const int64_t D = c.hidden_size, hc = c.hc_mult, T = end - from, W = c.sliding_window;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const Pass p{c, options_.numerics, pool_, ws, ropes_, T, from, nullptr};

  // Inputs: h from the session's stream ring (the caller put chained rows there too), the
  // token after each position.
  float *X = ws.X.data(), *x = ws.x.data(), *y = ws.y.data();
  int32_t* next = ws.mtp_next.data();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = from + t;
    std::copy_n(s.mtp.streams.data() + (pos % W) * hc * D, hc * D, X + t * hc * D);
    next[t] = pos + 1 < s.position ? s.tokens[static_cast<size_t>(pos + 1)] : after_last;
  }
  rope_angles(p);

  // X = h_proj · hnorm(h) per stream (each stream's T rows gathered so one product covers them).
  float* h_normed = ws.mix_normed.data();  // [hc, T, D]
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j) ops::rms_norm(X + (t * hc + j) * D, m.hnorm.data(), D, eps, h_normed + (j * T + t) * D);
  for (int64_t j = 0; j < hc; ++j) {
    kernels::matmul(m.h_proj, h_normed + j * T * D, T, x, p.numerics, &pool_, 0, &ws.dense_in);
    for (int64_t t = 0; t < T; ++t) std::copy_n(x + t * D, D, X + (t * hc + j) * D);
  }
  // + e_proj · enorm(embed[next]), the same for every stream.
  for (int64_t t = 0; t < T; ++t) weights_.embed.row(next[t], y + t * D, ws.embed_raw.data());
  ops::rms_norm_rows(y, m.enorm.data(), T, D, eps, y);
  kernels::matmul(m.e_proj, y, T, x, p.numerics, &pool_, 0, &ws.dense_in);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hc; ++j) {
      float* Xj = X + (t * hc + j) * D;
      for (int64_t i = 0; i < D; ++i) Xj[i] += x[t * D + i];
    }

  LayerState* state = &s.layers[static_cast<size_t>(c.num_layers)];
  layer(p, L, std::span<const int32_t>(next, static_cast<size_t>(T)), &state, *mtp_experts_);
  std::copy_n(X + (T - 1) * hc * D, hc * D, ws.mtp_chain.data());  // the last row's streams, for chaining
  if (!logits) return;
  const int64_t first = rows == LogitRows::kAll ? 0 : T - 1;
  head_rows(p, m.hc_head_fn, m.hc_head_base, m.hc_head_scale, m.norm, X + first * hc * D, T - first, logits);
}

void Engine::mtp_catch_up(SessionState& s, int64_t end, int32_t after_last, float* logits, LogitRows rows) {
  const int64_t W = config().sliding_window;
  // From where the MTP window stopped (a window back at most; the last position always, as
  // its token after may be new), then on from the oldest of the consecutive positions whose
  // streams the ring holds (a session whose ring was never filled drafts from less).
  int64_t from = std::clamp<int64_t>(s.mtp.position, std::max<int64_t>(0, end - W), end - 1);
  auto held = [&](int64_t pos) { return s.mtp.stream_position[static_cast<size_t>(pos % W)] == pos; };
  if (!held(end - 1)) fail("internal: the MTP has no streams for position {}", end - 1);
  for (int64_t pos = end - 1; pos > from; --pos)
    if (!held(pos - 1)) {
      from = pos;
      break;
    }
  const int64_t V = config().vocab_size, step = workspace_.max_rows;
  for (int64_t begin = from; begin < end; begin += step) {
    const int64_t stop = std::min(end, begin + step);
    float* out = nullptr;
    if (logits && rows == LogitRows::kAll) out = logits + (begin - from) * V;
    if (logits && rows == LogitRows::kLast && stop == end) out = logits;
    mtp_pass(s, begin, stop, after_last, out, rows);
  }
  s.mtp.position = std::max(s.mtp.position, end);
}

int Engine::mtp_draft(SessionState& s, int32_t next, int k, int32_t* out) {
  if (!has_mtp() || k <= 0 || s.position == 0) return 0;
  std::lock_guard<std::mutex> lock(forward_mutex_);
  const ModelConfig& c = config();
  if (next < 0 || next >= c.vocab_size) fail("token id {} is outside the vocabulary [0, {})", next, c.vocab_size);
  const int64_t V = c.vocab_size, W = c.sliding_window, hd = c.head_dim, row = int64_t(c.hc_mult) * c.hidden_size;
  k = static_cast<int>(std::min<int64_t>({k, W - 1, context_limit() - s.position}));
  if (k <= 0) return 0;
  float* logits = workspace_.mtp_logits.data();
  mtp_catch_up(s, s.position, next, logits, LogitRows::kLast);
  out[0] = greedy(logits, V);
  if (k == 1) return 1;

  // Chained drafts write the MTP window (and the stream ring) at positions past the session:
  // saved here, put back below, so the session is as if they never ran.
  LayerState& window = s.layers[static_cast<size_t>(c.num_layers)];
  float* saved_kv = workspace_.mtp_saved.data();             // [k-1, hd]
  float* saved_streams = saved_kv + static_cast<size_t>(k - 1) * hd;  // [k-1, hc*D]
  std::vector<int64_t>& held = s.mtp.stream_position;
  int64_t saved_position[kMaxChain];
  const int chained = std::min(k - 1, kMaxChain);
  for (int i = 0; i < chained; ++i) {
    const int64_t r = (s.position + i) % W;
    std::copy_n(window.window_kv.data() + r * hd, hd, saved_kv + i * hd);
    std::copy_n(s.mtp.streams.data() + r * row, row, saved_streams + i * row);
    saved_position[i] = held[static_cast<size_t>(r)];
  }
  const int64_t keep_position = s.mtp.position;
  for (int i = 0; i < chained; ++i) {
    // Position s.position + i: the MTP's own streams from the row before, the draft before.
    const int64_t pos = s.position + i, r = pos % W;
    std::copy_n(workspace_.mtp_chain.data(), row, s.mtp.streams.data() + r * row);
    held[static_cast<size_t>(r)] = pos;
    mtp_pass(s, pos, pos + 1, out[i], logits, LogitRows::kLast);
    out[i + 1] = greedy(logits, V);
  }
  for (int i = chained - 1; i >= 0; --i) {
    const int64_t r = (s.position + i) % W;
    std::copy_n(saved_kv + i * hd, hd, window.window_kv.data() + r * hd);
    std::copy_n(saved_streams + i * row, row, s.mtp.streams.data() + r * row);
    held[static_cast<size_t>(r)] = saved_position[i];
  }
  s.mtp.position = keep_position;
  return chained + 1;
}

void Engine::mtp_score(std::span<const int32_t> tokens, float* logits) {
  if (!has_mtp()) fail("{}: the checkpoint has no MTP layer, or the engine was made without it", checkpoint_->dir());
  if (tokens.size() < 2) fail("MTP logits need at least 2 tokens, got {}", tokens.size());
  SessionState s = new_session();
  const int64_t n = static_cast<int64_t>(tokens.size()), V = config().vocab_size;
  // Passes no longer than the window, so the ring holds every row of a pass for the MTP.
  const int64_t step = std::min<int64_t>(workspace_.max_rows, config().sliding_window);
  for (int64_t begin = 0; begin < n; begin += step) {
    const int64_t len = std::min(step, n - begin);
    forward(s, tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(len)), nullptr, LogitRows::kLast, len);
    std::lock_guard<std::mutex> lock(forward_mutex_);
    const int64_t end = std::min(begin + len, n - 1);  // the last position has no token after it
    if (end <= begin) break;
    const int32_t after = tokens[static_cast<size_t>(end)];
    for (int64_t b = begin; b < end; b += workspace_.max_rows) {
      const int64_t e = std::min(end, b + workspace_.max_rows);
      mtp_pass(s, b, e, after, logits + b * V, LogitRows::kAll);
    }
    s.mtp.position = end;
  }
}

}  // namespace dsv4
