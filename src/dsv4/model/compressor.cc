#include "dsv4/model/compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsv4/model/ops.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4 {
namespace {

// Pools one window into an entry of `dim` floats. Slots are (kv, gate) row pointers with a
// feature offset; the softmax over slots is taken independently for every channel.
struct Slot {
  const float* kv;
  const float* gate;
};

void pool_window(const Slot* slots, int n_slots, int dim, float* out) {
  for (int d = 0; d < dim; ++d) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < n_slots; ++s) mx = std::max(mx, slots[s].gate[d]);
    float denom = 0.0f;
    for (int s = 0; s < n_slots; ++s) denom += std::exp(slots[s].gate[d] - mx);
    float acc = 0.0f;
    for (int s = 0; s < n_slots; ++s) acc += slots[s].kv[d] * (std::exp(slots[s].gate[d] - mx) / denom);
    out[d] = acc;
  }
}

}  // namespace

void compress_tokens(const ModelConfig& c, const CompressorWeights& w, const Rope& rope, const float* x, int64_t T,
                     int64_t pos0, ThreadPool* pool, CompressorState* st) {
  const int m = w.ratio, dim = w.dim;
  const int width = (w.overlap ? 2 : 1) * dim;  // features per token
  if (st->pending_kv.empty()) {
    st->pending_kv.assign(static_cast<size_t>(m) * width, 0.0f);
    st->pending_gate.assign(static_cast<size_t>(m) * width, 0.0f);
    if (w.overlap) {
      st->previous_kv.assign(static_cast<size_t>(m) * dim, 0.0f);
      st->previous_gate.assign(static_cast<size_t>(m) * dim, 0.0f);
    }
  }
  // Projections of the whole chunk at once (float32, as the reference).
  std::vector<float> kv(static_cast<size_t>(T * width)), gate(static_cast<size_t>(T * width));
  kernels::matmul(w.wkv, x, T, kv.data(), kernels::Numerics::kReference, pool);
  kernels::matmul(w.wgate, x, T, gate.data(), kernels::Numerics::kReference, pool);

  std::vector<Slot> slots(static_cast<size_t>(2 * m));
  std::vector<float> pooled(static_cast<size_t>(dim));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = pos0 + t;
    const int slot = static_cast<int>(pos % m);
    float* pk = st->pending_kv.data() + slot * width;
    float* pg = st->pending_gate.data() + slot * width;
    std::copy_n(kv.data() + t * width, width, pk);
    const float* ape = w.ape.data() + slot * width;
    for (int i = 0; i < width; ++i) pg[i] = gate[t * width + i] + ape[i];
    if (slot != m - 1) continue;

    // Window w = pos / m is complete: pool it.
    int n = 0;
    if (w.overlap) {
      if (st->has_previous)
        for (int s = 0; s < m; ++s) slots[n++] = {st->previous_kv.data() + s * dim, st->previous_gate.data() + s * dim};
      for (int s = 0; s < m; ++s)
        slots[n++] = {st->pending_kv.data() + s * width + dim, st->pending_gate.data() + s * width + dim};
    } else {
      for (int s = 0; s < m; ++s) slots[n++] = {st->pending_kv.data() + s * width, st->pending_gate.data() + s * width};
    }
    pool_window(slots.data(), n, dim, pooled.data());

    const int64_t entry = st->n_entries;
    st->entries.resize(static_cast<size_t>((entry + 1) * dim));
    float* e = st->entries.data() + entry * dim;
    ops::rms_norm(pooled.data(), w.norm.data(), dim, static_cast<float>(c.rms_norm_eps), e);
    rope.apply(e, dim, entry * m);
    st->n_entries = entry + 1;

    if (w.overlap) {
      for (int s = 0; s < m; ++s) {
        std::copy_n(st->pending_kv.data() + s * width, dim, st->previous_kv.data() + s * dim);
        std::copy_n(st->pending_gate.data() + s * width, dim, st->previous_gate.data() + s * dim);
      }
      st->has_previous = true;
    }
  }
}

std::vector<std::vector<int32_t>> index_select(const ModelConfig& c, const IndexerWeights& w, const Rope& rope,
                                               const float* x, const float* qr, int64_t T, int64_t pos0,
                                               const CompressorState& keys, kernels::Numerics numerics,
                                               ThreadPool* pool) {
  const int IH = c.index_n_heads, Id = c.index_head_dim, m = w.compressor.ratio;
  std::vector<float> q(static_cast<size_t>(T * IH * Id));
  kernels::matmul(w.wq_b, qr, T, q.data(), numerics, pool);
  std::vector<float> head_weight(static_cast<size_t>(T * IH));
  kernels::matmul(w.weights_proj, x, T, head_weight.data(), kernels::Numerics::kReference, pool);
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(IH));
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(Id));

  std::vector<std::vector<int32_t>> picks(static_cast<size_t>(T));
  auto per_query = [&](int64_t t0, int64_t t1) {
    std::vector<float> scores;
    std::vector<int32_t> order;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = pos0 + t;
      float* qt = q.data() + t * IH * Id;
      RopeAngles angles = rope.angles(pos);
      for (int h = 0; h < IH; ++h) rope.rotate(qt + h * Id, Id, angles);
      const int64_t visible = std::min<int64_t>(keys.n_entries, (pos + 1) / m);
      if (visible <= 0) continue;
      scores.assign(static_cast<size_t>(visible), 0.0f);
      for (int64_t e = 0; e < visible; ++e) {
        const float* k = keys.entries.data() + e * Id;
        float s = 0.0f;
        for (int h = 0; h < IH; ++h) {
          float dot = kernels::dot(qt + h * Id, k, Id);
          s += (std::max(dot, 0.0f) * score_scale) * (head_weight[t * IH + h] * weight_scale);
        }
        scores[e] = s;
      }
      const int64_t k = std::min<int64_t>(c.index_topk, visible);
      order.resize(static_cast<size_t>(visible));
      for (int64_t e = 0; e < visible; ++e) order[e] = static_cast<int32_t>(e);
      // Highest score first; equal scores keep the lower index (a fixed, documented tie rule).
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
      });
      std::vector<int32_t>& chosen = picks[t];
      chosen.assign(order.begin(), order.begin() + k);
      std::sort(chosen.begin(), chosen.end());
    }
  };
  if (pool) {
    pool->parallel_for(T, 1, per_query);
  } else {
    per_query(0, T);
  }
  return picks;
}

}  // namespace dsv4
