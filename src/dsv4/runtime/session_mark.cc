#include "dsv4/runtime/session_mark.h"

#include "dsv4/util/error.h"

namespace dsv4 {
namespace {

CompressorState without_entries(const CompressorState& c) {
  CompressorState out;
  out.pending_kv = c.pending_kv;
  out.pending_gate = c.pending_gate;
  out.previous_kv = c.previous_kv;
  out.previous_gate = c.previous_gate;
  out.has_previous = c.has_previous;
  out.n_entries = c.n_entries;
  return out;
}

void restore(CompressorState& c, const CompressorState& m, size_t entry_floats) {
  if (c.entries.size() < entry_floats || c.n_entries < m.n_entries)
    fail("rewind_session: the session has fewer compressor entries than its mark");
  c.pending_kv = m.pending_kv;
  c.pending_gate = m.pending_gate;
  c.previous_kv = m.previous_kv;
  c.previous_gate = m.previous_gate;
  c.has_previous = m.has_previous;
  c.entries.resize(entry_floats);
  c.n_entries = m.n_entries;
}

}  // namespace

SessionMark mark_session(const SessionState& s) {
  SessionMark m;
  m.position = s.position;
  m.tokens = s.tokens.size();
  m.mtp = s.mtp;
  m.layers.reserve(s.layers.size());
  for (const LayerState& l : s.layers) {
    LayerState copy;
    copy.window_kv = l.window_kv;
    copy.compressor = without_entries(l.compressor);
    copy.indexer = without_entries(l.indexer);
    m.layers.push_back(std::move(copy));
    m.compressor_floats.push_back(l.compressor.entries.size());
    m.indexer_floats.push_back(l.indexer.entries.size());
  }
  return m;
}

void rewind_session(SessionState& s, const SessionMark& m) {
  if (s.layers.size() != m.layers.size() || s.tokens.size() < m.tokens || s.position < m.position)
    fail("rewind_session: the session is not a continuation of its mark");
  s.position = m.position;
  s.tokens.resize(m.tokens);
  s.mtp = m.mtp;
  for (size_t i = 0; i < s.layers.size(); ++i) {
    s.layers[i].window_kv = m.layers[i].window_kv;
    restore(s.layers[i].compressor, m.layers[i].compressor, m.compressor_floats[i]);
    restore(s.layers[i].indexer, m.layers[i].indexer, m.indexer_floats[i]);
  }
}

}  // namespace dsv4
