#include "dsv4/model/compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dsv4/model/ops.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/model/rope.h"
#include "dsv4/util/thread_pool.h"
#include "dsv4/util/portable_math.h"

namespace dsv4 {
namespace {

// Pools one window into an entry of `dim` floats. Slots are (kv, gate) row pointers with a
// feature offset; the softmax over slots is taken independently for every channel.
void pool_window(const PoolSlot* slots, int n_slots, int dim, float* out) {
  for (int d = 0; d < dim; ++d) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < n_slots; ++s) mx = std::max(mx, slots[s].gate[d]);
    float denom = 0.0f;
    for (int s = 0; s < n_slots; ++s) denom += portable::exp(slots[s].gate[d] - mx);
    float acc = 0.0f;
    for (int s = 0; s < n_slots; ++s) acc += slots[s].kv[d] * (portable::exp(slots[s].gate[d] - mx) / denom);
    out[d] = acc;
  }
}

// Window `entry` is complete: pool its slots, normalize, rope at the window's first position
// and append the entry; CSA keeps the window's A half for the next entry.
void emit_entry(const Pass& p, int64_t position, const CompressorWeights& w, CompressorState& st) {
  const int m = w.ratio, dim = w.dim, width = (w.overlap ? 2 : 1) * dim;
  if (p.undo) {
    p.undo->save_entry_count(position, st);
    if (w.overlap) {
      p.undo->save(position, st.previous_kv.data(), st.previous_kv.size());
      p.undo->save(position, st.previous_gate.data(), st.previous_gate.size());
    }
  }
  PoolSlot* slots = p.ws.pool_slots.data();
  int n = 0;
  if (w.overlap) {
    if (st.has_previous)
      for (int s = 0; s < m; ++s) slots[n++] = {st.previous_kv.data() + s * dim, st.previous_gate.data() + s * dim};
    for (int s = 0; s < m; ++s)
      slots[n++] = {st.pending_kv.data() + s * width + dim, st.pending_gate.data() + s * width + dim};
  } else {
    for (int s = 0; s < m; ++s) slots[n++] = {st.pending_kv.data() + s * width, st.pending_gate.data() + s * width};
  }
  float* pooled = p.ws.pooled.data();
  pool_window(slots, n, dim, pooled);

  const int64_t entry = st.n_entries;
  st.entries.resize(static_cast<size_t>((entry + 1) * dim));  // within the session's reserve
  float* e = st.entries.data() + entry * dim;
  ops::rms_norm(pooled, w.norm.data(), dim, static_cast<float>(p.c.rms_norm_eps), e);
  const Rope& rope = p.ropes[1];  // compressed layers' rope
  rope.angles(entry * m, p.ws.entry_cos.data(), p.ws.entry_sin.data());
  rope.rotate(e, dim, p.ws.entry_cos.data(), p.ws.entry_sin.data());
  st.n_entries = entry + 1;

  if (w.overlap) {
    for (int s = 0; s < m; ++s) {
      std::copy_n(st.pending_kv.data() + s * width, dim, st.previous_kv.data() + s * dim);
      std::copy_n(st.pending_gate.data() + s * width, dim, st.previous_gate.data() + s * dim);
    }
    st.has_previous = true;
  }
}

}  // namespace

void compress_tokens(const Pass& p, const CompressorWeights& w, const float* x, LayerState* const* states,
                     CompressorState LayerState::*which) {
  const int m = w.ratio, width = (w.overlap ? 2 : 1) * w.dim;  // features per token
  // Projections of the whole pass at once, every part's rows (float32, as the reference):
  // [T, width] each.
  float* kv = p.ws.comp_kv.data();
  float* gate = p.ws.comp_gate.data();
  kernels::matmul(w.wkv, x, p.T, kv, kernels::Numerics::kReference, &p.pool);
  kernels::matmul(w.wgate, x, p.T, gate, kernels::Numerics::kReference, &p.pool);
  for (size_t i = 0; i < p.n_parts(); ++i) {
    const Pass part = p.part(i);
    CompressorState& st = states[i]->*which;
    for (int64_t t = 0; t < part.T; ++t) {
      const int64_t position = part.pos0 + t, r = part.row(t);
      const int slot = static_cast<int>(position % m);
      float* pk = st.pending_kv.data() + slot * width;
      float* pg = st.pending_gate.data() + slot * width;
      if (part.undo) {
        part.undo->save(position, pk, width);
        part.undo->save(position, pg, width);
      }
      std::copy_n(kv + r * width, width, pk);
      const float* ape = w.ape.data() + slot * width;
      for (int f = 0; f < width; ++f) pg[f] = gate[r * width + f] + ape[f];
      if (slot == m - 1) emit_entry(part, position, w, st);
    }
  }
}

void pick_top_k(const float* scores, int64_t n, int64_t k, int32_t* order, int32_t* chosen) {
  for (int64_t e = 0; e < n; ++e) order[e] = static_cast<int32_t>(e);
  if (k < n) {
    // Highest score first, equal scores by lower index: a total order, so the chosen set is
    // unique and a linear selection finds the set a sort would.
    std::nth_element(order, order + k, order + n, [&](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
  }
  std::copy_n(order, k, chosen);
  std::sort(chosen, chosen + k);
}

void index_select(const Pass& p, const LayerSpec& spec, const IndexerWeights& w, const float* x, const float* qr,
                  LayerState* const* states) {
  ForwardWorkspace& ws = p.ws;
  const int IH = p.c.index_n_heads, Id = p.c.index_head_dim, m = w.compressor.ratio, topk = p.c.index_topk;
  const int64_t T = p.T;
  float* q = ws.index_q.data();              // [T, IH*Id]
  float* head_weight = ws.index_weight.data();  // [T, IH]
  kernels::matmul(w.wq_b, qr, T, q, p.numerics, &p.pool, 0, &p.ws.dense_in);
  kernels::matmul(w.weights_proj, x, T, head_weight, kernels::Numerics::kReference, &p.pool);
  const float weight_scale = 1.0f / std::sqrt(static_cast<float>(IH));
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(Id));
  const Rope& rope = p.rope(spec);

  const int64_t grain = (T + ws.scratch_slots - 1) / ws.scratch_slots;
  p.pool.parallel_for(T, grain, [&](int64_t t0, int64_t t1) {
    float* scores = ws.index_scores.data() + (t0 / grain) * ws.index_entries;
    int32_t* order = ws.index_order.data() + (t0 / grain) * ws.index_entries;
    for (int64_t t = t0; t < t1; ++t) {
      const size_t part = p.part_of_row(t);
      const int64_t pos = p.position_of_row(part, t);
      const CompressorState& keys = states[part]->indexer;
      float* qt = q + t * IH * Id;
      for (int h = 0; h < IH; ++h) rope.rotate(qt + h * Id, Id, p.cos(spec, t), p.sin(spec, t));
      const int64_t visible = std::min<int64_t>(keys.n_entries, (pos + 1) / m);
      ws.pick_count[t] = 0;
      if (visible <= 0) continue;
      // Each head's weight, scaled once per token rather than once per entry (the same product).
      float* hw = head_weight + t * IH;
      for (int h = 0; h < IH; ++h) hw[h] *= weight_scale;
      // score_e = sum_h relu(q_h · k_e) * score_scale * w_h, over the heads in order; the heads'
      // dots against each key in blocks of kHeadBlock (the key loaded once per block).
      constexpr int kHeadBlock = 64;
      float dots[kHeadBlock];
      for (int64_t e = 0; e < visible; ++e) {
        const float* k = keys.entries.data() + e * Id;
        float s = 0.0f;
        for (int h0 = 0; h0 < IH; h0 += kHeadBlock) {
          const int nh = std::min(kHeadBlock, IH - h0);
          kernels::dot_many(qt + h0 * Id, Id, nh, k, Id, dots);
          for (int h = 0; h < nh; ++h) s += (std::max(dots[h], 0.0f) * score_scale) * hw[h0 + h];
        }
        scores[e] = s;
      }
      const int64_t k = std::min<int64_t>(topk, visible);
      pick_top_k(scores, visible, k, order, ws.picks.data() + t * topk);
      ws.pick_count[t] = static_cast<int32_t>(k);
    }
  });
}

}  // namespace dsv4
