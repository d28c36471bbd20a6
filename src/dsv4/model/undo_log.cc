#include "dsv4/model/undo_log.h"

#include <algorithm>

#include "dsv4/util/error.h"

namespace dsv4 {

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
