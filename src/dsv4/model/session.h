// Everything one sequence carries from token to token. Sessions are plain values: copy one
// to fork a conversation (prefix reuse) — the engine's weights are shared, never copied.
#pragma once

#include <cstdint>
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
};

struct LayerState {
  // Sliding window of the last (window - 1) normalized, roped kv rows; row = pos mod window.
  std::vector<float> window_kv;  // [window, head_dim]
  CompressorState compressor;    // CSA / HCA layers
  CompressorState indexer;       // CSA layers: keys of the lightning indexer
};

// What the MTP drafter (spec §4.1) needs besides its layer's window (LayerState): the main
// model's pre-head streams of the last `window` positions, which its next drafts read.
struct MtpState {
  std::vector<float> streams;            // [window, hc, D]; row = position mod window
  std::vector<int64_t> stream_position;  // [window] the position each row holds (-1: none)
  int64_t position = 0;                  // the MTP layer's window holds positions < this
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
  // The most a session of `c` holds at `context` tokens: the planner's reserve per session.
  static uint64_t bytes_at(const ModelConfig& c, int64_t context, bool mtp = false);
};

}  // namespace dsv4
