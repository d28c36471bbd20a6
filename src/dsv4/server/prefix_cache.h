// A few session snapshots, each keyed by a token sequence, so that a request whose prompt
// starts with a cached sequence only prefills the rest (sessions cannot rewind, so a snapshot
// is usable exactly when its key is a prefix of the new prompt). A key is the session's tokens
// plus a "tail" the session has not been fed yet: a finished answer's last token is sampled
// but never fed, and the next turn's prefill feeds it anyway. Bounded by entry count and by
// bytes; the least recently used snapshot goes first. Not thread-safe: the scheduler's worker
// is its only user.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dsv4/model/session.h"

namespace dsv4::server {

class PrefixCache {
 public:
  PrefixCache(size_t max_entries, uint64_t max_bytes);

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
    auto best = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->text.empty() || it->text.size() >= text.size() || !text.starts_with(it->text)) continue;
      if (best != entries_.end() && best->text.size() >= it->text.size()) continue;
      if (junction_ok(text.substr(it->text.size()))) best = it;
    }
    return take(best);
  }

  // Stores a snapshot keyed by state.tokens + tail; `text` is what the key decodes to (or
  // empty). An entry with the same key is only refreshed. Snapshots bigger than the byte bound
  // are not kept.
  void insert(SessionState state, std::span<const int32_t> tail, std::string text);

  size_t entries() const { return entries_.size(); }
  uint64_t bytes() const { return bytes_; }
  void clear();

 private:
  struct Entry {
    SessionState state;
    std::vector<int32_t> key;
    std::string text;
    uint64_t bytes = 0;
  };
  using List = std::list<Entry>;  // most recently used first
  std::optional<Match> take(List::iterator it);
  void evict();

  size_t max_entries_;
  uint64_t max_bytes_;
  List entries_;
  uint64_t bytes_ = 0;
};

}  // namespace dsv4::server
