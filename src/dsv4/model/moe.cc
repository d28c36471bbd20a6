#include "dsv4/model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsv4/model/ops.h"

namespace dsv4 {
namespace {

// a = silu(min(g, L)) * clamp(u, -L, L), in place into g. L = 0 disables the clamp.
void swiglu(float* g, const float* u, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    float gate = g[i], up = u[i];
    if (limit > 0) {
      gate = std::min(gate, limit);
      up = std::clamp(up, -limit, limit);
    }
    g[i] = ops::silu(gate) * up;
  }
}

// y[n, D] = w2 · swiglu(w1·x, w3·x) for n rows of x.
void feed_forward(const Matrix& w1, const Matrix& w3, const Matrix& w2, const float* x, int64_t n, float limit,
                  kernels::Numerics numerics, ThreadPool* pool, float* y) {
  const int64_t I = w1.rows;
  std::vector<float> g(static_cast<size_t>(n * I)), u(static_cast<size_t>(n * I));
  // w1 and w3 share x: quantize it once and run both products in one pass over the pool
  // (the same bits as two matmul calls).
  kernels::QuantizedInput in;
  const bool quantize = kernels::uses_quantized_input(w1, numerics) || kernels::uses_quantized_input(w3, numerics);
  kernels::prepare_input(x, n, w1.cols, quantize ? numerics : kernels::Numerics::kReference, &in, pool);
  const kernels::MatmulTask up[2] = {{&w1, &in, g.data(), 0}, {&w3, &in, u.data(), 0}};
  kernels::matmul_batch(up, 2, numerics, pool);
  swiglu(g.data(), u.data(), n * I, limit);
  kernels::matmul(w2, g.data(), n, y, numerics, pool);
}

}  // namespace

void router_scores(const float* logits, int E, float* score) {
  for (int e = 0; e < E; ++e) score[e] = std::sqrt(ops::softplus(logits[e]));
}

std::vector<int32_t> top_biased_experts(const float* score, const std::vector<float>& bias, int width) {
  const int E = static_cast<int>(bias.size());
  std::vector<float> biased(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) biased[e] = score[e] + bias[e];
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  width = std::min(width, E);
  std::partial_sort(order.begin(), order.begin() + width, order.end(), [&](int32_t a, int32_t b) {
    return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
  });
  order.resize(static_cast<size_t>(width));
  return order;
}

Routing route(const ModelConfig& c, const MoeWeights& w, const float* x, std::span<const int32_t> tokens,
              bool hash_routed, ThreadPool* pool) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int E = c.n_routed_experts, K = c.n_experts_per_token;
  std::vector<float> logits(static_cast<size_t>(T * E));
  kernels::matmul(w.gate, x, T, logits.data(), kernels::Numerics::kReference, pool);
  Routing r;
  r.experts.resize(static_cast<size_t>(T * K));
  r.weights.resize(static_cast<size_t>(T * K));
  std::vector<float> score(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    router_scores(logits.data() + t * E, E, score.data());
    int32_t* chosen = r.experts.data() + t * K;
    if (hash_routed) {
      std::copy_n(w.tid2eid.data() + int64_t(tokens[t]) * K, K, chosen);
    } else {
      const std::vector<int32_t> top = top_biased_experts(score.data(), w.bias, K);
      std::copy_n(top.begin(), K, chosen);
    }
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += score[chosen[k]];
    for (int k = 0; k < K; ++k)
      r.weights[t * K + k] = score[chosen[k]] / (sum + 1e-20f) * static_cast<float>(c.routed_scaling_factor);
  }
  return r;
}

void moe(const ModelConfig& c, const LayerWeights& L, const float* x, std::span<const int32_t> tokens,
         kernels::Numerics numerics, ThreadPool* pool, ExpertProvider& experts, float* out) {
  const MoeWeights& w = L.moe;
  const int layer = L.spec.index;
  const int64_t T = static_cast<int64_t>(tokens.size()), D = c.hidden_size;
  const int E = c.n_routed_experts, K = c.n_experts_per_token;
  const float limit = static_cast<float>(c.swiglu_limit);
  Routing r = route(c, w, x, tokens, L.spec.hash_routed, pool);

  // Group the chunk's (token, slot) pairs by expert.
  std::vector<std::vector<int64_t>> users(static_cast<size_t>(E));  // entries: t*K + k
  for (int64_t i = 0; i < T * K; ++i) users[r.experts[i]].push_back(i);
  std::vector<int> needed;
  for (int e = 0; e < E; ++e)
    if (!users[e].empty()) needed.push_back(e);
  experts.prefetch(layer, needed);

  // Compute whatever is in memory while the rest is read: the shared expert first, then
  // each routed expert as soon as it is here (in ascending id among those that are). The
  // outputs are kept per (token, slot) and summed below in the reference order, so the
  // order of computation never changes a bit.
  std::vector<float> shared(static_cast<size_t>(T * D));
  feed_forward(w.shared_w1, w.shared_w3, w.shared_w2, x, T, limit, numerics, pool, shared.data());

  std::vector<float> routed(static_cast<size_t>(T * K * D));  // [T*K, D]
  std::vector<float> xs, ys;
  std::vector<int> pending = needed;
  while (!pending.empty()) {
    auto next = std::find_if(pending.begin(), pending.end(), [&](int e) { return experts.ready(layer, e); });
    if (next == pending.end()) next = pending.begin();  // nothing here yet: wait for the first
    const int e = *next;
    pending.erase(next);
    const std::vector<int64_t>& u = users[e];
    const int64_t n = static_cast<int64_t>(u.size());
    xs.resize(static_cast<size_t>(n * D));
    ys.resize(static_cast<size_t>(n * D));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + (u[i] / K) * D, D, xs.data() + i * D);
    const ExpertWeights& ew = experts.acquire(layer, e);
    feed_forward(ew.w1, ew.w3, ew.w2, xs.data(), n, limit, numerics, pool, ys.data());
    experts.release(layer, e);
    for (int64_t i = 0; i < n; ++i) std::copy_n(ys.data() + i * D, D, routed.data() + u[i] * D);
  }

  // y = sum over the token's experts in ascending id (slot order among equal ids), then
  // + shared, as the reference accumulates.
  std::vector<int> slots(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* chosen = r.experts.data() + t * K;
    std::iota(slots.begin(), slots.end(), 0);
    std::stable_sort(slots.begin(), slots.end(), [&](int a, int b) { return chosen[a] < chosen[b]; });
    float* o = out + t * D;
    std::fill(o, o + D, 0.0f);
    for (int k : slots) {
      const float weight = r.weights[t * K + k];
      const float* y = routed.data() + (t * K + k) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += y[d] * weight;
    }
    const float* sh = shared.data() + t * D;
    for (int64_t d = 0; d < D; ++d) o[d] += sh[d];
  }
}

}  // namespace dsv4
