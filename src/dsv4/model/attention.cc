#include "dsv4/model/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dsv4/model/compressor.h"
#include "dsv4/model/ops.h"
#include "dsv4/util/thread_pool.h"

namespace dsv4 {
namespace {

// softmax([s_0..s_{n-1}, sink]) with the sink column dropped, then o = sum_j p_j · kv_j.
void attend(const float* q, const float* const* kv, int n, int hd, float sink, float scale, float* o, float* s) {
  float mx = sink;
  for (int j = 0; j < n; ++j) {
    s[j] = kernels::dot(q, kv[j], hd) * scale;
    mx = std::max(mx, s[j]);
  }
  float denom = std::exp(sink - mx);
  for (int j = 0; j < n; ++j) denom += (s[j] = std::exp(s[j] - mx));
  std::fill(o, o + hd, 0.0f);
  for (int j = 0; j < n; ++j) kernels::axpy(s[j] / denom, kv[j], o, hd);
}

}  // namespace

void attention(const ModelConfig& c, const LayerWeights& L, const Rope& rope, const float* x, int64_t T,
               int64_t pos0, kernels::Numerics numerics, ThreadPool* pool, LayerState* state, float* out) {
  const AttentionWeights& a = L.attn;
  const int H = c.num_heads, hd = c.head_dim, W = c.sliding_window;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t QL = c.q_lora_rank;

  // Query low-rank path; qr is shared with the lightning indexer.
  std::vector<float> qr(static_cast<size_t>(T * QL));
  kernels::matmul(a.wq_a, x, T, qr.data(), numerics, pool);
  for (int64_t t = 0; t < T; ++t) ops::rms_norm(qr.data() + t * QL, a.q_norm.data(), QL, eps, qr.data() + t * QL);
  std::vector<float> q(static_cast<size_t>(T * H * hd));
  kernels::matmul(a.wq_b, qr.data(), T, q.data(), numerics, pool);

  // Window kv of the chunk's tokens, appended after the previous (window - 1) tokens.
  const int64_t n_prev = std::min<int64_t>(pos0, W - 1);
  const int64_t kv_base = pos0 - n_prev;  // position of kv_rows row 0
  std::vector<float> kv_rows(static_cast<size_t>((n_prev + T) * hd));
  if (state->window_kv.empty()) state->window_kv.assign(static_cast<size_t>(W) * hd, 0.0f);
  for (int64_t i = 0; i < n_prev; ++i)
    std::copy_n(state->window_kv.data() + ((kv_base + i) % W) * hd, hd, kv_rows.data() + i * hd);
  float* kv_new = kv_rows.data() + n_prev * hd;
  kernels::matmul(a.wkv, x, T, kv_new, numerics, pool);

  std::vector<RopeAngles> angles(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    angles[t] = rope.angles(pos0 + t);
    float* kvt = kv_new + t * hd;
    ops::rms_norm(kvt, a.kv_norm.data(), hd, eps, kvt);
    rope.rotate(kvt, hd, angles[t]);
    float* qt = q.data() + t * H * hd;
    for (int h = 0; h < H; ++h) {
      ops::rms_norm(qt + h * hd, nullptr, hd, eps, qt + h * hd);
      rope.rotate(qt + h * hd, hd, angles[t]);
    }
  }
  for (int64_t t = std::max<int64_t>(0, T - W); t < T; ++t)
    std::copy_n(kv_new + t * hd, hd, state->window_kv.data() + ((pos0 + t) % W) * hd);

  // Compressed entries (emitted before attention, so a just-completed window is visible).
  std::vector<std::vector<int32_t>> picks;
  const CompressorState* comp = nullptr;
  if (a.compressor) {
    compress_tokens(c, *a.compressor, rope, x, T, pos0, pool, &state->compressor);
    comp = &state->compressor;
    if (a.indexer) {
      compress_tokens(c, a.indexer->compressor, rope, x, T, pos0, pool, &state->indexer);
      picks = index_select(c, *a.indexer, rope, x, qr.data(), T, pos0, state->indexer, numerics, pool);
    }
  }

  // Core attention, one task per (token, head): every output is computed by one task.
  std::vector<float> o(static_cast<size_t>(T * H * hd));
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int ratio = L.spec.compress_ratio;
  auto per_token_head = [&](int64_t i0, int64_t i1) {
    std::vector<const float*> rows;
    std::vector<float> scratch;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / H;
      const int h = static_cast<int>(i % H);
      const int64_t pos = pos0 + t;
      rows.clear();
      for (int64_t p = std::max<int64_t>(0, pos - W + 1); p <= pos; ++p) rows.push_back(kv_rows.data() + (p - kv_base) * hd);
      if (comp) {
        if (a.indexer) {
          for (int32_t e : picks[t]) rows.push_back(comp->entries.data() + int64_t(e) * hd);
        } else {
          const int64_t visible = std::min<int64_t>(comp->n_entries, (pos + 1) / ratio);
          for (int64_t e = 0; e < visible; ++e) rows.push_back(comp->entries.data() + e * hd);
        }
      }
      scratch.resize(rows.size());
      float* oh = o.data() + (t * H + h) * hd;
      attend(q.data() + (t * H + h) * hd, rows.data(), static_cast<int>(rows.size()), hd, a.sink[h], scale, oh,
             scratch.data());
      rope.rotate(oh, hd, angles[t], /*inverse=*/true);
    }
  };
  if (pool) {
    pool->parallel_for(T * H, 1, per_token_head);
  } else {
    per_token_head(0, T * H);
  }

  // Grouped low-rank output projection: group g = heads [g·H/G, (g+1)·H/G).
  const int G = c.o_groups, R = c.o_lora_rank;
  const int64_t group_width = int64_t(H / G) * hd;
  std::vector<float> og(static_cast<size_t>(T * group_width)), z(static_cast<size_t>(T * G * R));
  for (int g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(o.data() + t * H * hd + g * group_width, group_width, og.data() + t * group_width);
    kernels::matmul(a.wo_a[g], og.data(), T, z.data() + g * R, numerics, pool, int64_t(G) * R);
  }
  kernels::matmul(a.wo_b, z.data(), T, out, numerics, pool);
}

}  // namespace dsv4
