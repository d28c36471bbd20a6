#include "dsv4/model/undo_log.h"

#include <algorithm>

#include "dsv4/io/config.h"
#include "dsv4/util/error.h"

namespace dsv4 {

uint64_t UndoLog::Size::bytes() const {
  return uint64_t(records) * sizeof(Record) + uint64_t(floats) * sizeof(float);
}

UndoLog::Size UndoLog::most_for(const ModelConfig& c, int64_t rows) {
  Size s;
  if (rows <= 0) return s;
  const size_t n = static_cast<size_t>(rows);
  // The writes attention (window_rows) and the compressors (compress_tokens, emit_entry) save.
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerSpec& spec = c.layer(l);
    const size_t ring = std::min<size_t>(n, static_cast<size_t>(c.sliding_window));  // the last W rows of a pass
    s.records += ring;
    s.floats += ring * static_cast<size_t>(c.head_dim);
    if (spec.compress_ratio == 0) continue;
    const size_t m = static_cast<size_t>(spec.compress_ratio), windows = (n + m - 1) / m;
    const bool csa = spec.kind == AttentionKind::kCSA;
    auto compressor = [&](size_t dim, bool overlap) {
      const size_t width = (overlap ? 2 : 1) * dim;
      s.records += 2 * n + windows * (overlap ? 3 : 1);
      s.floats += 2 * n * width + (overlap ? windows * 2 * m * dim : 0);
    };
    compressor(static_cast<size_t>(c.head_dim), csa);
    if (csa) compressor(static_cast<size_t>(c.index_head_dim), true);
  }
  return s;
}

void UndoLog::begin(const SessionState& s) {
  records_.clear();  // capacity stays: steady-state drafting allocates nothing
  saved_.clear();
  start_position_ = s.position;
  start_tokens_ = s.tokens.size();
}

void UndoLog::save(int64_t position, float* dst, size_t n) {
  records_.push_back(Record{position, dst, saved_.size(), n, nullptr, 0, 0, false});
  saved_.insert(saved_.end(), dst, dst + n);
}

void UndoLog::save_entry_count(int64_t position, CompressorState& st) {
  records_.push_back(Record{position, nullptr, 0, 0, &st, st.n_entries, st.entries.size(), st.has_previous});
}

void UndoLog::rewind(SessionState& s, int64_t keep_position) {
  if (keep_position < start_position_ || keep_position > s.position ||
      s.tokens.size() != start_tokens_ + static_cast<size_t>(s.position - start_position_))
    fail("internal: UndoLog::rewind to position {} of a session at {} (log begun at {})", keep_position, s.position,
         start_position_);
  // Records are in execution order: layer by layer, positions ascending within a layer. A
  // buffer belongs to one layer, so walking back over the whole log restores each buffer to
  // its value before the first write that is taken back.
  for (size_t i = records_.size(); i-- > 0;) {
    const Record& r = records_[i];
    if (r.position < keep_position) continue;
    if (r.dst) {
      std::copy_n(saved_.data() + r.offset, r.n, r.dst);
    } else {
      r.state->n_entries = r.n_entries;
      r.state->entries.resize(r.entry_floats);
      r.state->has_previous = r.has_previous;
    }
  }
  s.position = keep_position;
  s.tokens.resize(start_tokens_ + static_cast<size_t>(keep_position - start_position_));
  begin(s);  // the records taken back are gone; the ones kept are history now
}

}  // namespace dsv4
