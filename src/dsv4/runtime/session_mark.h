// A point a session can be rewound to, so that a cancelled (or failed) turn leaves the session
// exactly as it was before the turn. Later tokens only append to a session's token list and
// compressor entries, and overwrite a few fixed-size buffers (the attention's sliding window,
// each compressor's pending and previous windows); a mark keeps the sizes and copies of those
// buffers, never the history, so it costs the same at 100 tokens as at 100,000. Rewinding
// restores the session bit for bit (tests/generator_test.cc compares every field).
// A field added to SessionState / LayerState / CompressorState must be handled here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dsv4/model/session.h"

namespace dsv4 {

struct SessionMark {
  int64_t position = 0;
  size_t tokens = 0;
  // Each layer's state with its compressors' entries left out (their sizes are below).
  std::vector<LayerState> layers;
  std::vector<size_t> compressor_floats, indexer_floats;
  MtpState mtp;  // fixed size (the MTP drafter's stream ring), copied whole
};

SessionMark mark_session(const SessionState& s);
// `s` must have been derived from the marked state by feeding more tokens.
void rewind_session(SessionState& s, const SessionMark& m);

}  // namespace dsv4
