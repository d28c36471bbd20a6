// What forward passes overwrote in a session, position by position, so that the last
// positions can be taken back (speculative decoding's rejected drafts) at a cost
// proportional to the positions taken back, never to the context.
//
// A pass changes a session in few places: the sliding-window ring row of each position, each
// compressor's pending-window row, and, when a window completes, the appended entry, the
// entry count and (CSA) the previous window's A half. Before each of those writes the block
// saves the bytes it is about to overwrite, tagged with the position being fed; rewinding
// restores those saves in reverse order, so a buffer written twice (a ratio-4 window wraps
// inside a 5-row pass) comes back to the value before the first write that is taken back.
// The result is bit for bit the session that never saw those positions
// (tests/speculative_test.cc compares every field).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dsv4/model/session.h"

namespace dsv4 {

struct ModelConfig;

class UndoLog {
 public:
  // What a log holds: records and saved floats.
  struct Size {
    size_t records = 0, floats = 0;
    uint64_t bytes() const;  // of a log that holds (or has room for) exactly this much
  };
  // The most a log of a session of `c` holds after `rows` consecutive positions of its main
  // layers are fed (one pass, or several without begin() between): per position its ring
  // row and each compressor's pending row, and per completed window (at most
  // ceil(rows / ratio) of them) the entry count and, CSA, the previous window's halves.
  // The planner's reserve per session slot and the room the engine and the generator
  // reserve for their logs.
  static Size most_for(const ModelConfig& c, int64_t rows);

  // Starts a log at the session's current position (earlier records are dropped).
  void begin(const SessionState& s);
  // Before the pass feeding `position` overwrites dst[0, n).
  void save(int64_t position, float* dst, size_t n);
  // Before the pass feeding `position` emits an entry into `st` (and, CSA, replaces its
  // previous window, which the caller saves with save()).
  void save_entry_count(int64_t position, CompressorState& st);

  // Takes back every position from `keep_position` on: `s` becomes the session that was fed
  // only up to there. `s` must be the session the log was begun on, fed since. The log then
  // starts again at keep_position.
  void rewind(SessionState& s, int64_t keep_position);

  int64_t start_position() const { return start_position_; }
  // Room for this many records and saved floats, so that logs up to that size allocate nothing.
  void reserve(Size size) {
    records_.reserve(size.records);
    saved_.reserve(size.floats);
  }
  // What the log holds now, and the bytes it has allocated (capacity, kept across begin()).
  Size size() const { return Size{records_.size(), saved_.size()}; }
  uint64_t bytes() const { return Size{records_.capacity(), saved_.capacity()}.bytes(); }

 private:
  struct Record {
    int64_t position;
    float* dst;              // null: an entry count record
    size_t offset, n;        // saved floats: saved_[offset, offset + n)
    CompressorState* state;  // entry count records
    int64_t n_entries;
    size_t entry_floats;
    bool has_previous;
  };
  std::vector<Record> records_;
  std::vector<float> saved_;
  int64_t start_position_ = 0;
  size_t start_tokens_ = 0;
};

}  // namespace dsv4
