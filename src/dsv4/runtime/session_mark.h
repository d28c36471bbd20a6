// A point a session can be rewound to, so that a cancelled (or failed) turn leaves the session
// exactly as it was before the turn. Later tokens only append to a session's token list and
// compressor entries, and overwrite a few fixed-size buffers (the attention's sliding window,
// each compressor's pending and previous windows, the MTP drafter's stream ring); a mark keeps
// the sizes of the first and copies of the others, never the history, so it costs the same at
// 100 tokens as at 100,000. Rewinding restores the session bit for bit (tests/chat_session_test.cc
// compares every field). Both walk the fields with visit_fields (session.h), so a field added
// there is marked and restored too: copied whole, unless session_mark.cc names it append-only.
#pragma once

#include <cstddef>
#include <vector>

#include "dsv4/model/session.h"

namespace dsv4 {

struct SessionMark {
  // Every field in visit_fields' order: a scalar's bytes; a vector's element count, then its
  // elements unless it is append-only; a layer list's count, then each layer's fields.
  std::vector<std::byte> fields;
};

SessionMark mark_session(const SessionState& s);
// `s` must have been derived from the marked state by feeding more tokens.
void rewind_session(SessionState& s, const SessionMark& m);

}  // namespace dsv4
