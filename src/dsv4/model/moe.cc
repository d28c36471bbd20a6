#include "dsv4/model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dsv4/io/value_check.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/error.h"
#include "dsv4/util/thread_pool.h"

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
void feed_forward(const Pass& p, const Matrix& w1, const Matrix& w3, const Matrix& w2, const float* x, int64_t n,
                  float limit, float* y) {
  const int64_t I = w1.rows;
  const kernels::Numerics numerics = p.numerics;
  float* g = p.ws.ffn_g.data();
  float* u = p.ws.ffn_u.data();
  // w1 and w3 share x: quantize it once and run both products in one pass over the pool
  // (the same bits as two matmul calls).
  const bool quantize_x = kernels::uses_quantized_input(w1, numerics) || kernels::uses_quantized_input(w3, numerics);
  kernels::prepare_input(x, n, w1.cols, quantize_x ? numerics : kernels::Numerics::kReference, &p.ws.ffn_in, &p.pool);
  const kernels::MatmulTask up[2] = {{&w1, &p.ws.ffn_in, g, 0}, {&w3, &p.ws.ffn_in, u, 0}};
  kernels::matmul_batch(up, 2, numerics, &p.pool);
  swiglu(g, u, n * I, limit);
  const bool quantize_g = kernels::uses_quantized_input(w2, numerics);
  kernels::prepare_input(g, n, I, quantize_g ? numerics : kernels::Numerics::kReference, &p.ws.down_in, &p.pool);
  kernels::matmul(w2, p.ws.down_in, y, numerics, &p.pool);
}

}  // namespace

void router_scores(const float* logits, int E, float* score) {
  for (int e = 0; e < E; ++e) score[e] = std::sqrt(ops::softplus(logits[e]));
}

void top_biased_experts(const float* score, const std::vector<float>& bias, int width, float* biased,
                        int32_t* order, int32_t* out) {
  const int E = static_cast<int>(bias.size());
  for (int e = 0; e < E; ++e) biased[e] = score[e] + bias[e];
  std::iota(order, order + E, 0);
  width = std::min(width, E);
  std::partial_sort(order, order + width, order + E, [&](int32_t a, int32_t b) {
    return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
  });
  std::copy_n(order, width, out);
}

void route(const Pass& p, const MoeWeights& w, const float* x, std::span<const int32_t> tokens, bool hash_routed) {
  ForwardWorkspace& ws = p.ws;
  const int64_t T = p.T;
  const int E = p.c.n_routed_experts, K = p.c.n_experts_per_token;
  float* logits = ws.router_logits.data();  // [T, E]
  kernels::matmul(w.gate, x, T, logits, kernels::Numerics::kReference, &p.pool);
  float* score = ws.router_score.data();
  for (int64_t t = 0; t < T; ++t) {
    router_scores(logits + t * E, E, score);
    int32_t* chosen = ws.route_experts.data() + t * K;
    if (hash_routed) {
      std::copy_n(w.tid2eid.data() + int64_t(tokens[t]) * K, K, chosen);
    } else {
      top_biased_experts(score, w.bias, K, ws.router_biased.data(), ws.router_order.data(), chosen);
    }
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += score[chosen[k]];
    for (int k = 0; k < K; ++k)
      ws.route_weights[t * K + k] = score[chosen[k]] / (sum + 1e-20f) * static_cast<float>(p.c.routed_scaling_factor);
  }
}

void moe(const Pass& p, const LayerWeights& L, const float* x, std::span<const int32_t> tokens,
         ExpertProvider& experts, float* out) {
  ForwardWorkspace& ws = p.ws;
  const MoeWeights& w = L.moe;
  const int layer = L.spec.index;
  const int64_t T = p.T, D = p.c.hidden_size;
  const int E = p.c.n_routed_experts, K = p.c.n_experts_per_token;
  const float limit = static_cast<float>(p.c.swiglu_limit);
  route(p, w, x, tokens, L.spec.hash_routed);
  const int32_t* chosen_all = ws.route_experts.data();

  // Group the pass's (token, slot) pairs by expert (CSR, entries t*K + k ascending), and list
  // the experts needed.
  int32_t* offset = ws.user_offset.data();  // [E + 1]
  std::fill(offset, offset + E + 1, 0);
  for (int64_t i = 0; i < T * K; ++i) ++offset[chosen_all[i] + 1];
  for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
  int32_t* fill = ws.pending.data();  // next free entry per expert (pending is reused below)
  std::copy_n(offset, E, fill);
  for (int64_t i = 0; i < T * K; ++i) ws.users[fill[chosen_all[i]]++] = static_cast<int32_t>(i);
  int n_needed = 0;
  for (int e = 0; e < E; ++e)
    if (offset[e + 1] > offset[e]) ws.needed[n_needed++] = e;
  experts.prefetch(layer, std::span<const int>(ws.needed.data(), static_cast<size_t>(n_needed)));

  // Compute whatever is in memory while the rest is read: the shared expert first, then
  // each routed expert as soon as it is here (in ascending id among those that are). The
  // outputs are kept per (token, slot) and summed below in the reference order, so the
  // order of computation never changes a bit.
  float* shared = ws.shared_out.data();  // [T, D]
  feed_forward(p, w.shared_w1, w.shared_w3, w.shared_w2, x, T, limit, shared);
  if (const int64_t i = find_nonfinite_f32(shared, T * D); i >= 0)
    fail("layer {}: the shared expert produced a non-finite value (token {} of the pass)", layer, i / D);

  float* routed = ws.routed_out.data();  // [T*K, D]
  int32_t* pending = ws.pending.data();
  std::copy_n(ws.needed.data(), n_needed, pending);
  int n_pending = n_needed;
  while (n_pending > 0) {
    p.check_cancel();
    int next = 0;  // nothing here yet: wait for the first
    for (int i = 0; i < n_pending; ++i)
      if (experts.ready(layer, pending[i])) {
        next = i;
        break;
      }
    const int e = pending[next];
    std::copy(pending + next + 1, pending + n_pending, pending + next);
    --n_pending;
    const int32_t* u = ws.users.data() + offset[e];
    const int64_t n = offset[e + 1] - offset[e];
    float* xs = ws.expert_x.data();
    float* ys = ws.expert_y.data();
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + (u[i] / K) * D, D, xs + i * D);
    const ExpertWeights& ew = experts.acquire(layer, e);
    feed_forward(p, ew.w1, ew.w3, ew.w2, xs, n, limit, ys);
    experts.release(layer, e);
    if (const int64_t i = find_nonfinite_f32(ys, n * D); i >= 0)
      fail("layer {}: routed expert {} produced a non-finite value (token {} of the pass)", layer, e, u[i / D] / K);
    for (int64_t i = 0; i < n; ++i) std::copy_n(ys + i * D, D, routed + int64_t(u[i]) * D);
  }

  // y = sum over the token's experts in ascending id (slot order among equal ids), then
  // + shared, as the reference accumulates.
  int32_t* slots = ws.slot_order.data();
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* chosen = chosen_all + t * K;
    for (int k = 0; k < K; ++k) {  // insertion sort: stable, in place, K is small
      int j = k;
      for (; j > 0 && chosen[slots[j - 1]] > chosen[k]; --j) slots[j] = slots[j - 1];
      slots[j] = k;
    }
    float* o = out + t * D;
    std::fill(o, o + D, 0.0f);
    for (int i = 0; i < K; ++i) {
      const int k = slots[i];
      const float weight = ws.route_weights[t * K + k];
      const float* y = routed + (t * K + k) * D;
      for (int64_t d = 0; d < D; ++d) o[d] += y[d] * weight;
    }
    const float* sh = shared + t * D;
    for (int64_t d = 0; d < D; ++d) o[d] += sh[d];
  }
}

}  // namespace dsv4
