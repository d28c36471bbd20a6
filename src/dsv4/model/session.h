// Everything one sequence carries from token to token. Sessions are plain values: copy one
// to fork a conversation (prefix reuse) — the engine's weights are shared, never copied.
// visit_fields below lists every field once, for whatever must walk them all (serialization
// in session_io, the rewind marks of runtime/session_mark, the tests' expect_same_session): a
// field added here must be added there too, and tests/session_io_test.cc fails until it is.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace dsv4 {

struct ModelConfig;

// Compressor state of one layer (main compressor or the indexer's own compressor).
struct CompressorState {
  // Raw projections of the tokens of the current, not yet complete window; `pending` rows
  // are filled (row = position mod ratio). Gates include the window-slot bias (ape).
  std::vector<float> pending_kv;    // [ratio, coff*dim]
  std::vector<float> pending_gate;  // [ratio, coff*dim]
  // CSA: the A half (first `dim` features) of the last complete window, which the next
  // entry pools together with its own B half.
  std::vector<float> previous_kv;    // [ratio, dim]
  std::vector<float> previous_gate;  // [ratio, dim]
  bool has_previous = false;
  // Emitted entries, one per complete window: [n_entries, dim].
  std::vector<float> entries;
  int64_t n_entries = 0;

  bool operator==(const CompressorState&) const = default;
};

struct LayerState {
  // Sliding window of the last (window - 1) normalized, roped kv rows; row = pos mod window.
  std::vector<float> window_kv;  // [window, head_dim]
  CompressorState compressor;    // CSA / HCA layers
  CompressorState indexer;       // CSA layers: keys of the lightning indexer

  bool operator==(const LayerState&) const = default;
};

// What the MTP drafter (spec §4.1) needs besides its layer's window (LayerState): the main
// model's pre-head streams of the last `window` positions, which its next drafts read.
struct MtpState {
  std::vector<float> streams;            // [window, hc, D]; row = position mod window
  std::vector<int64_t> stream_position;  // [window] the position each row holds (-1: none)
  int64_t position = 0;                  // the MTP layer's window holds positions < this

  bool operator==(const MtpState&) const = default;
};

struct SessionState {
  int64_t position = 0;          // tokens fed so far
  std::vector<int32_t> tokens;   // the tokens fed so far, in order
  std::vector<LayerState> layers;  // main layers, then the MTP layer(s)
  MtpState mtp;                  // empty unless the engine drafts with MTP

  // A fresh session for `c` that will hold up to `context` tokens: the fixed-size state is
  // allocated (zeros) and the growing parts are reserved, so feeding it allocates nothing.
  // Reserved pages that are never written cost address space, not RAM. `mtp`: with the MTP
  // drafter's stream ring.
  static SessionState create(const ModelConfig& c, int64_t context, bool mtp = false);
  // Bytes this session holds (allocated capacity).
  uint64_t bytes() const;
  // Bytes of state written so far (sizes, not capacities): what its context has filled.
  uint64_t used_bytes() const;
  // The most a session of `c` holds at `context` tokens: the planner's reserve per session.
  static uint64_t bytes_at(const ModelConfig& c, int64_t context, bool mtp = false);
  // What each token of context adds to bytes_at: its id, and on every compressed layer a
  // 1/ratio share of one entry (the main compressor's and, on CSA layers, the indexer's).
  static double bytes_per_token(const ModelConfig& c);

  bool operator==(const SessionState&) const = default;
};

// Calls `v(field)` for every field of `s`, in a fixed order: scalars (int64_t, bool), vectors
// of numbers, and std::vector<LayerState>, whose elements the visitor walks with visit_fields
// again. Works on const and non-const sessions alike (writers and readers share the order).
template <typename C, typename Visitor>
  requires std::is_same_v<std::remove_const_t<C>, CompressorState>
void visit_fields(C& c, Visitor& v) {
  v(c.pending_kv);
  v(c.pending_gate);
  v(c.previous_kv);
  v(c.previous_gate);
  v(c.has_previous);
  v(c.entries);
  v(c.n_entries);
}

template <typename L, typename Visitor>
  requires std::is_same_v<std::remove_const_t<L>, LayerState>
void visit_fields(L& l, Visitor& v) {
  v(l.window_kv);
  visit_fields(l.compressor, v);
  visit_fields(l.indexer, v);
}

template <typename M, typename Visitor>
  requires std::is_same_v<std::remove_const_t<M>, MtpState>
void visit_fields(M& m, Visitor& v) {
  v(m.streams);
  v(m.stream_position);
  v(m.position);
}

template <typename S, typename Visitor>
  requires std::is_same_v<std::remove_const_t<S>, SessionState>
void visit_fields(S& s, Visitor& v) {
  v(s.position);
  v(s.tokens);
  v(s.layers);
  visit_fields(s.mtp, v);
}

}  // namespace dsv4
