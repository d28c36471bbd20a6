#include "dsv4/model/attention.h"

#include <algorithm>
#include <cmath>

#include "dsv4/model/compressor.h"
#include "dsv4/model/ops.h"
#include "dsv4/model/undo_log.h"
#include "dsv4/model/rope.h"
#include "dsv4/util/thread_pool.h"
#include "dsv4/util/portable_math.h"

namespace dsv4 {
namespace {

// Query path: x [T, D] -> ws.qr [T, q_lora] (normalized; the lightning indexer reads it too)
// -> ws.q [T, H, hd], each head RMS-normalized (no weight) and roped at its position.
void query_path(const Pass& p, const LayerWeights& L, const float* x) {
  const AttentionWeights& a = L.attn;
  const int64_t T = p.T, QL = p.c.q_lora_rank;
  const int H = p.c.num_heads, hd = p.c.head_dim;
  const float eps = static_cast<float>(p.c.rms_norm_eps);
  float* qr = p.ws.qr.data();
  float* q = p.ws.q.data();
  kernels::matmul(a.wq_a, x, T, qr, p.numerics, &p.pool, 0, &p.ws.dense_in);
  ops::rms_norm_rows(qr, a.q_norm.data(), T, QL, eps, qr);
  kernels::matmul(a.wq_b, qr, T, q, p.numerics, &p.pool, 0, &p.ws.dense_in);
  const Rope& rope = p.rope(L.spec);
  for (int64_t t = 0; t < T; ++t) {
    float* qt = q + t * H * hd;
    for (int h = 0; h < H; ++h) {
      ops::rms_norm(qt + h * hd, nullptr, hd, eps, qt + h * hd);
      rope.rotate(qt + h * hd, hd, p.cos(L.spec, t), p.sin(L.spec, t));
    }
  }
}

// The pass's window kv rows, all parts at once: ws.kv_all [T, hd] = RoPE(RMSNorm(wkv · x)).
void window_kv(const Pass& p, const LayerWeights& L, const float* x) {
  const AttentionWeights& a = L.attn;
  const int hd = p.c.head_dim;
  float* kv = p.ws.kv_all.data();
  kernels::matmul(a.wkv, x, p.T, kv, p.numerics, &p.pool, 0, &p.ws.dense_in);
  const Rope& rope = p.rope(L.spec);
  const float eps = static_cast<float>(p.c.rms_norm_eps);
  for (int64_t t = 0; t < p.T; ++t) {
    float* kvt = kv + t * hd;
    ops::rms_norm(kvt, a.kv_norm.data(), hd, eps, kvt);
    rope.rotate(kvt, hd, p.cos(L.spec, t), p.sin(L.spec, t));
  }
}

// One part's window: ws.kv_rows [n_prev + T, hd] = the previous (window - 1) positions from
// the ring, then the part's own rows of ws.kv_all; the ring keeps the last window positions.
// Returns n_prev (kv_rows row 0 is position pos0 - n_prev).
int64_t window_rows(const Pass& p, LayerState& st) {
  const int64_t T = p.T, pos0 = p.pos0;
  const int hd = p.c.head_dim, W = p.c.sliding_window;
  const int64_t n_prev = std::min<int64_t>(pos0, W - 1);
  const int64_t kv_base = pos0 - n_prev;
  float* kv_rows = p.ws.kv_rows.data();
  for (int64_t i = 0; i < n_prev; ++i)
    std::copy_n(st.window_kv.data() + ((kv_base + i) % W) * hd, hd, kv_rows + i * hd);
  float* kv_new = kv_rows + n_prev * hd;
  std::copy_n(p.ws.kv_all.data() + p.row(0) * hd, T * hd, kv_new);
  for (int64_t t = std::max<int64_t>(0, T - W); t < T; ++t) {
    float* ring_row = st.window_kv.data() + ((pos0 + t) % W) * hd;
    if (p.undo) p.undo->save(pos0 + t, ring_row, hd);
    std::copy_n(kv_new + t * hd, hd, ring_row);
  }
  return n_prev;
}

// Compressed entries, emitted before attention so a just-completed window is visible; on CSA
// layers the lightning indexer then picks each query's entries (ws.picks).
void compressed_entries(const Pass& p, const LayerWeights& L, const float* x, LayerState* const* states) {
  const AttentionWeights& a = L.attn;
  if (!a.compressor) return;
  compress_tokens(p, *a.compressor, x, states, &LayerState::compressor);
  if (!a.indexer) return;
  compress_tokens(p, a.indexer->compressor, x, states, &LayerState::indexer);
  index_select(p, L.spec, *a.indexer, x, p.ws.qr.data(), states);
}

// For each of nh heads (queries q [nh, hd], outputs o [nh, hd], sinks [nh]): softmax([s_0..
// s_{n-1}, sink]) with the sink column dropped, then o = sum_j p_j · kv_j, over the rows
// row(0..n-1) in order: the window's positions ascending, then the entries. The heads share
// the rows (one kv head): dot_many scores all nh heads against each row as it is loaded, and
// axpy_many keeps the nh outputs in registers across the rows. Each head's scores, max, sum
// and output still accumulate in row order exactly as for that head alone: the same bits.
template <typename Row>
void attend(const float* q, int nh, int n, const Row& row, int hd, const float* sink, float scale, float* o,
            float* s /* [nh, n] */, const float** rows /* [n] */) {
  float dots[ForwardWorkspace::kAttendHeadBlock];
  for (int j = 0; j < n; ++j) {
    rows[j] = row(j);
    kernels::dot_many(q, hd, nh, rows[j], hd, dots);
    for (int h = 0; h < nh; ++h) s[h * n + j] = dots[h] * scale;
  }
  for (int h = 0; h < nh; ++h) {
    float* sh = s + h * n;
    float mx = sink[h];
    for (int j = 0; j < n; ++j) mx = std::max(mx, sh[j]);
    float denom = portable::exp(sink[h] - mx);
    for (int j = 0; j < n; ++j) denom += (sh[j] = portable::exp(sh[j] - mx));
    for (int j = 0; j < n; ++j) sh[j] /= denom;  // p_j
  }
  std::fill(o, o + int64_t(nh) * hd, 0.0f);
  kernels::axpy_many(s, n, nh, rows, n, hd, o, hd);
}

// Core attention of one part: its rows of ws.o [T, H, hd], one task per (token, block of
// kAttendHeadBlock heads), so every output is computed by one task; each chunk of tasks has its
// own slice of score scratch.
void attend_heads(const Pass& p, const LayerWeights& L, const LayerState& st, int64_t n_prev) {
  const AttentionWeights& a = L.attn;
  ForwardWorkspace& ws = p.ws;
  const int H = p.c.num_heads, hd = p.c.head_dim, W = p.c.sliding_window, ratio = L.spec.compress_ratio;
  constexpr int kBlock = ForwardWorkspace::kAttendHeadBlock;
  const int blocks = (H + kBlock - 1) / kBlock;
  const int64_t kv_base = p.pos0 - n_prev, n_items = p.T * blocks;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Rope& rope = p.rope(L.spec);
  const CompressorState* comp = a.compressor ? &st.compressor : nullptr;
  const int64_t grain = (n_items + ws.scratch_slots - 1) / ws.scratch_slots;
  p.pool.parallel_for(n_items, grain, [&](int64_t i0, int64_t i1) {
    float* scores = ws.attend_scores.data() + (i0 / grain) * kBlock * ws.attend_rows;
    const float** rows = ws.attend_row_ptrs.data() + (i0 / grain) * ws.attend_rows;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / blocks, pos = p.pos0 + t;
      const int h0 = static_cast<int>(i % blocks) * kBlock, nh = std::min(kBlock, H - h0);
      const int64_t first = std::max<int64_t>(0, pos - W + 1);
      const int n_window = static_cast<int>(pos - first + 1);
      const float* window = ws.kv_rows.data() + (first - kv_base) * hd;
      const int32_t* picks = nullptr;
      int n_entries = 0;
      if (comp && a.indexer) {
        picks = ws.picks.data() + p.row(t) * p.c.index_topk;
        n_entries = ws.pick_count[p.row(t)];
      } else if (comp) {
        n_entries = static_cast<int>(std::min<int64_t>(comp->n_entries, (pos + 1) / ratio));
      }
      auto row = [&](int j) {
        if (j < n_window) return window + int64_t(j) * hd;
        const int64_t e = picks ? picks[j - n_window] : j - n_window;
        return comp->entries.data() + e * hd;
      };
      float* o = ws.o.data() + (p.row(t) * H + h0) * hd;
      attend(ws.q.data() + (p.row(t) * H + h0) * hd, nh, n_window + n_entries, row, hd, a.sink.data() + h0, scale, o,
             scores, rows);
      for (int h = 0; h < nh; ++h) rope.rotate(o + h * hd, hd, p.cos(L.spec, t), p.sin(L.spec, t), /*inverse=*/true);
    }
  });
}

// Grouped low-rank output projection: group g = heads [g·H/G, (g+1)·H/G) -> z [T, G·R] ->
// out = wo_b · z [T, D].
void grouped_output(const Pass& p, const AttentionWeights& a, float* out) {
  const int G = p.c.o_groups, R = p.c.o_lora_rank;
  const int64_t T = p.T, H = p.c.num_heads, hd = p.c.head_dim, group_width = (H / G) * hd;
  float* og = p.ws.og.data();
  float* z = p.ws.z.data();
  for (int g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t) std::copy_n(p.ws.o.data() + t * H * hd + g * group_width, group_width, og + t * group_width);
    kernels::matmul(a.wo_a[g], og, T, z + g * R, p.numerics, &p.pool, int64_t(G) * R, &p.ws.dense_in);
  }
  kernels::matmul(a.wo_b, z, T, out, p.numerics, &p.pool, 0, &p.ws.dense_in);
}

}  // namespace

void attention(const Pass& p, const LayerWeights& L, const float* x, LayerState* const* states, float* out) {
  query_path(p, L, x);
  p.check_cancel();
  window_kv(p, L, x);
  compressed_entries(p, L, x, states);
  p.check_cancel();
  for (size_t i = 0; i < p.n_parts(); ++i) {
    const Pass part = p.part(i);
    const int64_t n_prev = window_rows(part, *states[i]);
    attend_heads(part, L, *states[i], n_prev);
  }
  p.check_cancel();
  grouped_output(p, L.attn, out);
}

}  // namespace dsv4
