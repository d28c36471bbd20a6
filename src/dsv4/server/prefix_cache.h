// Session snapshots, each keyed by a token sequence, so that a request whose prompt starts with
// a cached sequence only prefills the rest (sessions cannot rewind, so a snapshot is usable
// exactly when its key is a prefix of the new prompt). A key is the session's tokens plus a
// "tail" the session has not been fed yet: a finished answer's last token is sampled but never
// fed, and the next turn's prefill feeds it anyway.
//
// Two tiers: snapshots in RAM, bounded by entry count and bytes (least recently used dropped
// first), and optionally a PrefixStore on disk (--cache-dir), bounded by its own bytes, whose
// entries survive restarts. A lookup considers both; a disk entry is read (and checked) when it
// is the best match, then kept in RAM too. New snapshots go to RAM at once and to disk at the
// next persist(), which the scheduler calls once the request's answer is out (one that must
// leave RAM before then, or never fits there, is written at once). Not thread-safe: the
// scheduler's worker is its only user.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/model/session.h"
#include "dsv4/server/prefix_store.h"

namespace dsv4::server {

class PrefixCache {
 public:
  // `store`: the disk tier, or null.
  PrefixCache(size_t max_entries, uint64_t max_bytes, std::unique_ptr<PrefixStore> store = nullptr);

  struct Match {
    SessionState state;        // a copy; the cache keeps its own
    std::vector<int32_t> key;  // state.tokens + the tail
    std::string text;          // what the key decodes to (may be empty)
  };

  // The entry with the longest key that is a prefix of `prompt` (its session holding fewer
  // tokens than the prompt).
  std::optional<Match> longest_token_prefix(std::span<const int32_t> prompt);

  // The entry with the longest text that is a proper prefix of `text` and for which
  // `junction_ok(rest)` holds for the rest of the text (the caller checks that the rest
  // tokenizes on its own the way it would inside the whole text).
  template <typename JunctionOk>
  std::optional<Match> longest_text_prefix(std::string_view text, JunctionOk junction_ok) {
    for (;;) {
      auto best = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->text.empty() || it->text.size() >= text.size() || !text.starts_with(it->text)) continue;
        if (best != entries_.end() && best->text.size() >= it->text.size()) continue;
        if (junction_ok(text.substr(it->text.size()))) best = it;
      }
      if (best == entries_.end()) return std::nullopt;
      if (auto m = take(best)) return m;  // else its disk entry was bad and is gone: look again
    }
  }

  // Stores a snapshot keyed by state.tokens + tail; `text` is what the key decodes to (or
  // empty). An entry with the same key is only refreshed. Snapshots bigger than the RAM bound
  // are not kept in RAM (but still go to disk).
  void insert(SessionState state, std::span<const int32_t> tail, std::string text);
  // Writes the snapshots inserted since the last call to the disk tier (if any).
  void persist();

  size_t entries() const { return ram_entries_; }  // in RAM
  uint64_t bytes() const { return bytes_; }        // in RAM
  const PrefixStore* store() const { return store_.get(); }
  void clear();

 private:
  struct Entry {
    std::vector<int32_t> key;
    size_t state_tokens = 0;
    std::string text;
    std::optional<SessionState> state;  // in RAM
    uint64_t bytes = 0;                 // RAM bytes while the state is held
    std::string file;      // its disk entry ("" if none)
    bool unsaved = false;  // to be written by persist()
  };
  using List = std::list<Entry>;  // most recently used first
  // The entry's session (read from disk when not in RAM); null when that read failed, in
  // which case the entry is gone.
  std::optional<Match> take(List::iterator it);
  // Keeps `state` (moved from) in RAM if it fits the bounds at all; else leaves it alone.
  void hold(Entry& e, SessionState& state);
  // Writes an entry's session to the disk tier; adds the files the store removed to `removed`.
  void write(Entry& e, std::vector<std::string>& removed);
  void evict();
  void forget_files(const std::vector<std::string>& files);
  std::optional<size_t> store_index(const Entry& e) const;

  size_t max_entries_;
  uint64_t max_bytes_;
  std::unique_ptr<PrefixStore> store_;
  List entries_;
  size_t ram_entries_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace dsv4::server
