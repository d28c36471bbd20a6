#include "dsv4/model/session.h"

#include "dsv4/io/config.h"

namespace dsv4 {
namespace {

template <typename T>
uint64_t capacity_bytes(const std::vector<T>& v) {
  return static_cast<uint64_t>(v.capacity()) * sizeof(T);
}

template <typename T>
uint64_t size_bytes(const std::vector<T>& v) {
  return static_cast<uint64_t>(v.size()) * sizeof(T);
}

// The bytes of every vector of a session, counted by `count` (capacity or size).
template <typename Count>
uint64_t session_bytes(const SessionState& s, Count count) {
  auto compressor = [&](const CompressorState& c) {
    return count(c.pending_kv) + count(c.pending_gate) + count(c.previous_kv) + count(c.previous_gate) +
           count(c.entries);
  };
  uint64_t total = count(s.tokens) + count(s.layers) + count(s.mtp.streams) + count(s.mtp.stream_position);
  for (const LayerState& l : s.layers) total += count(l.window_kv) + compressor(l.compressor) + compressor(l.indexer);
  return total;
}

// The state of one compressor (ratio m, entry width `dim`, CSA overlap or not) for a session
// of `context` tokens: the windows allocated, the entries reserved.
CompressorState compressor_state(int m, int dim, bool overlap, int64_t context) {
  const size_t width = static_cast<size_t>((overlap ? 2 : 1) * dim);
  CompressorState st;
  st.pending_kv.assign(static_cast<size_t>(m) * width, 0.0f);
  st.pending_gate.assign(static_cast<size_t>(m) * width, 0.0f);
  if (overlap) {
    st.previous_kv.assign(static_cast<size_t>(m) * dim, 0.0f);
    st.previous_gate.assign(static_cast<size_t>(m) * dim, 0.0f);
  }
  st.entries.reserve(static_cast<size_t>(context / m + 1) * dim);
  return st;
}

}  // namespace

SessionState SessionState::create(const ModelConfig& c, int64_t context, bool mtp) {
  SessionState s;
  if (mtp) {
    s.mtp.streams.assign(static_cast<size_t>(c.sliding_window) * c.hc_mult * c.hidden_size, 0.0f);
    s.mtp.stream_position.assign(static_cast<size_t>(c.sliding_window), -1);
  }
  s.tokens.reserve(static_cast<size_t>(context));
  s.layers.resize(c.layers.size());
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerSpec& spec = c.layers[i];
    LayerState& l = s.layers[i];
    l.window_kv.assign(static_cast<size_t>(c.sliding_window) * c.head_dim, 0.0f);
    if (spec.compress_ratio == 0) continue;
    const bool csa = spec.kind == AttentionKind::kCSA;
    l.compressor = compressor_state(spec.compress_ratio, c.head_dim, csa, context);
    if (csa) l.indexer = compressor_state(spec.compress_ratio, c.index_head_dim, true, context);
  }
  return s;
}

uint64_t SessionState::bytes() const {
  return session_bytes(*this, [](const auto& v) { return capacity_bytes(v); });
}

uint64_t SessionState::used_bytes() const {
  return session_bytes(*this, [](const auto& v) { return size_bytes(v); });
}

uint64_t SessionState::bytes_at(const ModelConfig& c, int64_t context, bool mtp) {
  // The same shapes create() allocates, with every reserved entry filled.
  uint64_t total = static_cast<uint64_t>(context) * sizeof(int32_t) + c.layers.size() * sizeof(LayerState);
  if (mtp) total += uint64_t(c.sliding_window) * (uint64_t(c.hc_mult) * c.hidden_size * sizeof(float) + sizeof(int64_t));
  for (const LayerSpec& spec : c.layers) {
    total += uint64_t(c.sliding_window) * c.head_dim * sizeof(float);
    if (spec.compress_ratio == 0) continue;
    const uint64_t m = spec.compress_ratio, entries = static_cast<uint64_t>(context) / m + 1;
    const bool csa = spec.kind == AttentionKind::kCSA;
    auto compressor = [&](uint64_t dim, bool overlap) {
      const uint64_t width = (overlap ? 2 : 1) * dim;
      return (2 * m * width + (overlap ? 2 * m * dim : 0) + entries * dim) * sizeof(float);
    };
    total += compressor(c.head_dim, csa);
    if (csa) total += compressor(c.index_head_dim, true);
  }
  return total;
}

double SessionState::bytes_per_token(const ModelConfig& c) {
  double total = sizeof(int32_t);
  for (const LayerSpec& spec : c.layers) {
    if (spec.compress_ratio == 0) continue;
    const double dim = c.head_dim + (spec.kind == AttentionKind::kCSA ? c.index_head_dim : 0);
    total += dim * sizeof(float) / spec.compress_ratio;
  }
  return total;
}

}  // namespace dsv4
