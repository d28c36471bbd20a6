#include "dsv4/model/engine.h"

#include <algorithm>
#include <cstdio>

#include "dsv4/kernels/formats.h"
#include "dsv4/model/attention.h"
#include "dsv4/model/expert_lookahead.h"
#include "dsv4/model/mhc.h"
#include "dsv4/model/moe.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/error.h"

namespace dsv4 {

std::unique_ptr<Engine> Engine::open(const std::string& dir, const EngineOptions& options,
                                     std::unique_ptr<ExpertProvider> experts) {
  Checkpoint ck = Checkpoint::open(dir);
  return std::unique_ptr<Engine>(new Engine(std::move(ck), options, std::move(experts)));
}

namespace {

std::optional<MemoryPlan> plan_if_budgeted(const Checkpoint& ck, const EngineOptions& o, bool have_provider) {
  if (have_provider || !o.ram) return std::nullopt;
  MemoryPlan plan = plan_memory(ck, parse_ram(*o.ram), o.workload);
  if (o.print_plan) std::fprintf(stderr, "%s\n", plan.summary().c_str());
  return plan;
}

}  // namespace

Engine::Engine(Checkpoint ck, const EngineOptions& options, std::unique_ptr<ExpertProvider> experts)
    : checkpoint_(std::move(ck)),
      options_(options),
      plan_(plan_if_budgeted(checkpoint_, options, experts != nullptr)),
      weights_(ModelWeights::load(checkpoint_)),
      experts_(experts ? std::move(experts)
               : plan_ ? make_planned_provider(checkpoint_, *plan_, options.store)
                       : make_resident_experts(checkpoint_)),
      pool_(options.threads > 0 ? options.threads : available_cpus()) {
  for (const LayerSpec& l : config().layers) ropes_.push_back(Rope::for_layer(config(), l));
}

SessionState Engine::new_session() const {
  SessionState s;
  s.layers.resize(config().layers.size());
  return s;
}

void Engine::forward(SessionState& s, std::span<const int32_t> tokens, float* logits, bool all_positions,
                     int64_t chunk) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  const ModelConfig& c = config();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id {} at index {} is outside the vocabulary [0, {})", tokens[i], i, c.vocab_size);
  if (s.position + static_cast<int64_t>(tokens.size()) > c.max_position_embeddings)
    fail("sequence of {} tokens exceeds the model's context limit of {} tokens", s.position + tokens.size(),
         c.max_position_embeddings);
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (chunk <= 0) chunk = std::max<int64_t>(n, 1);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    const bool last = begin + len == n;
    float* out = nullptr;
    if (logits && all_positions) out = logits + begin * c.vocab_size;
    if (logits && !all_positions && last) out = logits;
    forward_chunk(s, tokens.subspan(begin, len), out, all_positions);
  }
}

// One chunk through the whole model: embed -> layers (mHC around attention and MoE) ->
// hc_head -> norm -> head.
void Engine::forward_chunk(SessionState& s, std::span<const int32_t> tokens, float* logits, bool all_positions) {
  const ModelConfig& c = config();
  const int64_t T = static_cast<int64_t>(tokens.size()), D = c.hidden_size;
  const int hc = c.hc_mult;
  const kernels::Numerics numerics = options_.numerics;
  const int64_t pos0 = s.position;
  ThreadPool* pool = &pool_;

  // Embedding, replicated into hc streams: X [T, hc, D].
  std::vector<float> X(static_cast<size_t>(T * hc * D));
  for (int64_t t = 0; t < T; ++t) {
    float* Xt = X.data() + t * hc * D;
    weights_.embed.row(tokens[t], Xt);
    for (int j = 1; j < hc; ++j) std::copy_n(Xt, D, Xt + j * D);
  }

  std::vector<float> x(static_cast<size_t>(T * D)), y(static_cast<size_t>(T * D));
  HcMix mix;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // Expert I/O lookahead (never changes results): guess each layer's routed experts twice,
  // so the SSD has work while compute runs: first right after the previous layer's
  // attention (the reads then overlap that layer's MoE once its own experts are in), then
  // again at the layer's start, from closer to the router's real input (the reads overlap
  // its attention). See expert_lookahead.h for how good each guess is.
  auto guess = [&](int layer) {
    const ExpertLookahead mode = options_.lookahead;
    if (mode == ExpertLookahead::kOff || !experts_->wants_predictions()) return;
    if (mode == ExpertLookahead::kExact && !weights_.layers[layer].spec.hash_routed) return;
    predict_layer_experts(c, weights_.layers[layer], X.data(), tokens, pool, *experts_);
  };
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = weights_.layers[l];
    guess(l);
    // Attention sub-block.
    hc_pre(c, L.hc_attn, X.data(), T, pool, &mix, x.data());
    for (int64_t t = 0; t < T; ++t) ops::rms_norm(x.data() + t * D, L.attn_norm.data(), D, eps, x.data() + t * D);
    attention(c, L, ropes_[l], x.data(), T, pos0, numerics, pool, &s.layers[l], y.data());
    hc_post(c, mix, y.data(), T, X.data());
    if (l + 1 < c.num_layers) guess(l + 1);
    // MoE sub-block.
    hc_pre(c, L.hc_ffn, X.data(), T, pool, &mix, x.data());
    for (int64_t t = 0; t < T; ++t) ops::rms_norm(x.data() + t * D, L.ffn_norm.data(), D, eps, x.data() + t * D);
    moe(c, L, x.data(), tokens, numerics, pool, *experts_, y.data());
    hc_post(c, mix, y.data(), T, X.data());
  }
  s.position += T;
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  if (!logits) return;

  // Output: only the rows that were asked for.
  const int64_t first = all_positions ? 0 : T - 1;
  const int64_t rows = T - first;
  std::vector<float> h(static_cast<size_t>(rows * D));
  hc_head(c, weights_.hc_head_fn, weights_.hc_head_base, weights_.hc_head_scale, X.data() + first * hc * D, rows,
          pool, h.data());
  for (int64_t t = 0; t < rows; ++t) ops::rms_norm(h.data() + t * D, weights_.norm.data(), D, eps, h.data() + t * D);
  kernels::matmul(weights_.head, h.data(), rows, logits, kernels::Numerics::kReference, pool);
}

}  // namespace dsv4
